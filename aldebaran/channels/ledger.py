"""Per channel and recipient, what became of each alert: being sent, delivered, or in doubt. In Redis.

The ledger is what makes a channel's guarantee hold across crashes (CONTRACT §5):

- **at-most-once**: an attempt is recorded (`sending:<worker token>`) before the send and
  settled after it. A worker that finds an unsettled attempt left by another process
  cannot know whether the recipient got the alert, so it records the alert *in doubt*
  (listed for the operator with its body) and never sends it on its own.
- **at-least-once** and **exactly-once**: no record before the send; after a crash the
  alert is sent again (the recipient deduplicates by `Idempotency-Key`/`message_id`, the
  pull queue by its keyed enqueue).

Every ledger key holds one of `sending:<token>`, `delivered` (`1` in older ledgers) or
`in-doubt`; the in-doubt entries are also indexed per channel (`Keys.in_doubt`) so
`aldebaran stats`, the dashboard and `aldebaran delivery` can list and settle them.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from aldebaran.io.redis import Keys, Replicas, check_replicated, run_script, wait_replicas

SENDING, DELIVERED, IN_DOUBT = "sending:", "delivered", "in-doubt"


class Claim(enum.Enum):
    """What `DeliveryLedger.claim` found for one alert and recipient."""

    NEW = "new"  # not delivered: send it (at-most-once: the attempt is now recorded)
    DELIVERED = "delivered"  # a repeat: the recipient has it
    IN_DOUBT = "in-doubt"  # listed for the operator already: never sent on its own
    INTERRUPTED = "interrupted"  # an attempt another process never settled: to be listed in doubt


def status_of(value: bytes | str | None) -> str | None:
    """A ledger value as a status: `delivered`, `sending`, `in-doubt`, or None (nothing yet)."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    if text.startswith(SENDING):
        return "sending"
    return IN_DOUBT if text == IN_DOUBT else "delivered"


def ledger_key(keys: Keys, channel: str, alert_id: str, target: str = "") -> str:
    """The ledger key of one alert for one recipient of one channel."""
    # `/` cannot occur in a channel name, so a recipient's key never collides with a channel's.
    return keys.delivered(f"{channel}/{target}" if target else channel, alert_id)


def entry_field(alert_id: str, target: str) -> str:
    """The in-doubt index's field for one alert and recipient (JSON: any id, no separator to escape)."""
    return json.dumps([alert_id, target])


@dataclass(frozen=True, slots=True)
class InDoubt:
    """One alert whose delivery to one recipient nobody can vouch for."""

    channel: str
    alert_id: str
    target: str
    since_ms: int
    reason: str
    body: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"channel": self.channel, "alert_id": self.alert_id, "target": self.target or None,
                "since_ms": self.since_ms, "reason": self.reason}

    @classmethod
    def parse(cls, channel: str, raw: bytes | str) -> InDoubt:
        data = json.loads(raw)
        return cls(channel, data["alert_id"], data["target"], int(data["since_ms"]), data["reason"],
                   data["body"].encode())


def in_doubt_entry(alert_id: str, target: str, reason: str, body: bytes) -> str:
    return json.dumps({"alert_id": alert_id, "target": target, "since_ms": int(time.time() * 1000),
                       "reason": reason, "body": body.decode("utf-8", "replace")})


