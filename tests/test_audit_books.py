"""The audit's per-order walk (`meaning.book_walk`, numpy over Arrow) against CONTRACT §1
written out plainly, one order at a time, on random events. No Spark: the walk is pure."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_analytics import order_shuffle
from spark_analytics.bodies import DEFERRED
from spark_analytics.body_decode import NOT_BASE64, NOT_UTF8
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
    return pa.table({**{n: [r[i] for r in rows] for i, n in enumerate(names)}, "valid": [True] * len(rows),
                     "junk": pa.nulls(len(rows), pa.int8()), "kind": pa.nulls(len(rows), pa.string()),
                     "published_order_id": pa.nulls(len(rows), pa.string())})


def walked(batch: pa.RecordBatch | pa.Table) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r.pop("vhost"), r.pop("order_id")): r for r in batch.to_pylist()}


def expected_alerts(books: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], tuple]:
    """CONTRACT §1's alert per order, from its book: (vhost, alert id) -> (trigger time, trigger, book)."""
    out = {}
    for (vhost, order), b in books.items():
        book = (b["first_ts"], b["close_ts"], b["purchased_shares"], b["late_events"])
        if b["requested_shares"] is not None and b["purchased_shares"] > b["requested_shares"]:
            trigger = f"request:{order}" if b["request_ts"] > b["crossing_ts"] else f"purchase:{b['crossing_id']}"
            out[(vhost, f"over_purchase:{order}")] = (max(b["request_ts"], b["crossing_ts"]), trigger, *book)
        elif b["requested_shares"] is None and b["purchase_count"] > 0:
            out[(vhost, f"purchase_without_request:{order}")] = (b["close_ts"], "book close", *book)
    return out


def judged(rows: list[dict[str, Any]]) -> tuple[dict[tuple[str, str], tuple], dict[str, tuple[int, int, int]]]:
    """The walk's output: alerts as `expected_alerts` gives them, and per vhost (copies, events, orders)."""
    alerts = {(r["vhost"], r["alert_id"]): (r["expected_ts"], r["trigger_event"], r["first_ts"], r["close_ts"],
                                            r["purchased_shares"], r["late_events"])
              for r in rows if r["alert_id"] is not None}
    counts: dict[str, tuple[int, int, int]] = {}
    for r in rows:
        if r["alert_id"] is None and r["copies"] is not None:
            c = counts.get(r["vhost"], (0, 0, 0))
            counts[r["vhost"]] = (c[0] + r["copies"], c[1] + r["events"], c[2] + r["orders"])
    return alerts, counts


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
    alerts, counts = judged(pa.Table.from_batches(list(_walk_partition(TTL)(iter(batches)))).to_pylist())
    books = reference(evs)
    assert alerts == expected_alerts(books)
    assert counts == {v: (sum(b["copies"] for (vv, _), b in books.items() if vv == v),
                          sum(b["events"] for (vv, _), b in books.items() if vv == v),
                          sum(1 for vv, _ in books if vv == v)) for v in {v for v, _ in books}}


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
    good = spark_sorted([("/", "o", "request", "o", 0, 0, 5), ("/", "o", "purchase", "p", 1, 0, 9)]).drop_columns(
        ["kind", "published_order_id"])
    junk = pa.table({"vhost": ["/", "b", "b", "b", "b", "b", "b"], "order_id": pa.nulls(7, pa.string()),
                     "etype": pa.nulls(7, pa.string()), "event_id": pa.nulls(7, pa.string()),
                     "ts": [5, 5, 6, 7, 8, 8, 9], "idx": [None, 3, 0, DEFERRED, None, None, None],
                     "shares": pa.nulls(7, pa.int64()), "valid": [False] * 7,
                     "junk": pa.array([None, None, None, None, NOT_UTF8, NOT_BASE64, NOT_UTF8], pa.int8())})
    batches = [*good.slice(0, 1).to_batches(), *junk.to_batches(), *good.slice(1).to_batches()]
    out = pa.Table.from_batches(list(_walk_partition(TTL)(iter(batches)))).to_pylist()
    counted = {v: tuple(sum(r[k] for r in out if r["vhost"] == v and r[k] is not None)
                        for k in ("unreadable", "rejected", "deferred", "not_base64", "oversize", "not_utf8"))
               for v in ("/", "b")}
    assert counted == {"/": (1, 0, 0, 0, 0, 0), "b": (3, 2, 1, 1, 0, 2)}, \
        "a body left to Spark's parser is neither; a junk body is unreadable, with its reason"
    (alert,) = [r for r in out if r["alert_id"] is not None]
    assert (alert["alert_id"], alert["purchased_shares"], alert["trigger_event"]) == (
        "over_purchase:o", 9, "purchase:p")
    assert [r["copies"] for r in out if r["copies"] is not None] == [2]


Publish = tuple[str, str, int]  # vhost, alert_id, ts


def order_of(alert_id: str) -> str:
    kind, colon, order = alert_id.partition(":")
    return order if colon and kind else ""


