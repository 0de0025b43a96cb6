"""The engine's done-marker store: exact expiry, a hard cap that forgets the oldest, images."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from aldebaran.apps.trade_limits import TradeLimits
from aldebaran.core.done_markers import GROUP_SECONDS, DoneMarkers
from aldebaran.core.engine import Engine
from aldebaran.core.wal import WalMessage
from aldebaran.trades.codec import MSGPACK, encode_msgpack
from aldebaran.trades.events import Purchase, PurchaseRequest
from tests.support.done_store import StoredDone

NOW = datetime(2026, 11, 22, tzinfo=UTC)
RULES = {"trade_limits": TradeLimits()}

# One step: add `n` fresh keys of app `app` expiring `gap` whole group-spans after the last
# (so groups never merge and expiry is exact), then expire at `now` seconds.
steps = st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 4), st.integers(1, 3),
                           st.integers(0, 4)), max_size=25)


@hsettings(max_examples=200, deadline=None)
@given(steps, st.integers(1, 12))
def test_store_holds_the_newest_unexpired_keys_up_to_its_cap(ops, cap) -> None:
    """Against a list model: what is held is the unexpired suffix of the adds, at most `cap` long."""
    store, model = DoneMarkers(cap), []  # model: (app, key, expires_at) in add order
    expiry, serial, evicted = 0.0, 0, 0
    for app, n, gap, back in ops:
        expiry += gap * GROUP_SECONDS
        keys = [f"k{serial + i}" for i in range(n)]
        serial += n
        store.add(app, keys, expiry)
        model += [(app, k, expiry) for k in keys]
        if len(model) > cap:
            evicted += len(model) - cap
            model = model[len(model) - cap:]
        now = expiry - back * GROUP_SECONDS
        store.expire(now)
        model = [m for m in model if m[2] > now]
        assert len(store) == len(model) <= cap
        assert all((app_, key) in store for app_, key, _ in model)
        assert sum((a, f"k{i}") in store for i in range(serial) for a in ("x", "y")) == len(model)
        assert store.evicted == evicted


def test_groups_merge_within_a_second_and_expire_with_the_latest() -> None:
    store = DoneMarkers(100)
    store.add("x", ["a"], 10.0)
    store.add("x", ["b"], 10.5)  # within GROUP_SECONDS: one group, expiring at 10.5
    store.add("y", ["c"], 10.6)  # another app: its own group
    assert [(g.app, g.expires_at, g.keys) for g in store.groups()] == [("x", 10.5, ["a", "b"]), ("y", 10.6, ["c"])]
    store.expire(10.2)
    assert ("x", "a") in store  # kept up to GROUP_SECONDS past its own expiry, never less
    store.expire(10.5)
    assert ("x", "a") not in store and ("x", "b") not in store and ("y", "c") in store and len(store) == 1


def test_a_capped_engine_forgets_its_oldest_markers_and_says_how_many() -> None:
    engine = Engine([TradeLimits()], default_ttl=3, done_retention=600, done_cap=2, max_message_bytes=1 << 20)

    def offer(event, stamp_ms: int):  # type: ignore[no-untyped-def]
        return engine.cycle([WalMessage(MSGPACK, encode_msgpack([event]))], stamp_ms, NOW)

    for n, order in enumerate("abcde"):
        offer(PurchaseRequest(order, 10, "c", "s"), n * 4000)
        engine.close(n * 4000 + 3500, NOW)  # each order's book closes before the next opens
    done = engine.books.done
    assert len(done) == 2 and done.evicted == 3
    assert done.take_evicted() == 3 and done.take_evicted() == 0  # what a counter adds, once
    assert done.remembered_seconds == 4.0  # d and e closed 4 s apart: the cap shrank 600 s to that
    assert offer(Purchase("e1", "e", 50, "c", "s"), 20_000).late == 1  # remembered: still late
    reopened = offer(Purchase("a1", "a", 50, "c", "s"), 20_000)
    assert reopened.applied == 1 and "a" in engine.books.books["trade_limits"]  # forgotten: a fresh book

    stored = StoredDone()
    stored.compact(engine)
    rebuilt = Engine([TradeLimits()], default_ttl=3, done_retention=600, done_cap=2, max_message_bytes=1 << 20)
    rebuilt.restore_done(stored.image())
    assert {k for g in rebuilt.books.done.groups() for k in g.keys} == {"d", "e"}


@hsettings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 4), st.floats(0.0, 2.5),
                          st.floats(0.0, 4.0), st.booleans()), max_size=30), st.integers(1, 12))
def test_what_compactions_store_is_always_the_whole_store(ops, cap) -> None:
    """Deltas only (groups that grew, were cut by the cap, expired), yet the stored copy read
    back is the store, group by group, after every compaction and after a restart."""
    store, stored, expiry, serial = DoneMarkers(cap), {}, 0.0, 0

    def compact() -> None:
        delta = store.delta()
        if delta.rewrite:
            stored.clear()
        stored.update({g.seq: (g.app, g.expires_at, list(g.keys)) for g in delta.changed})
        for seq in delta.dropped:
            stored.pop(seq, None)
        store.written(delta)
        assert [stored[seq] for seq in sorted(stored)] == [(g.app, g.expires_at, g.keys) for g in store.groups()]

    for app, n, gap, back, compacting in ops:
        expiry += gap
        store.add(app, [f"k{serial + i}" for i in range(n)], expiry)
        serial += n
        store.expire(expiry - back)
        if compacting:
            compact()
    compact()
    again = DoneMarkers(cap)
    again.restore(store.groups(), 0.0)
    store, stored = again, {seq: value for seq, value in stored.items()}
    compact()  # a restored store rewrites the stored copy: its groups have new seqs


@hsettings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 4), st.floats(0.0, 2.5),
                          st.floats(0.0, 4.0), st.sampled_from(["", "take", "land"])), max_size=40),
       st.integers(1, 12))
def test_what_compactions_store_while_the_store_changes_is_the_whole_store(ops, cap) -> None:
    """A delta is taken (its groups copied as they stand, as a request encodes them), the store
    changes on, and only later is it stored and `written`: what changed meanwhile, even in the
    delta's own groups, is in a later delta, so the stored copy still ends up the store."""
    store, stored, expiry, serial = DoneMarkers(cap), {}, 0.0, 0
    in_flight = None

    def take():
        delta = store.delta()
        return delta, [(g.seq, (g.app, g.expires_at, list(g.keys))) for g in delta.changed]

    def land(taken) -> None:
        delta, groups = taken
        if delta.rewrite:
            stored.clear()
        stored.update(groups)
        for seq in delta.dropped:
            stored.pop(seq, None)
        store.written(delta)

    for app, n, gap, back, step in ops:
        expiry += gap
        store.add(app, [f"k{serial + i}" for i in range(n)], expiry)
        serial += n
        store.expire(expiry - back)
        if step == "take" and in_flight is None:
            in_flight = take()
        elif step == "land" and in_flight is not None:
            land(in_flight)
            in_flight = None
    if in_flight is not None:
        land(in_flight)
    land(take())
    assert [stored[seq] for seq in sorted(stored)] == [(g.app, g.expires_at, g.keys) for g in store.groups()]


def test_steady_closing_makes_a_group_a_second_and_honours_the_retention() -> None:
    """Books closing every 100 ms for a minute, kept 5 s: groups span a second each, and what
    is older than the retention (plus one group span) is forgotten while closing goes on."""
    store, delta = DoneMarkers(10**6), None
    for tick in range(600):
        now = tick / 10
        store.add("x", [f"k{tick}"], now + 5.0)
        store.expire(now)
        if tick % 50 == 0:
            delta = store.delta()
            store.written(delta)
    assert all(g.expires_at - float(g.keys[0][1:]) / 10 - 5.0 < GROUP_SECONDS for g in store.groups())
    assert ("x", "k500") not in store and ("x", "k550") in store and len(store) <= 60
    assert delta is not None and len(store.delta().changed) <= 6  # 5 s of groups, not every marker
