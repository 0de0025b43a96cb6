"""The audit's per-order walk (`meaning.book_walk`, numpy over Arrow) against CONTRACT §1
written out plainly, one order at a time, on random events. No Spark: the walk is pure."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_analytics.bodies import DEFERRED
from spark_analytics.meaning import SUM_CAP, _walk_partition, book_walk

TTL = 700
Event = tuple[str, str, str, str, int, int, int]  # vhost, order_id, etype, event_id, ts, idx, shares


def reference(events: list[Event]) -> dict[tuple[str, str], dict[str, Any]]:
    """One order at a time: first copy per (type, id) (earliest (ts, idx)), the timeline by
    (ts, idx, id), the book window, the first request, the saturating walk of purchases."""
    out = {}
    for key in sorted({(e[0], e[1]) for e in events}):
        mine = sorted(e for e in events if (e[0], e[1]) == key)
        firsts: dict[tuple[str, str], Event] = {}
        for e in sorted(mine, key=lambda e: (e[2], e[3], e[4], e[5], e[6])):
            firsts.setdefault((e[2], e[3]), e)
        timeline = sorted(firsts.values(), key=lambda e: (e[4], e[5], e[3], e[2], e[6]))
        first_ts = timeline[0][4]
        close = first_ts + TTL
        inbook = [e for e in timeline if e[4] < close]
        request = next((e for e in inbook if e[2] == "request"), None)
        total, crossing = 0, None
        purchases = [e for e in inbook if e[2] == "purchase"]
        for e in purchases:
            total = min(total + e[6], SUM_CAP)
            if crossing is None and request is not None and total > request[6]:
                crossing = e
        out[key] = {"copies": len(mine), "events": len(timeline), "first_ts": first_ts, "close_ts": close,
                    "late_events": len(timeline) - len(inbook), "edge_ms": min(abs(e[4] - close) for e in timeline),
                    "requested_shares": request and request[6], "request_ts": request and request[4],
                    "purchased_shares": total, "purchase_count": len(purchases),
                    "crossing_ts": crossing and crossing[4], "crossing_id": crossing and crossing[3]}
    return out


def spark_sorted(events: list[Event]) -> pa.Table:
    """What the walk receives: whole orders, sorted by (vhost, order, type, id, ts, idx, shares)."""
    rows = sorted(events)
    names = ["vhost", "order_id", "etype", "event_id", "ts", "idx", "shares"]
    return pa.table({**{n: [r[i] for r in rows] for i, n in enumerate(names)}, "valid": [True] * len(rows)})


def walked(batch: pa.RecordBatch | pa.Table) -> dict[tuple[str, str], dict[str, Any]]:
    rows = {(r.pop("vhost"), r.pop("order_id")): r for r in batch.to_pylist()}
    for r in rows.values():
        assert r.pop("unreadable") == 0 and r.pop("rejected") == 0 and r.pop("deferred") == 0
    return rows


events = st.lists(st.tuples(
    st.sampled_from(["/", "b"]), st.sampled_from(["1", "2", "3"]), st.sampled_from(["request", "purchase"]),
    st.sampled_from(["1", "2", "3", "x"]), st.integers(0, 150).map(lambda t: t * 10), st.integers(0, 2),
    st.one_of(st.integers(1, 300), st.just(10**15))), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_walk_is_contract_1(evs: list[Event]) -> None:
    # A request's id is its order's id (the decoder makes it so); purchases may reuse any id.
    evs = [(v, o, k, o if k == "request" else i, t, x, s) for v, o, k, i, t, x, s in evs]
    assert walked(book_walk(spark_sorted(evs), TTL)) == reference(evs)


@settings(max_examples=100, deadline=None)
@given(events, st.integers(1, 7))
def test_orders_cut_between_arrow_batches_are_walked_whole(evs: list[Event], size: int) -> None:
    evs = [(v, o, k, o if k == "request" else i, t, x, s) for v, o, k, i, t, x, s in evs]
    batches = spark_sorted(evs).to_batches(max_chunksize=size)
    out = pa.Table.from_batches(list(_walk_partition(TTL)(iter(batches))))
    assert walked(out) == reference(evs)


def test_running_sums_saturate_instead_of_overflowing() -> None:
    evs = [("/", "9", "request", "9", 0, 0, 5)] + [("/", "9", "purchase", f"p{i:05d}", 1, 0, 10**15)
                                                      for i in range(9_300)]
    (row,) = walked(book_walk(spark_sorted(evs), TTL)).values()
    assert row["purchased_shares"] == SUM_CAP and row["crossing_id"] == "p00000"


def test_events_of_one_time_are_walked_in_message_order() -> None:
    """Two purchases published in one batch (one ts): the earlier element crosses, whatever its id."""
    evs = [("/", "o", "request", "o", 0, 0, 5), ("/", "o", "purchase", "1", 10, 2, 10),
           ("/", "o", "purchase", "2", 10, 0, 10)]
    assert walked(book_walk(spark_sorted(evs), TTL)) == reference(evs)
    assert reference(evs)[("/", "o")]["crossing_id"] == "2"


def test_elements_that_are_not_events_are_counted_per_deployment_not_walked() -> None:
    good = spark_sorted([("/", "o", "request", "o", 0, 0, 5), ("/", "o", "purchase", "p", 1, 0, 9)])
    junk = pa.table({"vhost": ["/", "b", "b", "b"], "order_id": pa.nulls(4, pa.string()),
                     "etype": pa.nulls(4, pa.string()), "event_id": pa.nulls(4, pa.string()), "ts": [5, 5, 6, 7],
                     "idx": [None, 3, 0, DEFERRED], "shares": pa.nulls(4, pa.int64()), "valid": [False] * 4})
    batches = [*good.slice(0, 1).to_batches(), *junk.to_batches(), *good.slice(1).to_batches()]
    out = pa.Table.from_batches(list(_walk_partition(TTL)(iter(batches)))).to_pylist()
    counted = {r["vhost"]: (r["unreadable"], r["rejected"], r["deferred"]) for r in out if r["order_id"] is None}
    assert counted == {"/": (1, 0, 0), "b": (0, 2, 1)}, "a body left to Spark's parser is neither"
    (order,) = [r for r in out if r["order_id"] is not None]
    assert order["purchased_shares"] == 9 and order["crossing_id"] == "p" and order["copies"] == 2
