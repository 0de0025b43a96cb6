"""Per channel and recipient, what became of each alert: being sent, delivered, or in doubt. In Redis.

The ledger is what makes a channel's guarantee hold across crashes (CONTRACT §5):

- **at-most-once**: an attempt is recorded (`sending:<worker token>/<attempt>`, one attempt
  id per chunk of sends) before the send and settled after it: the alerts delivered are
  settled together, by marking their attempt delivered (`Keys.delivered_attempt`), so a
  delivered alert costs one key operation, not three; one that failed is released or put
  in doubt on its own. A worker that finds an unsettled attempt left by another process
  cannot know whether the recipient got the alert, so it records the alert *in doubt*
  (listed for the operator with its body) and never sends it on its own.
- **at-least-once** and **exactly-once**: no record before the send; after a crash the
  alert is sent again (the recipient deduplicates by `Idempotency-Key`/`message_id`, the
  pull queue by its keyed enqueue).

Every ledger key holds one of `sending:<token>/<attempt>` (delivered once its attempt is
marked so), `delivered` (`1` in older ledgers) or `in-doubt`; the in-doubt entries are also
indexed per channel (`Keys.in_doubt`) so `aldebaran stats`, the dashboard and `aldebaran
delivery` can list and settle them.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from aldebaran.io.redis import Keys, Replicas, as_bytes, check_replicated, run_script, wait_replicas

SENDING, DELIVERED, IN_DOUBT = "sending:", "delivered", "in-doubt"


class Claim(enum.Enum):
    """What `DeliveryLedger.claim` found for one alert and recipient."""

    NEW = "new"  # not delivered: send it (at-most-once: the attempt is now recorded)
    DELIVERED = "delivered"  # a repeat: the recipient has it
    IN_DOUBT = "in-doubt"  # listed for the operator already: never sent on its own
    INTERRUPTED = "interrupted"  # an attempt another process never settled: to be listed in doubt


def status_of(value: bytes | str | None, attempt_delivered: bool = False) -> str | None:
    """A ledger value as a status: `delivered`, `sending`, `in-doubt`, or None (nothing yet);
    `attempt_delivered`: whether a `sending:` value's attempt is marked delivered."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    if text.startswith(SENDING):
        return "delivered" if attempt_delivered else "sending"
    return IN_DOUBT if text == IN_DOUBT else "delivered"


def statuses(client: redis.Redis, keys: Keys, names: Sequence[str]) -> list[str | None]:
    """The status behind each ledger key, read in two calls (the keys, then the attempts of
    those still marked `sending:`)."""
    if not names:
        return []
    values = [as_bytes(value) if value is not None else None for value in client.mget(names)]
    sending = SENDING.encode()
    attempts = [value[len(sending):].decode() if value and value.startswith(sending) else None for value in values]
    order = sorted({attempt for attempt in attempts if attempt is not None})
    found = client.mget([keys.delivered_attempt(attempt) for attempt in order]) if order else []
    delivered = {attempt for attempt, mark in zip(order, found, strict=True) if mark is not None}
    return [status_of(value, attempt in delivered) for value, attempt in zip(values, attempts, strict=True)]


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


@dataclass(frozen=True, slots=True)
class Claimed:
    """What `DeliveryLedger.claim` found, and the attempt it recorded (None: nothing recorded)."""

    claims: list[Claim]
    attempt: str | None = None


