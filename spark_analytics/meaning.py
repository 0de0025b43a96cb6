"""CONTRACT §1 re-derived with DataFrame operations: which alerts should exist, and when.

Independent of the streaming book on purpose: distinct event ids per order (as the
book counts them: once per (type, id) within its order, first publish wins), a running
sum in publish order, one comparison. Times are trace times (epoch ms). Everything is
per deployment (`vhost`): two deployments' order "1" are two orders.

One shuffle in all: each order's events are gathered into one array, which Spark's
higher-order functions sort, deduplicate and walk.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

SUM_CAP = 4 * 10**18  # running sums saturate here: never an overflow, still "over" any request


def _crossing(purchases: Column, requested: Column) -> Column:
    """One walk in publish order: the saturating sum and the purchase that first went over."""
    none = F.lit(None).cast("struct<ts:bigint,event_id:string>")
    start = F.struct(F.lit(0).cast("long").alias("s"), none.alias("x"))

    def step(acc: Column, e: Column) -> Column:
        total = F.least(acc["s"] + e["shares"], F.lit(SUM_CAP))
        crossed = acc["x"].isNull() & requested.isNotNull() & (total > requested)
        here = F.struct(e["ts"].alias("ts"), e["event_id"].alias("event_id"))
        return F.struct(total.alias("s"), F.when(crossed, here).otherwise(acc["x"]).alias("x"))
    return F.aggregate(purchases, start, step)


def books(events: DataFrame, book_ttl_ms: int) -> DataFrame:
    """`events` (vhost, order_id, etype, event_id, ts, idx, shares; copies included) to one
    row per (vhost, order): its book window, request, in-book purchases, expected alert.

    Columns: vhost, order_id, events (distinct), copies (as published), first_ts, close_ts,
    requested_shares, request_ts, purchased_shares,
    purchase_count, late_events, expected_kind, expected_ts (trigger time), trigger_event,
    edge_ms (how close an event came to the book's close; near-ties are not judged).
    """
    by_id = F.array_sort(F.collect_list(F.struct("etype", "event_id", "ts", "idx", "shares")))
    per = events.groupBy("vhost", "order_id").agg(by_id.alias("by_id"))
    # Sorted by (type, id, time): an event's first publish is the first of its run of copies.
    first = F.filter("by_id", lambda e, i: (i == 0) | (e["etype"] != F.col("by_id")[i - 1]["etype"])
                     | (e["event_id"] != F.col("by_id")[i - 1]["event_id"]))
    per = per.select("vhost", "order_id", F.size("by_id").alias("copies"), first.alias("distinct"))
    timeline = F.array_sort(F.transform("distinct", lambda e: F.struct(
        e["ts"].alias("ts"), e["idx"].alias("idx"), e["event_id"].alias("event_id"), e["etype"].alias("etype"),
        e["shares"].alias("shares"))))
    per = per.select("vhost", "order_id", "copies", F.size("distinct").alias("events"), timeline.alias("evs"))
    first_ts = F.col("evs")[0]["ts"]
    close = first_ts + F.lit(book_ttl_ms)
    per = per.select("vhost", "order_id", "evs", "events", "copies", first_ts.alias("first_ts"),
                     close.alias("close_ts"))
    # Each array is computed once and named: later steps read the column, not the function.
    per = per.select("*", F.filter("evs", lambda e: e["ts"] < F.col("close_ts")).alias("inbook"))
    per = per.select("*", F.get(F.filter("inbook", lambda e: e["etype"] == "request"), 0).alias("request"))
    per = per.select(
        "vhost", "order_id", "first_ts", "close_ts", "events", "copies",
        (F.size("evs") - F.size("inbook")).alias("late_events"),
        F.array_min(F.transform("evs", lambda e: F.abs(e["ts"] - F.col("close_ts")))).alias("edge_ms"),
        F.col("request.shares").alias("requested_shares"), F.col("request.ts").alias("request_ts"),
        F.filter("inbook", lambda e: e["etype"] == "purchase").alias("purchases"))
    per = per.select("*", _crossing(F.col("purchases"), F.col("requested_shares")).alias("walk"))
    b = per.select("*", F.col("walk.s").alias("purchased_shares"), F.size("purchases").alias("purchase_count"),
                   F.col("walk.x.ts").alias("crossing_ts"), F.col("walk.x.event_id").alias("crossing_id")
                   ).drop("purchases", "walk")
    over = F.col("requested_shares").isNotNull() & (F.col("purchased_shares") > F.col("requested_shares"))
    without = F.col("requested_shares").isNull() & (F.col("purchase_count") > 0)
    return b.select(
        "*",
        F.when(over, "over_purchase").when(without, "purchase_without_request").alias("expected_kind"),
        F.when(over, F.greatest("crossing_ts", "request_ts")).when(without, F.col("close_ts")).alias("expected_ts"),
        F.when(over, F.when(F.col("request_ts") > F.col("crossing_ts"), F.concat(F.lit("request:"), "order_id"))
               .otherwise(F.concat(F.lit("purchase:"), "crossing_id")))
        .when(without, F.lit("book close")).alias("trigger_event"),
    ).drop("crossing_ts", "crossing_id")
