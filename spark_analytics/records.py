"""One pass over the raw trace lines: each record reduced to what the audit judges.

The raw lines (base64 bodies, firehose headers) are parsed once into a compact frame of one
row per record, which the audit keeps cached; every later step reads it. A trade message
keeps its body as traced (base64) and is decoded and split into its elements only once, by
`element_blobs`, on the way into the per-order pass (`meaning.books_and_judged`), in the
Python workers that also pack them by order: a 1000-event batch is one cached row, not 1000,
and its elements never become Spark rows. Columns:

- `vhost` (the deployment: the record's field, else the firehose header; heartbeats and
  gaps without one belong to every deployment), `kind` (trade | alert | delivery |
  heartbeat | gap | corrupt | publish | deliver), `ts`, gap fields;
- trade messages: `b64` (the body as traced: `body_decode` decodes it, `bodies` splits it, and
  both count what is junk), `msgpack` (the content type says msgpack);
- alert publishes and channel deliveries: `alerts` (one, or a batch: the lookout hands
  channels batches too); deliveries also `channel`, `redelivered`;
- `fp1`, `fp2`, `trace_redelivered`: to drop alert/delivery copies re-recorded after a
  recorder crash (a re-recorded trade message is one more copy of its event ids, which
  count once anyway).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_analytics import bodies, order_shuffle, traces, wire

NO_VHOST = "(not recorded)"  # traces written before records carried their vhost
ELEMENT = ["vhost", "ts", "idx", "valid", "etype", "event_id", "order_id", "shares", "junk"]


def _records(raw_df: DataFrame) -> DataFrame:
    """Per record: its kind and deployment, trade bodies as traced (`b64`), alerts read."""
    df = traces.fingerprint(raw_df)
    kind, exchange, queue, message_id = F.col("kind"), F.col("exchange"), F.col("queue"), F.col("message_id")
    corrupt = F.col(traces.CORRUPT).isNotNull()
    is_trade = ~corrupt & (kind == "publish") & (exchange == wire.TRADE_EXCHANGE)
    is_alert = ~corrupt & (kind == "publish") & (exchange == wire.ALERT_EXCHANGE)
    is_delivery = (~corrupt & (kind == "deliver") & queue.startswith(wire.CHANNEL_PREFIX)
                   & ~queue.endswith(".Dead_Letter"))
    traced = kind.isin("publish", "deliver")
    vhost = F.when(corrupt, F.lit(None).cast("string")).when(
        traced, F.coalesce("vhost", "headers.vhost", F.lit(NO_VHOST))).otherwise(F.col("vhost"))
    df = df.select(
        vhost.alias("vhost"),
        F.when(corrupt, "corrupt").when(is_trade, "trade").when(is_alert, "alert").when(is_delivery, "delivery")
        .otherwise(kind).alias("kind"),
        "ts", "start", "end", "interval", "reason", "content_type", message_id, "redelivered", "trace_redelivered",
        F.when(is_alert | is_delivery, F.col("fp1")).alias("fp1"),
        F.when(is_alert | is_delivery, F.col("fp2")).alias("fp2"),
        F.when(is_delivery, F.expr(f"substring(queue, {len(wire.CHANNEL_PREFIX) + 1})")).alias("channel"),
        # A trade body stays base64 here: the workers that split it decode it (`body_decode`).
        F.when(is_trade, F.col("body_b64")).alias("b64"),
        F.when(is_trade, F.coalesce(F.col("content_type") == wire.MSGPACK, F.lit(False))).alias("msgpack"),
        F.when(is_alert | is_delivery, wire.body_bytes()).alias("raw"))
    # Each column below reads `raw` and `text` once per record (no repeated decoding).
    df = df.select("*", wire.utf8_text(F.col("raw")).alias("text"))
    alert, delivery = (F.col("kind") == k for k in ("alert", "delivery"))
    return df.select(
        "vhost", "kind", "ts", "start", "end", "interval", "reason", "b64", "msgpack",
        F.when(alert | delivery, wire.alerts_of(F.col("text"), message_id)).alias("alerts"),
        F.when(alert | delivery, F.col("text").isNull() & message_id.isNull()).alias("alert_unreadable"),
        "channel",
        F.when(delivery, F.coalesce("redelivered", F.lit(False))).alias("redelivered"),
        F.when(F.col("kind").isin("trade", "alert", "delivery", "publish", "deliver"),
               F.col("trace_redelivered")).alias("trace_redelivered"),
        "fp1", "fp2")


def decode(raw_df: DataFrame) -> DataFrame:
    """The compact frame described in the module docstring."""
    return _records(raw_df)


def _spark_parsed(split: DataFrame) -> DataFrame:
    """`split` with each row that `bodies` left to Spark's parser (`spark_text`) replaced by
    that body's elements, read by `wire.element_maps` (one row with `idx` null when none)."""
    deferred = F.col("spark_text").isNotNull()
    exploded = split.select("*", F.posexplode_outer(F.when(deferred, wire.element_maps(F.col("spark_text"))))
                            .alias("spark_idx", "m"))
    fields = wire.element_values(wire.canonical(F.col("m")))
    return exploded.select("vhost", "ts", F.when(deferred, F.col("spark_idx")).otherwise(F.col("idx")).alias("idx"),
                           *[F.when(deferred, v).otherwise(F.col(name)).alias(name) for name, v in fields.items()],
                           "junk")