class DeliveryLedger:
    """One channel's ledger, as one worker process (`token`) sees it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, channel: str, ttl_seconds: int, token: str = "",
                 replicas: Replicas = Replicas()) -> None:
        self._redis, self._keys, self._channel, self._ttl, self._token = redis, keys, channel, ttl_seconds, token
        # Every claim and settle is on this many replicas before anything is sent or acked.
        self._replicas = replicas
        # Keys this process claimed to send (at most once) whose outcome is not settled in Redis:
        # True once the recipient took the alert (its settle was cut), False while a send may have
        # left. Our own record found again (`mine`), or none at all, is delivered or in doubt by
        # this; our record of a key not here is claimed again (a claim's or a release's reply was
        # lost: nothing left).
        self._unsettled: dict[str, bool] = {}
        self._attempts = 0
        self._index = keys.in_doubt(channel)
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)
        self._mark = redis.register_script(_MARK)

    def key(self, alert_id: str, target: str = "") -> str:
        return ledger_key(self._keys, self._channel, alert_id, target)

    async def claim(self, items: Sequence[tuple[str, str]], *, record_attempt: bool) -> Claimed:
        """Look (alert_id, target) pairs up in one call; with `record_attempt`, record an attempt for
        every new one (so claim only as many as are about to be sent), under one attempt id."""
        if not items:
            return Claimed([])
        keys = [self.key(alert_id, target) for alert_id, target in items]
        self._attempts += 1
        attempt = f"{self._token}/{self._attempts}" if record_attempt else None
        # With replicas required, a found record is written again so the WAIT covers it too (it
        # may be one whose replication failed just before its message came back). If this raises,
        # whatever the script recorded is ours: `_unsettled` still tells a send from none.
        found = await run_script(self._redis, self._claim, keys,
                                 ["1" if record_attempt else "0", SENDING + (attempt or ""), self._ttl,
                                  "1" if self._replicas.count else "0", f"{SENDING}{self._token}/",
                                  self._keys.delivered_attempt("")], self._replicas)
        claims = []
        taken: list[str] = []  # delivered by us, the settle cut: settled now
        for key, value in zip(keys, found, strict=True):
            state = value.decode() if isinstance(value, bytes) else value
            if key in self._unsettled:
                if state in ("mine", "new"):  # our record, or none (a failover lost it): what we know decides
                    state = "delivered" if self._unsettled[key] else "interrupted"
                    if state == "delivered":
                        taken.append(key)
                else:  # settled in Redis meanwhile (a settle whose reply was lost): Redis decides
                    del self._unsettled[key]
            elif state == "mine":
                state = "new"
            claims.append(Claim(state))
        if taken:  # the claim moved their records to its attempt: marked delivered themselves
            await run_script(self._redis, self._mark, taken, [DELIVERED, self._ttl], self._replicas)
            for key in taken:
                del self._unsettled[key]
        if record_attempt:  # only now: if anything above raised, none of them is sent
            self._unsettled.update((key, False) for key, claim in zip(keys, claims, strict=True) if claim is Claim.NEW)
        return Claimed(claims, attempt)

    async def settle(self, delivered: Sequence[tuple[str, str]] = (), released: Sequence[tuple[str, str]] = (),
                     in_doubt: Sequence[tuple[str, str, str, bytes]] = (), attempt: str | None = None) -> None:
        """Record the outcomes of a round of sends in one round trip: `delivered`; `released` (the
        attempt certainly failed: its record is dropped); `in_doubt` (alert_id, target, why, body).
        With the claim's `attempt`, the delivered ones are settled by marking it delivered."""
        if not (delivered or released or in_doubt):
            return
        if released and attempt is None:
            raise ValueError("a release needs the claim's attempt: only a recorded attempt is dropped")
        try:
            await self._settle(delivered, released, in_doubt, attempt)
        except Exception:
            # A released send certainly never left; a delivered one is known taken; the records of
            # both may still say `sending`.
            for alert_id, target in released:
                self._unsettled.pop(self.key(alert_id, target), None)
            for key in (self.key(alert_id, target) for alert_id, target in delivered):
                if key in self._unsettled:
                    self._unsettled[key] = True
            raise
        for alert_id, target in [*delivered, *released, *((a, t) for a, t, _, _ in in_doubt)]:
            self._unsettled.pop(self.key(alert_id, target), None)

    async def _settle(self, delivered: Sequence[tuple[str, str]], released: Sequence[tuple[str, str]],
                      in_doubt: Sequence[tuple[str, str, str, bytes]], attempt: str | None) -> None:
        # In order, the attempt marked delivered last: no one sees it before its failures are undone.
        async with self._redis.pipeline(transaction=False) as pipe:
            for alert_id, target in released:
                await self._release(keys=[self.key(alert_id, target)], args=[f"{SENDING}{attempt}"], client=pipe)
            for alert_id, target, reason, body in in_doubt:
                pipe.set(self.key(alert_id, target), IN_DOUBT, ex=self._ttl)
                pipe.hset(self._index, entry_field(alert_id, target), in_doubt_entry(alert_id, target, reason, body))
            if delivered and attempt is not None:
                pipe.set(self._keys.delivered_attempt(attempt), DELIVERED, ex=self._ttl)
            elif delivered:
                await self._mark(keys=[self.key(alert_id, target) for alert_id, target in delivered],
                                 args=[DELIVERED, self._ttl], client=pipe)
            wait_replicas(pipe, self._replicas)
            replies = await pipe.execute()
        if self._replicas.count:
            check_replicated(replies[-1], self._replicas)


# KEYS: ledger keys. ARGV: record the attempts ("1"/"0"), the sending mark (`sending:<attempt>`), ttl,
# rewrite what is found ("1"/"0"), our own marks' prefix (`sending:<token>/`), the prefix of the
# delivered-attempt keys. Per key a `Claim` value, or `mine` for our own attempt record: an
# attempt left by someone else is `interrupted` when attempts are recorded (at most once), and
# simply `new` when they are not (at least once sends again). An attempt marked delivered is
# `delivered`.
_CLAIM = """
local out = {}
for i, key in ipairs(KEYS) do
  local state
  if ARGV[1] == '1' then
    state = redis.call('SET', key, ARGV[2], 'NX', 'GET', 'EX', ARGV[3])
  else
    state = redis.call('GET', key)
  end
  if state and string.sub(state, 1, 8) == 'sending:' and redis.call('EXISTS', ARGV[6] .. string.sub(state, 9)) == 1 then
    state = 'delivered'
  end
  if state == false then
    out[i] = 'new'
  elseif string.sub(state, 1, 8) == 'sending:' and ARGV[1] == '0' then
    out[i] = 'new'
  else
    if ARGV[4] == '1' then redis.call('SET', key, state, 'KEEPTTL') end
    if string.sub(state, 1, #ARGV[5]) == ARGV[5] then
      if ARGV[1] == '1' then redis.call('SET', key, ARGV[2], 'KEEPTTL') end  -- ours: now under this attempt
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