class DeliveryLedger:
    """One channel's ledger, as one worker process (`token`) sees it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, channel: str, ttl_seconds: int, token: str = "",
                 replicas: Replicas = Replicas()) -> None:
        self._redis, self._keys, self._channel, self._ttl, self._token = redis, keys, channel, ttl_seconds, token
        # Every claim and settle is on this many replicas before anything is sent or acked.
        self._replicas = replicas
        # Keys whose attempt record is ours but certainly not followed by a send: the claim's reply
        # or the release was lost (Redis cut). Found again, they are claimed, not put in doubt.
        self._unsent: set[str] = set()
        self._index = keys.in_doubt(channel)
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)
        self._mark = redis.register_script(_MARK)

    def key(self, alert_id: str, target: str = "") -> str:
        return ledger_key(self._keys, self._channel, alert_id, target)

    async def claim(self, items: Sequence[tuple[str, str]], *, record_attempt: bool) -> list[Claim]:
        """Look (alert_id, target) pairs up in one call; with `record_attempt`, record an attempt for
        every new one (so claim only as many as are about to be sent)."""
        if not items:
            return []
        keys = [self.key(alert_id, target) for alert_id, target in items]
        try:
            # With replicas required, a found record is written again so the WAIT covers it too (it
            # may be one whose replication failed just before its message came back).
            found = await run_script(self._redis, self._claim, keys,
                                     ["1" if record_attempt else "0", SENDING + self._token, self._ttl,
                                      "1" if self._replicas.count else "0"], self._replicas)
        except Exception:
            self._unsent.update(keys)  # whatever the script did, nothing was sent
            raise
        claims = []
        for key, value in zip(keys, found, strict=True):
            state = value.decode() if isinstance(value, bytes) else value
            if state == "mine":
                state = "new" if key in self._unsent else "interrupted"
            if state == "new":
                self._unsent.discard(key)
            claims.append(Claim(state))
        return claims

    async def settle(self, delivered: Sequence[tuple[str, str]] = (), released: Sequence[tuple[str, str]] = (),
                     in_doubt: Sequence[tuple[str, str, str, bytes]] = ()) -> None:
        """Record the outcomes of a round of sends in one round trip: `delivered`; `released` (the
        attempt certainly failed: its record is dropped); `in_doubt` (alert_id, target, why, body)."""
        if not (delivered or released or in_doubt):
            return
        try:
            await self._settle(delivered, released, in_doubt)
        except Exception:
            self._unsent.update(self.key(alert_id, target) for alert_id, target in released)
            raise

    async def _settle(self, delivered: Sequence[tuple[str, str]], released: Sequence[tuple[str, str]],
                      in_doubt: Sequence[tuple[str, str, str, bytes]]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            if delivered:
                await self._mark(keys=[self.key(alert_id, target) for alert_id, target in delivered],
                                 args=[DELIVERED, self._ttl], client=pipe)
            for alert_id, target in released:
                await self._release(keys=[self.key(alert_id, target)], args=[SENDING + self._token], client=pipe)
            for alert_id, target, reason, body in in_doubt:
                pipe.set(self.key(alert_id, target), IN_DOUBT, ex=self._ttl)
                pipe.hset(self._index, entry_field(alert_id, target), in_doubt_entry(alert_id, target, reason, body))
            wait_replicas(pipe, self._replicas)
            replies = await pipe.execute()
        if self._replicas.count:
            check_replicated(replies[-1], self._replicas)


# KEYS: ledger keys. ARGV: record the attempts ("1"/"0"), the sending mark, ttl, rewrite what
# is found ("1"/"0"). Per key a `Claim` value, or `mine` for our own attempt record: an
# attempt left by someone else is `interrupted` when attempts are recorded (at most once),
# and simply `new` when they are not (at least once sends again).
_CLAIM = """
local out = {}
for i, key in ipairs(KEYS) do
  local state = redis.call('GET', key)
  if state == false or (string.sub(state, 1, 8) == 'sending:' and ARGV[1] == '0') then
    if ARGV[1] == '1' then redis.call('SET', key, ARGV[2], 'EX', ARGV[3]) end
    out[i] = 'new'
  else
    if ARGV[4] == '1' then redis.call('SET', key, state, 'KEEPTTL') end
    if state == ARGV[2] then
      out[i] = 'mine'
    elseif string.sub(state, 1, 8) == 'sending:' then
      out[i] = 'interrupted'
    elseif state == 'in-doubt' then
      out[i] = 'in-doubt'
    else
      out[i] = 'delivered'
    end
  end
end
return out
"""

# The operator's decision on one in-doubt entry (`aldebaran delivery settle`). KEYS: the ledger
# key, the in-doubt index. ARGV: the index field, `delivered` or `again`, ttl. Returns the
# entry it removed (nil when there was none): `again` leaves the ledger empty, so the
# deliverer sends the alert when it comes back on the channel queue.
SETTLE = """
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if not entry then return false end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[2] == 'delivered' then redis.call('SET', KEYS[1], 'delivered', 'EX', ARGV[3])
else redis.call('DEL', KEYS[1]) end
return entry
"""

# KEYS: ledger keys. ARGV: the value (`delivered`), ttl. One call for a round's deliveries.
_MARK = """
for _, key in ipairs(KEYS) do redis.call('SET', key, ARGV[1], 'EX', ARGV[2]) end
return #KEYS
"""

# KEYS: the ledger key. ARGV: our sending mark. Deletes it only while it is ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