def with_publishes(evs: list[Event], pubs: list[Publish]) -> pa.Table:
    """Events and alert publishes as the walk receives them: by (vhost, order), publishes first."""
    rows = [(v, o, k, i, t, x, s, None, None) for v, o, k, i, t, x, s in evs]
    rows += [(v, order_of(a), None, a, t, None, None, a.partition(":")[0], order_of(a)) for v, a, t in pubs]
    rows.sort(key=lambda r: (r[0], r[1], r[2] is not None, r[2] or "", r[3], r[4], r[5] or 0, r[6] or 0))
    names = ["vhost", "order_id", "etype", "event_id", "ts", "idx", "shares", "kind", "published_order_id"]
    types = [pa.string()] * 4 + [pa.int64(), pa.int32(), pa.int64(), pa.string(), pa.string()]
    columns = {n: pa.array([r[i] for r in rows], t) for i, (n, t) in enumerate(zip(names, types, strict=True))}
    return pa.table({**columns, "valid": [True] * len(rows), "junk": pa.nulls(len(rows), pa.int8())})


def joined_reference(evs: list[Event], pubs: list[Publish]) -> dict[tuple[str, str], tuple]:
    """The audit's join before it moved into the walk: expected ⟗ published alerts on (vhost,
    alert id), then each with its order's book."""
    books = reference(evs)
    expected = expected_alerts(books)
    out = {}
    for key in set(expected) | {(v, a) for v, a, _ in pubs}:
        times = [t for v, a, t in pubs if (v, a) == key]
        book = books.get((key[0], order_of(key[1])))
        out[key] = (order_of(key[1]), *(expected[key][:2] if key in expected else (None, None)), len(times),
                    min(times, default=None), *((book["first_ts"], book["purchased_shares"]) if book else (None, None)))
    return out


publishes = st.lists(st.tuples(st.sampled_from(["/", "b"]), st.sampled_from(
    ["over_purchase:1", "over_purchase:2", "purchase_without_request:3", "purchase_without_request:1", "weird",
     ":1", "over_purchase:1:x", "kind:9"]), st.integers(0, 150).map(lambda t: t * 10)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(events, publishes, st.integers(1, 9))
def test_alerts_expected_and_published_meet_in_the_walk(evs: list[Event], pubs: list[Publish], size: int) -> None:
    """Missed (expected, no publish), spurious (published, not expected; also for an order with no
    events, or an id naming no order), duplicates (publishes counted): as the joins gave them."""
    evs = [(v, o, k, o if k == "request" else i, t, x, s) for v, o, k, i, t, x, s in evs]
    batches = with_publishes(evs, pubs).to_batches(max_chunksize=size)
    rows = pa.Table.from_batches(list(_walk_partition(TTL)(iter(batches)))).to_pylist()
    got = {(r["vhost"], r["alert_id"]): (r["order_id"], r["expected_ts"], r["trigger_event"], r["publishes"],
                                         r["first_publish_ts"], r["first_ts"], r["purchased_shares"])
           for r in rows if r["alert_id"] is not None}
    assert got == joined_reference(evs, pubs)
    assert sum(r["publishes"] or 0 for r in rows) == len(pubs)


@settings(max_examples=100, deadline=None)
@given(events, st.integers(1, 9), st.randoms(use_true_random=False), st.sampled_from([1, 4, 256, 4096]))
def test_orders_handed_over_as_blobs_are_walked_as_spark_sorted_them(evs: list[Event], size: int, rnd: Any,
                                                                     buckets: int) -> None:
    """`order_shuffle`: rows packed per bucket from any batches in any order, blobs sorted by
    bucket (what Spark's shuffle hands the walk), give what the rows sorted by Spark gave,
    however many buckets the input's size asks for."""
    evs = [(v, o, k, o if k == "request" else i, t, x, s) for v, o, k, i, t, x, s in evs]
    rows = spark_sorted(evs).take(pa.array(rnd.sample(range(len(evs)), len(evs))))
    blobs = pa.Table.from_batches([order_shuffle.pack(rows.slice(a, size), buckets)
                                   for a in range(0, len(evs), size)])
    blobs = blobs.sort_by("bucket")
    walk = order_shuffle.walker(_walk_partition(TTL))
    by_blobs = pa.Table.from_batches(list(walk(iter(blobs.to_batches(max_chunksize=3))))).to_pylist()
    by_spark = pa.Table.from_batches(list(_walk_partition(TTL)(iter(spark_sorted(evs).to_batches())))).to_pylist()
    assert judged(by_blobs) == judged(by_spark)


def test_the_walk_s_buckets_grow_with_the_input_in_powers_of_two() -> None:
    """A bucket is the walk's unit of memory: ~BUCKET_BYTES of trade bodies, never fewer than the minimum."""
    assert order_shuffle.bucket_count(0) == order_shuffle.MIN_BUCKETS
    assert order_shuffle.bucket_count(order_shuffle.BUCKET_BYTES * 256) == 256
    assert order_shuffle.bucket_count(order_shuffle.BUCKET_BYTES * 256 + 1) == 512
    day = 250_000 * 86_400 * 90  # a day at the engine's target rate, ~90 bytes of JSON per event
    assert day / order_shuffle.bucket_count(day) <= order_shuffle.BUCKET_BYTES
