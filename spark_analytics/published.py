"""Expected alerts against published ones, per order, inside the per-order walk (Arrow).

An alert id names its order (`<kind>:<order id>`), so each alert publish is shuffled to its
order's partition with the order's trade events (`meaning.books_and_judged`), and one pass
gives, per (deployment, alert id) expected or published, what the audit judges: the
expected alert's trigger, the publishes (count, first time, kind and order as published)
and the order's book. (Before: the books cached, then a full outer join of expected and
published alerts and a join with the books, three shuffles of every alert and order.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_BOOK = ["first_ts", "close_ts", "edge_ms", "requested_shares", "purchased_shares", "late_events"]
JUDGED_SCHEMA = ("vhost string, order_id string, alert_id string, expected_ts long, trigger_event string, "
                 "first_publish_ts long, published_kind string, published_order_id string, first_ts long, "
                 "close_ts long, edge_ms long, requested_shares long, purchased_shares long, late_events long, "
                 "expected boolean, publishes long, "
                 # rows with alert_id null: per vhost, what the walk counted
                 "copies long, events long, orders long, expected_alerts long, unreadable long, rejected long, "
                 "deferred long, not_base64 long, oversize long, not_utf8 long")
ARROW = pa.schema([(f.split()[0], {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}[f.split()[1]])
                   for f in JUDGED_SCHEMA.split(", ")])


def expected(books: pa.RecordBatch) -> pa.Table:
    """Each order's expected alert (CONTRACT §1): kind, trigger time and trigger event, from its book."""
    t = pa.Table.from_batches([books])
    req, req_ts, crossing = t["requested_shares"], t["request_ts"], t["crossing_ts"]
    over = pc.fill_null(pc.greater(t["purchased_shares"], req), False)
    without = pc.and_(pc.is_null(req), pc.greater(t["purchase_count"], 0))
    none = pa.scalar(None, pa.string())
    kind = pc.if_else(over, "over_purchase", pc.if_else(without, "purchase_without_request", none))
    trigger_ts = pc.if_else(over, pc.max_element_wise(crossing, req_ts),
                            pc.if_else(without, t["close_ts"], pa.scalar(None, pa.int64())))
    by_request = pc.fill_null(pc.greater(req_ts, crossing), False)
    trigger = pc.if_else(over, pc.if_else(by_request, pc.binary_join_element_wise("request:", t["order_id"], ""),
                                          pc.binary_join_element_wise("purchase:", t["crossing_id"], "")),
                         pc.if_else(without, "book close", none))
    return t.select(["vhost", "order_id", *_BOOK]).append_column("expected_kind", kind).append_column(
        "expected_ts", trigger_ts).append_column("trigger_event", trigger)


def _first_valid(values: pa.Array, starts: np.ndarray, n: int) -> pa.Array:
    """Per group (rows from `starts[i]`): the first non-null value."""
    pos = np.where(values.is_valid().to_numpy(zero_copy_only=False), np.arange(n), n)
    first = np.minimum.reduceat(pos, starts) if len(starts) else np.zeros(0, dtype=np.int64)
    found = first < n
    return pc.if_else(pa.array(found), values.take(pa.array(np.where(found, first, 0))),
                      pa.scalar(None, values.type))


def publish_groups(pubs: pa.Table) -> pa.Table:
    """Alert publishes sorted by (vhost, order, alert id, time) to one row per (vhost, alert id):
    publishes, first time, and the kind and order of the earliest publish that names them."""
    n = pubs.num_rows
    if n == 0:
        return pa.table({"vhost": pa.array([], pa.string()), "alert_id": pa.array([], pa.string()),
                         "okey": pa.array([], pa.string()), "publishes": pa.array([], pa.int64()),
                         "first_publish_ts": pa.array([], pa.int64()), "published_kind": pa.array([], pa.string()),
                         "published_order_id": pa.array([], pa.string())})
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for col in ("vhost", "order_id", "event_id"):
        c = pubs[col].combine_chunks()
        new[1:] |= pc.not_equal(c.slice(1), c.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(new)
    at = pa.array(starts)
    return pa.table({"vhost": pubs["vhost"].take(at), "alert_id": pubs["event_id"].take(at),
                     "okey": pubs["order_id"].take(at), "publishes": np.diff(np.r_[starts, n]),
                     "first_publish_ts": pubs["ts"].take(at),
                     "published_kind": _first_valid(pubs["kind"].combine_chunks(), starts, n),
                     "published_order_id": _first_valid(pubs["published_order_id"].combine_chunks(), starts, n)})


def judged(exp: pa.Table, pubs: pa.Table) -> pa.RecordBatch:
    """One row per (vhost, alert id) expected or published (JUDGED_SCHEMA), with its order's book.
    `exp`: `expected(books)`, computed once per batch for this and `counted`."""
    wanted = exp.filter(pc.is_valid(exp["expected_kind"]))
    wanted = pa.table({"vhost": wanted["vhost"], "alert_id": pc.binary_join_element_wise(
        wanted["expected_kind"], wanted["order_id"], ":"), "order_id": wanted["order_id"],
        "expected_ts": wanted["expected_ts"], "trigger_event": wanted["trigger_event"],
        "expected": pa.array(np.ones(wanted.num_rows, dtype=bool))})
    both = wanted.join(publish_groups(pubs), ["vhost", "alert_id"], join_type="full outer")
    both = both.set_column(both.schema.get_field_index("order_id"), "order_id",
                           pc.coalesce(both["order_id"], both["okey"])).drop_columns(["okey"])
    per = both.join(exp.select(["vhost", "order_id", *_BOOK]), ["vhost", "order_id"], join_type="left outer")
    n = per.num_rows
    cols = {name: per[name] if name in per.column_names else pa.nulls(n, ARROW.field(name).type)
            for name in ARROW.names}
    cols["expected"] = pc.fill_null(per["expected"], False)
    cols["publishes"] = pc.fill_null(per["publishes"], 0)
    return pa.Table.from_pydict(cols, schema=ARROW).combine_chunks().to_batches()[0] if n else \
        pa.RecordBatch.from_pylist([], schema=ARROW)


def counted(books: pa.RecordBatch, exp: pa.Table) -> pa.RecordBatch:
    """Per vhost: events as published (copies), distinct events, orders and expected alerts
    (`exp`: `expected(books)`)."""
    exp_kinds = pc.is_valid(exp["expected_kind"]).cast(pa.int64())
    t = pa.table({"vhost": books["vhost"], "copies": books["copies"], "events": books["events"],
                  "expected_alerts": exp_kinds})
    g = t.group_by("vhost").aggregate([("copies", "sum"), ("events", "sum"), ("expected_alerts", "sum"),
                                       ([], "count_all")])
    m = g.num_rows
    cols = {name: pa.nulls(m, ARROW.field(name).type) for name in ARROW.names}
    cols.update(vhost=g["vhost"], copies=g["copies_sum"], events=g["events_sum"],
                expected_alerts=g["expected_alerts_sum"], orders=g["count_all"],
                unreadable=pa.array(np.zeros(m, dtype=np.int64)), rejected=pa.array(np.zeros(m, dtype=np.int64)),
                deferred=pa.array(np.zeros(m, dtype=np.int64)))
    return pa.Table.from_pydict(cols, schema=ARROW).combine_chunks().to_batches()[0] if m else \
        pa.RecordBatch.from_pylist([], schema=ARROW)
