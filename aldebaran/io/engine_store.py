"""The engine's durable state in Redis: an ownership lease, the write-ahead log, the alert outbox.

Every write goes through a Lua script that first checks the caller still holds the
lease (`engine:owner` = its token), so an engine that lost its lease (a long pause, a
partition) can never write over the one that took over: it fails its commit and
restarts as a standby. A cycle's commit is one call: renew the lease, append the
cycle's log record, and record each alert it fired (`SET alert:<id> NX`: an alert id
fires once, ever), the new ones together as one entry of the pending outbox. After the
broker confirms the alert batch, `mark_sent` drops that entry: one key operation per alert
and two per cycle, where an entry per alert cost four per alert. Whatever is still pending
after a crash is settled by the next owner before it consumes anything: marked sent when a
witness shows it on the bus (`settle`), published otherwise (docs/engine.md). A witness is
proof only of a confirmed publish: when the broker nacks a batch or the connection dies
before its confirm, one queue may hold it and another not (a quorum queue without a
leader refuses while the witness queue takes it), so the engine lists the entry as
`refused` (`refuse`) and no witness settles it: it is published again.

The commit and the compaction carry an operation id and remember the last one applied
(`engine:last-op` and `engine:compact-op`: a compaction runs beside the commits, so each
kind keeps its own): redis-py re-sends a command whose reply was lost (a connection
reset, a Sentinel failover), and a second RPUSH or LTRIM of the same cycle, or a
second `SET NX` answering "not new" for alerts that were never published, would be
wrong. With `redis_min_replicas_acked` the commit is followed by `WAIT` in the same
round trip, so a commit the engine acts on is on a replica (docs/engine.md, Sentinel).
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from aldebaran.core.engine import Compaction
from aldebaran.core.wal import DoneImage, WalRecord, decode_done, decode_record, encode_group, image_of
from aldebaran.io.held_connection import HeldConnection
from aldebaran.io.redis import Keys, Replicas, as_bytes, run_script

LOAD_PAGE = 500  # log records per LRANGE while loading
RECENT_ALERTS = 100


class Fenced(Exception):
    """This engine no longer holds the lease: another owner may be writing."""


@dataclass(slots=True)
class Committed:
    """A commit's answer: per alert whether it is new, and the outbox entry holding the new ones."""

    fresh: list[bool]
    entry: str | None = None