def _trades(msgs: DataFrame) -> DataFrame:
    return msgs.where(F.col("kind") == "trade").select("vhost", "ts", "b64", "msgpack")


def elements(msgs: DataFrame, max_bytes: int, spark_parser: bool = False) -> DataFrame:
    """Every element of every trade message (ELEMENT columns), split by `bodies` in the Python
    workers. A message with no element at all (its body no base64, over `max_bytes`, no UTF-8:
    `junk` says which; not JSON nor the text form, truncated, empty) is one row with `idx` null.
    A body that only Spark's parser reads exactly is one row with `idx` = `bodies.DEFERRED`, or,
    with `spark_parser`, its elements as that parser reads them."""
    split = _trades(msgs).mapInArrow(bodies.split(max_bytes), bodies.ELEMENT_SCHEMA)
    return _spark_parsed(split) if spark_parser else split.drop("spark_text")


def element_blobs(msgs: DataFrame, buckets: int, max_bytes: int, spark_parser: bool = False) -> DataFrame:
    """`elements` packed by order for the walk (`order_shuffle`): split and packed in one pass of
    the Python workers, so the elements never become Spark rows; with `spark_parser` the
    elements Spark's parser read are packed after it."""
    if not spark_parser:
        return _trades(msgs).mapInArrow(order_shuffle.split_and_pack(buckets, max_bytes), order_shuffle.BLOB_SCHEMA)
    nothing = F.lit(None).cast("string")
    rows = elements(msgs, max_bytes, spark_parser=True).select(
        "vhost", "order_id", "etype", "event_id", "ts", "idx", "shares", "valid", "junk", nothing.alias("kind"),
        nothing.alias("published_order_id"))
    return rows.mapInArrow(order_shuffle.packed(buckets), order_shuffle.BLOB_SCHEMA)


def alert_publishes(slim: DataFrame) -> DataFrame:
    """One row per published alert (batches exploded): vhost, ts, alert_id, kind, order_id."""
    return (slim.where(F.col("kind") == "alert").select("vhost", "ts", F.explode("alerts").alias("a"))
            .select("vhost", "ts", "a.alert_id", F.coalesce("a.kind", wire.kind_of(F.col("a.alert_id"))).alias("kind"),
                    F.coalesce("a.order_id", wire.order_of(F.col("a.alert_id"))).alias("order_id")))


def channel_deliveries(slim: DataFrame) -> DataFrame:
    """One row per alert delivered from Aldebaran.Channel.<name> (not their dead-letter queues)."""
    return (slim.where(F.col("kind") == "delivery")
            .select("vhost", "ts", "channel", "redelivered", F.explode("alerts").alias("a"))
            .select("vhost", "ts", "channel", "a.alert_id", "redelivered"))
