"""CONTRACT §1 re-derived with DataFrame operations: which alerts should exist, and when.

Independent of the streaming book on purpose: distinct event ids per order, a running
sum in publish order, one comparison. Times are trace times (epoch ms).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F


def distinct_events(events: DataFrame) -> DataFrame:
    """An event counts once per (type, id): keep its first publish (redelivery, retries, resends)."""
    first = F.min(F.struct("ts", "order_id", "shares", "client", "stock", F.lit(1).alias("n")))
    return (events.groupBy("etype", "event_id").agg(first.alias("f"), F.count("*").alias("copies"))
            .select("etype", "event_id", "f.order_id", "f.shares", "f.client", "f.stock", "f.ts", "copies"))


def books(events: DataFrame, book_ttl_ms: int) -> DataFrame:
    """One row per order: its book window, request, in-book purchases, expected alert.

    Columns: order_id, first_ts, close_ts, requested_shares, request_ts, purchased_shares,
    purchase_count, late_events, expected_kind, expected_ts (trigger time), trigger_event,
    edge_ms (how close an event came to the book's close; near-ties are not judged).
    """
    first = events.groupBy("order_id").agg(F.min("ts").alias("first_ts"))
    ev = events.join(first, "order_id").withColumn("close_ts", F.col("first_ts") + F.lit(book_ttl_ms))
    ev = ev.withColumn("in_book", F.col("ts") < F.col("close_ts"))
    inbook = ev.where("in_book")

    requests = inbook.where(F.col("etype") == "request").select(
        "order_id", F.col("shares").alias("requested_shares"), F.col("ts").alias("request_ts"),
        F.col("client").alias("request_client"), F.col("stock").alias("request_stock"))
    purchases = inbook.where(F.col("etype") == "purchase")
    order = Window.partitionBy("order_id").orderBy("ts", "event_id")
    running = purchases.withColumn("running", F.sum("shares").over(
        order.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    running = running.join(requests.select("order_id", "requested_shares"), "order_id", "left")
    crossing = (running.where(F.col("requested_shares").isNotNull() & (F.col("running") > F.col("requested_shares")))
                .groupBy("order_id").agg(F.min(F.struct("ts", "event_id")).alias("x"))
                .select("order_id", F.col("x.ts").alias("crossing_ts"), F.col("x.event_id").alias("crossing_id")))
    sums = purchases.groupBy("order_id").agg(
        F.sum("shares").alias("purchased_shares"), F.count("*").alias("purchase_count"),
        F.sort_array(F.collect_list("event_id")).alias("purchase_ids"))
    meta = ev.groupBy("order_id").agg(
        F.first("first_ts").alias("first_ts"), F.first("close_ts").alias("close_ts"),
        F.sum(F.when(~F.col("in_book"), 1).otherwise(0)).alias("late_events"),
        F.min(F.abs(F.col("ts") - F.col("close_ts"))).alias("edge_ms"))

    b = (meta.join(requests, "order_id", "left").join(sums, "order_id", "left")
         .join(crossing, "order_id", "left")
         .fillna({"purchased_shares": 0, "purchase_count": 0}))
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
