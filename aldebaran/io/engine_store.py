"""The engine's durable state in Redis: an ownership lease, the write-ahead log, the alert outbox.

Every write goes through a Lua script that first checks the caller still holds the
lease (`engine:owner` = its token), so an engine that lost its lease (a long pause, a
partition) can never write over the one that took over: it fails its commit and
restarts as a standby. A cycle's commit is one call: renew the lease, append the
cycle's log record, and record each alert it fired (`SET alert:<id> NX`: an alert id
fires once, ever) in the pending outbox. After the broker confirms the alert batch,
`mark_sent` moves them out of the outbox. Whatever is still pending after a crash is
settled by the next owner before it consumes anything: marked sent when a witness shows it
on the bus (`settle`), published otherwise (docs/engine.md).

The commit and the compaction carry an operation id and remember the last one applied
(`engine:last-op`): redis-py re-sends a command whose reply was lost (a connection
reset, a Sentinel failover), and a second RPUSH or LTRIM of the same cycle, or a
second `SET NX` answering "not new" for alerts that were never published, would be
wrong. With `redis_min_replicas_acked` the commit is followed by `WAIT` in the same
round trip, so a commit the engine acts on is on a replica (docs/engine.md, Sentinel).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from aldebaran.core.engine import Compaction
from aldebaran.core.wal import DoneImage, WalRecord, decode_done, decode_record, encode_group, image_of
from aldebaran.io.redis import Keys, Replicas, as_bytes, run_script

LOAD_PAGE = 500  # log records per LRANGE while loading
RECENT_ALERTS = 100


class Fenced(Exception):
    """This engine no longer holds the lease: another owner may be writing."""


class EngineStore:
    """One engine's view of its Redis state, under the deployment's key prefix."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, token: str, lease_ms: int, retention_seconds: int,
                 replicas: Replicas = Replicas(), partition: int | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.token = token
        self.lease_ms = lease_ms
        self.retention = retention_seconds
        self.replicas = replicas
        key = lambda part: keys.engine(part, partition)  # noqa: E731 - the partition's own keys
        self._owner, self._wal = key("owner"), key("wal")
        self._done, self._pending = key("done"), key("pending")  # `done`: the one-blob image of before
        self._done_groups, self._done_clock = key("done-groups"), key("done-clock")
        self._last_op = key("last-op")
        self._ops = 0
        self._commit = redis.register_script(_COMMIT)
        self._mark = redis.register_script(_MARK_SENT)
        self._settle = redis.register_script(_SETTLE)
        self._compact = redis.register_script(_COMPACT)
        self._renew = redis.register_script(_RENEW)

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it (or we already do)."""
        if await self.redis.set(self._owner, self.token, nx=True, px=self.lease_ms):
            return True
        return await self.renew()

    async def renew(self) -> bool:
        return bool(await self._renew(keys=[self._owner], args=[self.token, self.lease_ms]))

    async def sync_replicas(self) -> None:
        """Renew the lease and WAIT for the replicas: the replication stream is ordered, so
        everything read before (a recovery's load) is on them too. `Fenced` if not the owner."""
        if not await run_script(self.redis, self._renew, [self._owner], [self.token, self.lease_ms], self.replicas):
            raise Fenced("FENCED: not the engine owner")

    async def release(self) -> None:
        """Give the lease up at a graceful stop, so a standby need not wait for it to expire."""
        await self._renew(keys=[self._owner], args=[self.token, 0])

    async def load(self) -> tuple[DoneImage | None, list[WalRecord], dict[str, bytes]]:
        """The done-marker image, every log record in order, and the unconfirmed alerts."""
        done = await self._load_done()
        records: list[WalRecord] = []
        start = 0
        while True:
            page = await self.redis.lrange(self._wal, start, start + LOAD_PAGE - 1)
            records += [decode_record(as_bytes(data)) for data in page]
            if len(page) < LOAD_PAGE:
                break
            start += LOAD_PAGE
        pending = await self.redis.hgetall(self._pending)
        outbox = {(k.decode() if isinstance(k, bytes) else k): as_bytes(v) for k, v in pending.items()}
        return done, records, outbox

    async def _load_done(self) -> DoneImage | None:
        """The done markers as stored group by group; an engine of before stored one blob."""
        clock = await self.redis.get(self._done_clock)
        if clock is not None:
            groups = await self.redis.hgetall(self._done_groups)
            return image_of(int(clock), [as_bytes(data) for data in groups.values()])
        legacy = await self.redis.get(self._done)
        return decode_done(as_bytes(legacy)) if legacy else None

    def _op(self) -> str:
        self._ops += 1
        return f"{self.token}#{self._ops}"

    async def commit(self, record: bytes | None, alert_ids: Sequence[str], bodies: Sequence[bytes]) -> list[bool]:
        """Log one cycle and record its alerts; per alert, whether it is new (to publish).

        Raises `NotReplicated` when replicas are required and too few acknowledged.
        """
        keys = [self._owner, self._wal, self._pending, self._last_op, *(self.keys.alert(a) for a in alert_ids)]
        args = [self.token, self.lease_ms, record or b"", self.retention, self._op(), *bodies]
        try:
            flags = await run_script(self.redis, self._commit, keys, args, self.replicas)
        except ResponseError as exc:
            raise _fenced(exc) from None
        flags = flags.encode() if isinstance(flags, str) else flags
        return [flag == ord("1") for flag in flags]

    async def mark_sent(self, alert_ids: Sequence[str], bodies: Sequence[bytes]) -> None:
        """The broker confirmed these alerts: out of the outbox, into the recent list."""
        if not alert_ids:
            return
        keys = [self._pending, self.keys.recent_alerts(), *(self.keys.alert(a) for a in alert_ids)]
        await self._mark(keys=keys, args=[self.retention, RECENT_ALERTS, *bodies[-RECENT_ALERTS:]])

    async def settle(self, alert_ids: Sequence[str], bodies: Sequence[bytes]) -> int:
        """A witness shows these alerts on the bus: those still pending are marked sent
        (and listed as recent); returns how many were pending."""
        settled = 0
        for start in range(0, len(alert_ids), 1000):
            chunk = alert_ids[start:start + 1000]
            keys = [self._pending, self.keys.recent_alerts(), *(self.keys.alert(a) for a in chunk)]
            settled += await self._settle(keys=keys, args=[self.retention, RECENT_ALERTS,
                                                           *bodies[start:start + 1000]])
        return settled

    async def pending_among(self, alert_ids: Sequence[str]) -> set[str]:
        """Which of these alerts are still pending in the outbox."""
        if not alert_ids:
            return set()
        found = await self.redis.hmget(self._pending, [self.keys.alert(a) for a in alert_ids])
        return {alert_id for alert_id, body in zip(alert_ids, found, strict=True) if body is not None}

    async def compact(self, compaction: Compaction) -> None:
        """Store the done markers that changed and drop the log records they cover, atomically."""
        done = compaction.done
        args: list[bytes | str | int] = [self.token, compaction.trim, self._op(), compaction.clock_ms,
                                         "1" if done.rewrite else "0", len(done.changed)]
        for group in done.changed:
            args += [group.seq, encode_group(group)]
        args += done.dropped
        try:
            await self._compact(keys=[self._owner, self._done_groups, self._wal, self._last_op, self._done_clock,
                                      self._done], args=args)
        except ResponseError as exc:
            raise _fenced(exc) from None

    async def wal_length(self) -> int:
        return int(await self.redis.llen(self._wal))


def _fenced(exc: ResponseError) -> Exception:
    return Fenced(str(exc)) if "FENCED" in str(exc) else exc


# KEYS[1] owner. ARGV: token, lease ms (0 = release). Returns 1 while the token holds it.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

# KEYS: owner, wal, pending, last-op, alert keys... ARGV: token, lease ms, record ("" = none), retention,
# op id, bodies... Returns one character per alert, "1" = new. The same op id again returns
# the first answer and writes nothing (a retry after a lost reply).
_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED: not the engine owner') end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local tag = ARGV[5] .. '='
local last = redis.call('GET', KEYS[4])
if last and string.sub(last, 1, #tag) == tag then return string.sub(last, #tag + 1) end
if ARGV[3] ~= '' then redis.call('RPUSH', KEYS[2], ARGV[3]) end
local out = {}
for i = 5, #KEYS do
  if redis.call('SET', KEYS[i], 'pending', 'NX', 'EX', ARGV[4]) then
    redis.call('HSET', KEYS[3], KEYS[i], ARGV[i + 1])
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
local flags = table.concat(out)
redis.call('SET', KEYS[4], tag .. flags)
return flags
"""

# KEYS: pending, recent list, alert keys... ARGV: retention, recent length, bodies (the newest ones)...
_MARK_SENT = """
for i = 3, #KEYS do
  redis.call('HDEL', KEYS[1], KEYS[i])
  redis.call('SET', KEYS[i], 'sent', 'EX', ARGV[1])
end
for i = 3, #ARGV do redis.call('LPUSH', KEYS[2], ARGV[i]) end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
return #KEYS - 2
"""

# KEYS: pending, recent list, alert keys... ARGV: retention, recent length, bodies (one per alert key)...
_SETTLE = """
local settled = 0
for i = 3, #KEYS do
  if redis.call('HDEL', KEYS[1], KEYS[i]) == 1 then
    redis.call('SET', KEYS[i], 'sent', 'EX', ARGV[1])
    redis.call('LPUSH', KEYS[2], ARGV[i])
    settled = settled + 1
  end
end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
return settled
"""

# KEYS: owner, done groups (hash: seq -> group), wal, last-op, done clock, the one-blob image of before.
# ARGV: token, records to trim, op id (a retry trims nothing more), clock ms, rewrite ("1": replace
# every group), n changed, then n (seq, group) pairs, then the seqs of the groups gone.
_COMPACT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED: not the engine owner') end
local tag = ARGV[3] .. '='
if redis.call('GET', KEYS[4]) == tag then return 1 end
if ARGV[5] == '1' then redis.call('DEL', KEYS[2], KEYS[6]) end
local n = tonumber(ARGV[6])
for i = 7, 6 + 2 * n, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
for i = 7 + 2 * n, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
redis.call('SET', KEYS[5], ARGV[4])
if tonumber(ARGV[2]) > 0 then redis.call('LTRIM', KEYS[3], ARGV[2], -1) end
redis.call('SET', KEYS[4], tag)
return 1
"""
