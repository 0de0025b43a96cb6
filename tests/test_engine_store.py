"""The engine's Redis state under a retried call: redis-py sends a command again when its
reply was lost (a connection reset, a Sentinel failover). A commit or a compaction sent
twice must act once, or a cycle's log record doubles, an LTRIM drops records no one
compacted, or alerts come back "not new" and are never published."""

from __future__ import annotations

from itertools import chain, count

import pytest

from aldebaran.core.done_markers import DoneDelta, DoneGroup, DoneMarkers
from aldebaran.core.engine import Compaction
from aldebaran.core.wal import DoneImage, encode_done
from aldebaran.io.engine_store import RECENT_ALERTS, Committed, EngineStore, Fenced
from aldebaran.io.redis import Keys, connect
from aldebaran.settings import Settings


@pytest.fixture
async def store(settings: Settings):
    redis = await connect(settings)
    store = EngineStore(redis, Keys(settings.redis_key_prefix), "owner-a", 5000, 3600)
    assert await store.acquire()
    yield store
    await redis.aclose()


def _compaction(trim: int = 0, clock_ms: int = 1000, changed: list[DoneGroup] | None = None,
                dropped: list[int] | None = None, rewrite: bool = False) -> Compaction:
    return Compaction(clock_ms, DoneDelta(rewrite, changed or [], dropped or []), trim)


def _same_op_twice(store: EngineStore) -> None:
    """The next two operations carry one id, as a retry of one call does."""
    ops = chain(["owner-a#7", "owner-a#7"], (f"owner-a#{n}" for n in count(100)))
    store._op = lambda: next(ops)  # type: ignore[method-assign]


async def test_a_commit_sent_twice_logs_once_and_answers_the_same(store: EngineStore) -> None:
    _same_op_twice(store)
    first = await store.commit(b"record-1", ["x1", "x2"], [b"{1}", b"{2}"])
    again = await store.commit(b"record-1", ["x1", "x2"], [b"{1}", b"{2}"])
    assert first == again == Committed([True, True], "owner-a#7")  # both alerts still to publish
    assert await store.wal_length() == 1
    assert (await store.outbox()).entries == {"owner-a#7": [("x1", b"{1}"), ("x2", b"{2}")]}
    # A new operation with an alert already recorded: that one is not new, nor in its entry.
    assert await store.commit(b"record-2", ["x2", "x3"], [b"{2}", b"{3}"]) == Committed([False, True], "owner-a#100")
    assert await store.wal_length() == 2
    assert (await store.outbox()).alerts == {"x1": b"{1}", "x2": b"{2}", "x3": b"{3}"}
    # Nothing new: no entry.
    assert await store.commit(None, ["x1"], [b"{1}"]) == Committed([False], None)
    assert len((await store.outbox()).entries) == 2


async def test_the_outbox_keeps_a_cycles_alerts_until_their_entry_is_marked_sent(store: EngineStore) -> None:
    first = await store.commit(b"r1", ["a", "b"], [b"{a}", b"{b}"])
    second = await store.commit(b"r2", ["c"], [b"{c}"])
    assert await store.pending_among(["a", "c", "z"]) == {"a", "c"}
    assert first.entry is not None and second.entry is not None
    await store.mark_sent([first.entry], [b"{a}", b"{b}"])
    assert (await store.outbox()).alerts == {"c": b"{c}"}
    assert await store.pending_among(["a", "b", "c"]) == {"c"}
    assert await store.redis.lrange(store.keys.recent_alerts(), 0, -1) == [b"{b}", b"{a}"]
    # Each alert key stays: an alert id fires once, ever.
    assert await store.commit(b"r3", ["a"], [b"{a}"]) == Committed([False], None)


async def test_marking_sent_keeps_the_newest_bodies_and_runs_on_a_connection_of_its_own(store: EngineStore) -> None:
    """The recent list holds the last RECENT_ALERTS bodies, newest first; the marks leave the
    outbox and the refused list on the output path's held connection, not the commits' one."""
    ids = [f"m{n}" for n in range(RECENT_ALERTS + 50)]
    bodies = [f"{{{n}}}".encode() for n in range(len(ids))]
    committed = await store.commit(b"r1", ids, bodies)
    assert committed.entry is not None
    await store.refuse([committed.entry])
    await store.mark_sent([committed.entry], bodies)
    assert await store.redis.lrange(store.keys.recent_alerts(), 0, -1) == bodies[::-1][:RECENT_ALERTS]
    assert not await store.redis.exists(store._pending) and not await store.redis.exists(store._refused)
    assert store._marking._connection is not None and store._marking._connection is not store._held._connection
    await store.mark_sent([], [])  # nothing to mark: no call
    assert (await store.outbox()).entries == {}


