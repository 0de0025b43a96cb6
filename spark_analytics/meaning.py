"""CONTRACT §1 re-derived per order: which alerts should exist, and when.

Independent of the streaming book on purpose: distinct event ids per order (as the
book counts them: once per (type, id) within its order, first publish wins), a running
sum in publish order, one comparison. Times are trace times (epoch ms). Everything is
per deployment (`vhost`): two deployments' order "1" are two orders.

One shuffle in all: the trade elements and the alert publishes are handed to their order's
partition as Arrow blobs and sorted there by (order, type, id, time) (`order_shuffle`), then
each partition is walked in Arrow batches with numpy (`book_walk`), vectorised over all of
its orders at once, and each order's expected alert meets its publishes there
(`published.judged`). The same pass counts the elements that are not events (rejected, a
message with none, a body left to Spark's parser), so no step before it has to hold one row
per element.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_analytics import body_decode, order_shuffle, published
from spark_analytics.bodies import DEFERRED

SUM_CAP = 4 * 10**18  # running sums saturate here: never an overflow, still "over" any request
_KEYS = ["vhost", "order_id", "etype", "event_id", "ts", "idx", "shares"]
BOOK_SCHEMA = ("vhost string, order_id string, copies long, events long, first_ts long, close_ts long, "
               "late_events long, edge_ms long, requested_shares long, request_ts long, purchased_shares long, "
               "purchase_count long, crossing_ts long, crossing_id string")


def _changed(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row: does it differ from the row before (the first row: True)?"""
    n = len(col)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return out


def _per_group(values: np.ndarray, gid: np.ndarray, groups: int, fill: int, pick: str) -> np.ndarray:
    """`pick` ('first' | 'last') of `values` per group id (rows grouped, in order), `fill` where none."""
    out = np.full(groups, fill, dtype=np.int64)
    if len(gid):
        if pick == "first":
            at = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
        else:
            at = np.flatnonzero(np.r_[gid[1:] != gid[:-1], True])
        out[gid[at]] = values[at]
    return out