@dataclass(slots=True)
class Outbox:
    """The alerts recorded and not yet marked sent, by the outbox entry holding them."""

    entries: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)  # entry -> [(alert id, body)]
    refused: set[str] = field(default_factory=set)  # entries whose publish was not confirmed: no witness counts

    @property
    def alerts(self) -> dict[str, bytes]:
        """Every pending alert: id -> body."""
        return {alert_id: body for alerts in self.entries.values() for alert_id, body in alerts}

    def without(self, settled: Mapping[str, bytes]) -> Outbox:
        """The entries without the alerts in `settled`, as `EngineStore.settle` leaves them (an
        entry left empty is gone; a refused entry stays whole)."""
        left = {entry: alerts if entry in self.refused else [a for a in alerts if a[0] not in settled]
                for entry, alerts in self.entries.items()}
        return Outbox({entry: alerts for entry, alerts in left.items() if alerts}, self.refused & left.keys())


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
        self._last_op, self._refused = key("last-op"), key("refused")
        self._compact_op = key("compact-op")  # apart from the commits' `last-op`: the two interleave
        self._ops = 0
        self._held = HeldConnection(redis)  # the cycle's commits: on the engine's critical path
        self._marking = HeldConnection(redis)  # the output path's marks, beside the commits
        self._commit = redis.register_script(_COMMIT)
        self._settle = redis.register_script(_SETTLE)
        self._compact = redis.register_script(_COMPACT)
        self._refuse = redis.register_script(_REFUSE)
        self._mark_sent = redis.register_script(_MARK_SENT)
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

    async def load(self) -> tuple[DoneImage | None, list[WalRecord], Outbox]:
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
        return done, records, await self.outbox()

    async def outbox(self) -> Outbox:
        """Every alert still pending, by entry (a few: the cycles whose confirm is awaited)."""
        outbox = Outbox()
        prefix = self.keys.alert("")
        for name, value in (await self.redis.hgetall(self._pending)).items():
            entry = name.decode() if isinstance(name, bytes) else name
            if entry.startswith(prefix):  # an engine of before: one entry per alert, its body the value
                outbox.entries[entry] = [(entry[len(prefix):], as_bytes(value))]
            else:
                outbox.entries[entry] = _entry_alerts(as_bytes(value))
        names = await self.redis.smembers(self._refused)
        refused = {name.decode() if isinstance(name, bytes) else name for name in names}
        outbox.refused = refused & outbox.entries.keys()
        return outbox

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

    async def commit(self, record: bytes | None, alert_ids: Sequence[str], bodies: Sequence[bytes]) -> Committed:
        """Log one cycle and record its alerts; per alert, whether it is new (to publish).

        Raises `NotReplicated` when replicas are required and too few acknowledged.
        """
        op = self._op()
        keys = [self._owner, self._wal, self._pending, self._last_op, *(self.keys.alert(a) for a in alert_ids)]
        entry = _ENTRY.encode(list(zip(alert_ids, bodies, strict=True))) if alert_ids else b""
        args = [self.token, self.lease_ms, record or b"", self.retention, op, entry]
        try:
            if self.replicas.count:  # WAIT behind the write, in the same round trip: the client's pipeline
                flags = await run_script(self.redis, self._commit, keys, args, self.replicas)
            else:
                flags = await self._held.run_script(self._commit, keys, args)
        except ResponseError as exc:
            raise _fenced(exc) from None
        fresh = [flag == ord("1") for flag in as_bytes(flags)]
        return Committed(fresh, op if any(fresh) else None)

    async def mark_sent(self, entries: Sequence[str], bodies: Sequence[bytes]) -> None:
        """The broker confirmed the alerts of these outbox entries: out of the outbox, into the recent list.

        One script on a connection of its own (`HeldConnection`): through the client's pipeline
        the same MULTI cost the engine ~175 µs of CPU a call against ~60, once per alert round."""
        if not entries:
            return
        await self._marking.run_script(self._mark_sent, [self._pending, self._refused, self.keys.recent_alerts()],
                                       [RECENT_ALERTS, len(entries), *entries, *bodies[-RECENT_ALERTS:]])

    async def refuse(self, entries: Sequence[str]) -> None:
        """The broker did not confirm these entries' publish: a witness of them proves nothing.
        Fenced; only entries still pending are listed, so the list never outgrows the outbox."""
        if not entries:
            return
        try:
            await self._refuse(keys=[self._owner, self._pending, self._refused], args=[self.token, *entries])
        except ResponseError as exc:
            raise _fenced(exc) from None

    async def settle(self, outbox: Outbox, witnessed: Mapping[str, bytes]) -> int:
        """A witness shows these alerts on the bus: those of `outbox` (as loaded) leave their entries,
        which keep the rest, and are listed as recent; returns how many. Fenced: an engine that
        lost the lease meanwhile changes nothing (`Fenced`), so it never drops a new owner's entries."""
        left = outbox.without(witnessed).entries
        args: list[str | bytes | int] = []
        settled: list[str] = []
        for entry, alerts in outbox.entries.items():
            remaining = left.get(entry, [])
            if len(remaining) < len(alerts):
                settled += [alert_id for alert_id, _ in alerts if alert_id in witnessed]
                args += [entry, _entry_value(remaining) if remaining else b""]
        if not settled:
            return 0
        bodies = [witnessed[alert_id] for alert_id in settled[-RECENT_ALERTS:]]
        try:
            await self._settle(keys=[self._owner, self._pending, self.keys.recent_alerts()],
                               args=[self.token, RECENT_ALERTS, len(args) // 2, *args, *bodies])
        except ResponseError as exc:
            raise _fenced(exc) from None
        return len(settled)

    async def pending_among(self, alert_ids: Sequence[str]) -> set[str]:
        """Which of these alerts are still pending in the outbox."""
        if not alert_ids:
            return set()
        pending = (await self.outbox()).alerts
        return {alert_id for alert_id in alert_ids if alert_id in pending}

    def compact(self, compaction: Compaction) -> Coroutine[Any, Any, None]:
        """Store the done markers that changed and drop the log records they cover, atomically.

        The request is built now, the markers encoded as they stand, and sent when awaited: the
        cycles go on meanwhile (`workers/engine_compactions.py`) and change the markers again."""
        done = compaction.done
        args: list[bytes | str | int] = [self.token, compaction.trim, self._op(), compaction.clock_ms,
                                         "1" if done.rewrite else "0", len(done.changed)]
        for group in done.changed:
            args += [group.seq, encode_group(group)]
        args += done.dropped
        return self._run_compact(args)

    async def _run_compact(self, args: list[bytes | str | int]) -> None:
        try:
            await self._compact(keys=[self._owner, self._done_groups, self._wal, self._compact_op, self._done_clock,
                                      self._done], args=args)
        except ResponseError as exc:
            raise _fenced(exc) from None

    async def wal_length(self) -> int:
        return int(await self.redis.llen(self._wal))


_ENTRY = msgspec.msgpack.Encoder()
_decode_entry = msgspec.msgpack.Decoder(list[tuple[str, bytes]]).decode


def _entry_value(alerts: list[tuple[str, bytes]]) -> bytes:
    """An outbox entry of alerts all new, as `_COMMIT` writes one (read by `_entry_alerts`)."""
    return b"1" * len(alerts) + b":" + _ENTRY.encode(alerts)


def _entry_alerts(value: bytes) -> list[tuple[str, bytes]]:
    """The new alerts of one outbox entry: `<flag per alert>:<msgpack [[id, body], ...]>`."""
    flags, _, packed = value.partition(b":")
    return [alert for alert, flag in zip(_decode_entry(packed), flags, strict=True) if flag == ord("1")]


def _fenced(exc: ResponseError) -> Exception:
    return Fenced(str(exc)) if "FENCED" in str(exc) else exc


# KEYS[1] owner. ARGV: token, lease ms (0 = release). Returns 1 while the token holds it.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

# KEYS: owner, wal, pending, last-op, alert keys... ARGV: token, lease ms, record ("" = none), retention,
# op id, the alerts packed (the outbox entry). Returns one character per alert, "1" = new; the new
# ones are pending as one entry, named by the op id. The same op id again returns the first answer
# and writes nothing (a retry after a lost reply).
_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED: not the engine owner') end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local tag = ARGV[5] .. '='
local last = redis.call('GET', KEYS[4])
if last and string.sub(last, 1, #tag) == tag then return string.sub(last, #tag + 1) end
if ARGV[3] ~= '' then redis.call('RPUSH', KEYS[2], ARGV[3]) end
local out = {}
local new = false
for i = 5, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[5], 'NX', 'EX', ARGV[4]) then
    out[#out + 1] = '1'
    new = true
  else
    out[#out + 1] = '0'
  end
end
local flags = table.concat(out)
if new then redis.call('HSET', KEYS[3], ARGV[5], flags .. ':' .. ARGV[6]) end
redis.call('SET', KEYS[4], tag .. flags)
return flags
"""

# KEYS: pending, refused set, recent list. ARGV: recent length, n, then n entries confirmed on the bus,
# then their alerts' bodies for the recent list. Not fenced: what the broker confirmed went out,
# whoever owns the books now. Run again after a lost reply, it changes nothing more than a repeat
# in the recent list (what the pipeline it replaced did too).
_MARK_SENT = """
local n = tonumber(ARGV[2])
for i = 3, 2 + n do
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('SREM', KEYS[2], ARGV[i])
end
if #ARGV > 2 + n then
  for i = 3 + n, #ARGV do redis.call('LPUSH', KEYS[3], ARGV[i]) end
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[1]) - 1)
end
return n
"""

# KEYS: owner, pending, refused set. ARGV: token, then the entries whose publish was not confirmed.
_REFUSE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED: not the engine owner') end
for i = 2, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then redis.call('SADD', KEYS[3], ARGV[i]) end
end
return 1
"""

# KEYS: owner, pending, recent list. ARGV: token, recent length, n, then n (entry, what is left of it:
# "" = drop it), then the settled alerts' bodies for the recent list.
_SETTLE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED: not the engine owner') end
local n = tonumber(ARGV[3])
for i = 4, 3 + 2 * n, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[2], ARGV[i])
  else
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
for i = 4 + 2 * n, #ARGV do redis.call('LPUSH', KEYS[3], ARGV[i]) end
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[2]) - 1)
return n
"""

# KEYS: owner, done groups (hash: seq -> group), wal, compact-op, done clock, the one-blob image of before.
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