async def test_settling_witnessed_alerts_keeps_the_rest_of_their_entries_pending(store: EngineStore) -> None:
    """A crash mid-publish can leave part of one cycle's alerts on the bus (a witness per
    message): only those leave the outbox; the others are still to publish."""
    await store.commit(b"r1", ["a", "b", "c"], [b"{a}", b"{b}", b"{c}"])
    await store.commit(b"r2", ["d"], [b"{d}"])
    loaded = await store.outbox()
    assert await store.settle(loaded, {"b": b"{b}", "d": b"{d}", "elsewhere": b"{e}"}) == 2
    assert (await store.outbox()).alerts == {"a": b"{a}", "c": b"{c}"}
    assert await store.settle(await store.outbox(), {"b": b"{b}"}) == 0
    assert await store.redis.lrange(store.keys.recent_alerts(), 0, -1) == [b"{d}", b"{b}"]


async def test_a_refused_entry_is_not_settled_by_its_witness_and_leaves_when_marked_sent(store: EngineStore) -> None:
    """A nacked batch may sit in the witness queue and not in another queue: its witness
    proves nothing, so its entry stays whole until a confirmed publish marks it sent."""
    refused = await store.commit(b"r1", ["a", "b"], [b"{a}", b"{b}"])
    confirmed = await store.commit(b"r2", ["c"], [b"{c}"])
    assert refused.entry is not None and confirmed.entry is not None
    await store.refuse([refused.entry, "owner-a#gone"])  # an entry no longer pending is not listed
    assert await store.redis.smembers(store._refused) == {refused.entry.encode()}
    loaded = await store.outbox()
    assert loaded.refused == {refused.entry}
    witnessed = {"a": b"{a}", "c": b"{c}"}
    assert await store.settle(loaded, witnessed) == 1
    left = loaded.without(witnessed)
    assert left.entries == {refused.entry: [("a", b"{a}"), ("b", b"{b}")]} and left.refused == {refused.entry}
    assert (await store.outbox()).entries == left.entries
    await store.mark_sent(list(left.entries), list(left.alerts.values()))
    assert not await store.redis.exists(store._pending) and not await store.redis.exists(store._refused)


async def test_an_owner_that_lost_the_lease_lists_nothing_as_refused(store: EngineStore) -> None:
    committed = await store.commit(b"r1", ["a"], [b"{a}"])
    assert committed.entry is not None
    await store.redis.set(store._owner, "owner-b")
    with pytest.raises(Fenced):
        await store.refuse([committed.entry])
    assert not await store.redis.exists(store._refused)


async def test_an_owner_that_lost_the_lease_settles_nothing(store: EngineStore) -> None:
    """Recovery settles what it loaded; an engine that lost the lease meanwhile (a long replay)
    must not touch the outbox, where the new owner's entries now are."""
    await store.commit(b"r1", ["a"], [b"{a}"])
    loaded = await store.outbox()
    await store.redis.set(store._owner, "owner-b")
    newcomer = EngineStore(store.redis, store.keys, "owner-b", 5000, 3600)
    await newcomer.commit(b"r2", ["b"], [b"{b}"])
    with pytest.raises(Fenced):
        await store.settle(loaded, {"a": b"{a}"})
    assert (await store.outbox()).alerts == {"a": b"{a}", "b": b"{b}"}


async def test_an_outbox_entry_per_alert_of_an_engine_of_before_still_loads(store: EngineStore) -> None:
    await store.redis.hset(store._pending, store.keys.alert("old"), b"{old}")
    await store.redis.hset(store._pending, store.keys.alert("gone"), b"{gone}")
    await store.commit(None, ["new"], [b"{new}"])
    _, _, outbox = await store.load()
    assert outbox.alerts == {"old": b"{old}", "gone": b"{gone}", "new": b"{new}"}
    assert await store.settle(outbox, {"gone": b"{gone}"}) == 1
    left = outbox.without({"gone": b"{gone}"})
    await store.mark_sent(list(left.entries), list(left.alerts.values()))
    assert await store.redis.hlen(store._pending) == 0