def _group_cumsum(values: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Running sums restarting at each group, saturating at SUM_CAP (shares are positive)."""
    exact = np.cumsum(values, dtype=np.int64)
    rough = np.cumsum(values, dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]]) if len(gid) else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(values), dtype=np.int64)
    rough_off = np.zeros(len(values), dtype=np.float64)
    if len(starts):
        before = np.r_[0, exact[starts[1:] - 1]]
        rough_before = np.r_[0.0, rough[starts[1:] - 1]]
        sizes = np.diff(np.r_[starts, len(values)])
        offsets, rough_off = np.repeat(before, sizes), np.repeat(rough_before, sizes)
    # The int64 sum is exact until it overflows near 9.2e18; the float one says when it may have.
    return np.where(rough - rough_off > 8e18, SUM_CAP, np.minimum(exact - offsets, SUM_CAP))


def _timeline(gid: np.ndarray, ts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The order sorting rows by (gid, ts, idx), stable (equal keys keep their (type, id) order):
    one sort of a packed 64-bit key when the spans fit, else numpy's lexsort."""
    if len(gid) == 0:
        return np.zeros(0, dtype=np.int64)
    t0, i0 = int(ts.min()), int(idx.min())
    ts_span, idx_span = int(ts.max()) - t0 + 1, int(idx.max()) - i0 + 1
    if (int(gid[-1]) + 1) * ts_span * idx_span >= 2**62:
        return np.lexsort((idx, ts, gid))
    return np.argsort((gid * ts_span + (ts - t0)) * idx_span + (idx - i0), kind="stable")


def book_walk(t: pa.Table, book_ttl_ms: int) -> pa.RecordBatch:
    """Whole orders' events sorted by (vhost, order_id, etype, event_id, ts, idx, shares) to one
    row per order (BOOK_SCHEMA). The first copy of each (type, id) counts; a stable sort by
    (ts, idx) then gives the book's timeline (ties: by id, as before; a request and a purchase
    of one order never share an id and a time in a way that changes the walk)."""
    t = pa.table({k: t.column(k).combine_chunks() for k in _KEYS})
    n = t.num_rows
    new_order = _changed(t["vhost"]) | _changed(t["order_id"])
    gid_all = np.cumsum(new_order) - 1
    groups = int(gid_all[-1]) + 1 if n else 0
    first_copy = new_order | _changed(t["etype"]) | _changed(t["event_id"])
    keep = np.flatnonzero(first_copy)
    gid0, ts0, idx0 = gid_all[keep], t["ts"].to_numpy()[keep], t["idx"].to_numpy()[keep]
    order = _timeline(gid0, ts0, idx0)
    rows = keep[order]
    gid, ts = gid0[order], ts0[order]
    shares = t["shares"].to_numpy()[rows]
    is_request = pc.equal(t["etype"].take(pa.array(rows)), "request").to_numpy(zero_copy_only=False)
    first_ts = _per_group(ts, gid, groups, 0, "first")
    close = first_ts + book_ttl_ms
    inbook = ts < close[gid]
    edge = np.full(groups, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(edge, gid, np.abs(ts - close[gid]))
    req_rows = np.flatnonzero(inbook & is_request)
    has_req = np.zeros(groups, dtype=bool)
    has_req[gid[req_rows]] = True
    requested = _per_group(shares[req_rows], gid[req_rows], groups, 0, "first")
    request_ts = _per_group(ts[req_rows], gid[req_rows], groups, 0, "first")
    buy = np.flatnonzero(inbook & ~is_request)
    bgid = gid[buy]
    sums = _group_cumsum(shares[buy], bgid)
    crossed = np.flatnonzero(has_req[bgid] & (sums > requested[bgid]))
    has_cross = np.zeros(groups, dtype=bool)
    has_cross[bgid[crossed]] = True
    cross_at = _per_group(buy[crossed], bgid[crossed], groups, 0, "first")
    starts = np.flatnonzero(new_order)
    return pa.RecordBatch.from_pydict({
        "vhost": t["vhost"].take(pa.array(starts)).combine_chunks(),
        "order_id": t["order_id"].take(pa.array(starts)).combine_chunks(),
        "copies": np.diff(np.r_[starts, n]), "events": np.bincount(gid, minlength=groups),
        "first_ts": first_ts, "close_ts": close,
        "late_events": np.bincount(gid[~inbook], minlength=groups), "edge_ms": edge,
        "requested_shares": pa.array(requested, mask=~has_req), "request_ts": pa.array(request_ts, mask=~has_req),
        "purchased_shares": _per_group(sums, bgid, groups, 0, "last"),
        "purchase_count": np.bincount(bgid, minlength=groups),
        "crossing_ts": pa.array(ts[cross_at], mask=~has_cross),
        "crossing_id": pc.if_else(pa.array(has_cross), t["event_id"].take(pa.array(rows[cross_at])).combine_chunks(),
                                  pa.scalar(None, pa.string())),
    }, schema=_BOOK_ARROW)


_BOOK_ARROW = pa.schema([(f.split()[0], pa.string() if f.split()[1] == "string" else pa.int64())
                         for f in BOOK_SCHEMA.split(", ")])


def _junk(t: pa.Table) -> pa.RecordBatch:
    """One row per vhost: elements rejected, messages with no element (idx null; of them, the
    bodies that are junk, by `body_decode` reason), and bodies left to Spark's parser (idx
    DEFERRED, `records.elements`)."""
    t = t.append_column("deferred", pc.equal(t["idx"], DEFERRED).cast(pa.int64()))
    reasons = body_decode.REASONS.items()
    for code, name in reasons:
        t = t.append_column(name, pc.fill_null(pc.equal(t["junk"], code), False).cast(pa.int64()))
    g = t.group_by("vhost").aggregate([("idx", "count"), ([], "count_all"), ("deferred", "sum"),
                                       *[(name, "sum") for _, name in reasons]])
    n = g.num_rows
    cols: dict[str, object] = {f.name: pa.nulls(n, f.type) for f in published.ARROW}
    deferred = pc.fill_null(g["deferred_sum"], 0).to_numpy()
    with_idx = g["idx_count"].to_numpy()
    cols.update(vhost=g["vhost"].combine_chunks(), rejected=with_idx - deferred, deferred=deferred,
                unreadable=g["count_all"].to_numpy() - with_idx,
                **{name: pc.fill_null(g[f"{name}_sum"], 0).to_numpy() for _, name in reasons})
    return pa.RecordBatch.from_pydict(cols, schema=published.ARROW)


def _judge(t: pa.Table, book_ttl_ms: int) -> Iterator[pa.RecordBatch]:
    """Whole orders (trade events and alert publishes, sorted): the counts of their books, and
    one row per alert expected or published (`published.judged`)."""
    is_publish = pc.is_null(t["etype"])
    events, pubs = t.filter(pc.invert(is_publish)), t.filter(is_publish)
    books = book_walk(events, book_ttl_ms) if events.num_rows else pa.RecordBatch.from_pylist([], schema=_BOOK_ARROW)
    exp = published.expected(books)
    if books.num_rows:
        yield published.counted(books, exp)
    yield published.judged(exp, pubs)


def _walk_partition(book_ttl_ms: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def walk(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Batches cut orders anywhere: the last order of a batch waits for the next one."""
        carry: list[pa.RecordBatch] = []
        for batch in batches:
            valid = batch["valid"]
            if valid.false_count or valid.null_count:
                yield _junk(pa.Table.from_batches([batch]).filter(pc.invert(pc.fill_null(valid, False))))
                batch = batch.filter(pc.fill_null(valid, False))
            if batch.num_rows == 0:
                continue
            t = pa.Table.from_batches([*carry, batch]).combine_chunks()
            starts = np.flatnonzero(_changed(t["vhost"]) | _changed(t["order_id"]))
            cut = int(starts[-1])
            if cut > 0:
                yield from _judge(t.slice(0, cut), book_ttl_ms)
            carry = t.slice(cut).to_batches()
        if carry:
            yield from _judge(pa.Table.from_batches(carry).combine_chunks(), book_ttl_ms)
    return walk


def _order_key(alert_id: Column) -> Column:
    """The order an alert id names (`<kind>:<order id>`: all after the first colon), "" for none."""
    colon = F.instr(alert_id, ":")
    return F.when(colon > 1, F.expr("substring(alert_id, instr(alert_id, ':') + 1)")).otherwise(F.lit(""))


def books_and_judged(elements: DataFrame, publishes: DataFrame, book_ttl_ms: int, buckets: int) -> DataFrame:
    """Trade elements packed by order (`records.element_blobs`: vhost, ts, idx, valid, etype,
    event_id, order_id, shares; copies included) and alert `publishes` (records.alert_publishes),
    walked per (vhost, order), to `published.JUDGED_SCHEMA`: one row per alert expected or
    published with its order's book (first_ts, close_ts, edge_ms: how close an event came to the
    book's close, requested_shares, purchased_shares, late_events); and rows with `alert_id` null
    that count, per vhost, events as published (copies), distinct events, orders, expected alerts,
    and the elements that are not events (`unreadable`, `rejected`, `deferred`; of the unreadable,
    the bodies that are junk: `not_base64`, `oversize`, `not_utf8`).
    """
    nothing = F.lit(None).cast("string")
    pubs = publishes.select("vhost", _order_key(F.col("alert_id")).alias("order_id"), nothing.alias("etype"),
                            F.col("alert_id").alias("event_id"), "ts", F.lit(None).cast("int").alias("idx"),
                            F.lit(None).cast("long").alias("shares"), F.lit(True).alias("valid"),
                            F.lit(None).cast("tinyint").alias("junk"), "kind",
                            F.col("order_id").alias("published_order_id"))
    blobs = elements.unionByName(pubs.mapInArrow(order_shuffle.packed(buckets), order_shuffle.BLOB_SCHEMA))
    # A few thousand blobs, each one bucket's rows: within an order publishes (etype null) come first.
    rows = blobs.repartition("bucket").sortWithinPartitions("bucket")
    return rows.mapInArrow(order_shuffle.walker(_walk_partition(book_ttl_ms)), published.JUDGED_SCHEMA)
