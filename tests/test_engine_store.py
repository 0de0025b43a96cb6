"""The engine's Redis state under a retried call: redis-py sends a command again when its
reply was lost (a connection reset, a Sentinel failover). A commit or a compaction sent
twice must act once, or a cycle's log record doubles, an LTRIM drops records no one
compacted, or alerts come back "not new" and are never published."""

from __future__ import annotations

from itertools import chain, count

import pytest

from aldebaran.io.engine_store import EngineStore, Fenced
from aldebaran.io.redis import Keys, connect
from aldebaran.settings import Settings


@pytest.fixture
async def store(settings: Settings):
    redis = await connect(settings)
    store = EngineStore(redis, Keys(settings.redis_key_prefix), "owner-a", 5000, 3600)
    assert await store.acquire()
    yield store
    await redis.aclose()


def _same_op_twice(store: EngineStore) -> None:
    """The next two operations carry one id, as a retry of one call does."""
    ops = chain(["owner-a#7", "owner-a#7"], (f"owner-a#{n}" for n in count(100)))
    store._op = lambda: next(ops)  # type: ignore[method-assign]


async def test_a_commit_sent_twice_logs_once_and_answers_the_same(store: EngineStore) -> None:
    _same_op_twice(store)
    first = await store.commit(b"record-1", ["x1", "x2"], [b"{1}", b"{2}"])
    again = await store.commit(b"record-1", ["x1", "x2"], [b"{1}", b"{2}"])
    assert first == again == [True, True]  # both alerts still to publish
    assert await store.wal_length() == 1
    assert set((await store.redis.hgetall(store._pending)).keys()) == {
        store.keys.alert("x1").encode(), store.keys.alert("x2").encode()}
    # A new operation with an alert already recorded: that one is not new.
    assert await store.commit(b"record-2", ["x2", "x3"], [b"{2}", b"{3}"]) == [False, True]
    assert await store.wal_length() == 2


async def test_a_compaction_sent_twice_trims_once(store: EngineStore) -> None:
    for n in range(5):
        await store.commit(f"r{n}".encode(), [], [])
    _same_op_twice(store)
    await store.compact(b"image", 2)
    await store.compact(b"image", 2)
    assert await store.wal_length() == 3


async def test_a_commit_without_the_lease_is_fenced(store: EngineStore) -> None:
    other = EngineStore(store.redis, store.keys, "owner-b", 5000, 3600)
    assert not await other.acquire()
    with pytest.raises(Fenced):
        await other.commit(b"r", [], [])
    with pytest.raises(Fenced):
        await other.compact(b"image", 0)
