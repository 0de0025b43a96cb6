"""The shard's done-marker store: exact expiry, a hard cap that forgets the oldest, images."""

from __future__ import annotations

from datetime import datetime, timezone

import msgspec
from hypothesis import given, settings as hsettings, strategies as st

from aldebaran.apps.trade_limits import TradeLimits
from aldebaran.core.book import Outcome
from aldebaran.core.done_markers import GROUP_SECONDS, DoneMarkers
from aldebaran.core.shard_state import ShardBooks
from aldebaran.core.snapshot import decode_image
from aldebaran.trades.events import Purchase, PurchaseRequest

NOW = datetime(2026, 11, 22, tzinfo=timezone.utc)
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


def test_a_capped_shard_forgets_its_oldest_markers_and_says_how_many() -> None:
    shard = ShardBooks(RULES, default_ttl=3, done_retention=600, done_cap=2)
    for n, order in enumerate("abcde"):
        shard.offer("trade_limits", PurchaseRequest(order, 10, "c", "s"), float(n), NOW)
        shard.close_due(n + 3.5, NOW)  # each order's book closes one tick after it opened
    assert len(shard.done) == 2 and shard.done.evicted == 3
    assert shard.done.take_evicted() == 3 and shard.done.take_evicted() == 0  # what a counter adds, once
    assert shard.done.remembered_seconds == 1.0  # d and e closed a second apart: the cap shrank 600 s to that
    late = shard.offer("trade_limits", Purchase("e1", "e", 50, "c", "s"), 9.0, NOW)
    assert late.outcome is Outcome.LATE  # remembered: still late
    reopened = shard.offer("trade_limits", Purchase("a1", "a", 50, "c", "s"), 9.0, NOW)
    assert reopened.outcome is Outcome.APPLIED and ("trade_limits", "a") in shard.books  # forgotten: a fresh book

    rebuilt = ShardBooks(RULES, default_ttl=3, done_retention=600, done_cap=2)
    rebuilt.restore([decode_image(shard.take_snapshot())], now_ts=9.0)
    assert {k for g in rebuilt.done.groups() for k in g.keys} == {"d", "e"}


def test_images_written_before_groups_still_restore() -> None:
    """An older worker's image: a two-element array with per-key markers [app, key, expires_at]."""
    old = msgspec.msgpack.encode([[], [["trade_limits", "b", 100.0], ["trade_limits", "c", 5.0]]])
    shard = ShardBooks(RULES, default_ttl=3, done_retention=600)
    shard.restore([decode_image(old)], now_ts=10.0)
    assert ("trade_limits", "b") in shard.done and ("trade_limits", "c") not in shard.done  # c had expired
    assert shard.offer("trade_limits", Purchase("b1", "b", 5, "c", "s"), 11.0, NOW).outcome is Outcome.LATE