async def test_a_compaction_sent_twice_trims_once(store: EngineStore) -> None:
    for n in range(5):
        await store.commit(f"r{n}".encode(), [], [])
    _same_op_twice(store)
    await store.compact(_compaction(trim=2))
    await store.compact(_compaction(trim=2))
    assert await store.wal_length() == 3


async def test_a_compaction_and_a_commit_retried_across_each_other_act_once(store: EngineStore) -> None:
    """A compaction runs beside the cycles' commits (workers/engine_compactions.py): one's retry
    may follow the other's call, and must still be recognised."""
    for n in range(5):
        await store.commit(f"r{n}".encode(), [], [])
    ops = iter(["owner-a#7", "owner-a#8", "owner-a#7", "owner-a#9", "owner-a#10", "owner-a#9"])
    store._op = lambda: next(ops)  # type: ignore[method-assign]
    await store.compact(_compaction(trim=2))
    await store.commit(b"r5", [], [])
    await store.compact(_compaction(trim=2))  # the compaction's retry, after a commit
    assert await store.wal_length() == 4  # 5 - 2 + 1: trimmed once
    first = await store.commit(b"r6", ["y"], [b"{y}"])
    await store.compact(_compaction(trim=1))
    again = await store.commit(b"r6", ["y"], [b"{y}"])  # the commit's retry, after a compaction
    assert first == again == Committed([True], "owner-a#9")
    assert await store.wal_length() == 4  # 4 + 1 - 1: logged once


async def test_a_compactions_request_holds_the_markers_as_they_stood(store: EngineStore) -> None:
    """The request is encoded when asked for: groups that grow before it is sent are stored as
    they were, and stay changed for the next compaction."""
    markers = DoneMarkers(100)
    markers.add("app", ["a"], 10.0)
    delta = markers.delta()
    request = store.compact(_compaction(clock_ms=1000, changed=delta.changed, rewrite=delta.rewrite))
    markers.add("app", ["b"], 10.5)  # a cycle closes a book meanwhile: the same group grows
    await request
    markers.written(delta)
    image, _, _ = await store.load()
    assert image is not None and [g.keys for g in image.groups] == [["a"]]
    assert [g.keys for g in markers.delta().changed] == [["a", "b"]]


async def test_a_commit_without_the_lease_is_fenced(store: EngineStore) -> None:
    other = EngineStore(store.redis, store.keys, "owner-b", 5000, 3600)
    assert not await other.acquire()
    with pytest.raises(Fenced):
        await other.commit(b"r", [], [])
    with pytest.raises(Fenced):
        await other.compact(_compaction())


async def test_compactions_store_what_changed_and_load_reads_the_whole(store: EngineStore) -> None:
    markers = DoneMarkers(100)
    markers.add("app", ["a", "b"], 10.0)
    markers.add("app", ["c"], 20.0)

    async def compact(clock_ms: int) -> int:
        delta = markers.delta()
        await store.compact(_compaction(clock_ms=clock_ms, changed=delta.changed, dropped=delta.dropped,
                                        rewrite=delta.rewrite))
        markers.written(delta)
        return len(delta.changed)

    assert await compact(1000) == 2  # the first stores everything
    markers.add("app", ["d"], 20.5)  # grows the last group
    markers.add("app", ["e"], 30.0)
    markers.expire(15.0)  # the first group is gone
    assert await compact(2000) == 2  # the grown group and the new one, not every group
    image, _, _ = await store.load()
    assert image is not None and image.clock_ms == 2000
    assert [(g.expires_at, g.keys) for g in image.groups] == [(20.5, ["c", "d"]), (30.0, ["e"])]


async def test_the_one_blob_image_of_before_still_loads_and_a_rewrite_replaces_it(store: EngineStore) -> None:
    await store.redis.set(store._done, encode_done(DoneImage(500, [DoneGroup("app", 9.0, ["old"])])))
    image, _, _ = await store.load()
    assert image is not None and image.clock_ms == 500 and image.groups[0].keys == ["old"]
    markers = DoneMarkers(100)
    markers.restore(image.groups, 0.0)
    delta = markers.delta()
    assert delta.rewrite
    await store.compact(_compaction(clock_ms=600, changed=delta.changed, rewrite=True))
    assert not await store.redis.exists(store._done)
    image, _, _ = await store.load()
    assert image is not None and image.clock_ms == 600 and [g.keys for g in image.groups] == [["old"]]
