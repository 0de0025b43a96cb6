"""The audit: expected alerts (CONTRACT §1) against what the firehose saw, per order and channel.

Findings, one row each: `missed`, `duplicate`, `spurious`, `late` per alert/order;
`channel_missed`, `channel_duplicate`, `channel_spurious` per channel. Orders whose
window touches an unaudited window get the verdict `unaudited` instead of a finding;
orders with an event within `ttl_tolerance` of their book's close are `uncertain`
(trace times and the pipeline's clock may disagree by that much); alerts still inside
their grace period at the end of the traces are `pending`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_analytics import gaps as gaps_mod
from spark_analytics import meaning, traces, wire
from spark_analytics.options import AuditOptions

ORDER_FINDINGS = ("missed", "duplicate", "spurious", "late")
CHANNEL_FINDINGS = ("channel_missed", "channel_duplicate", "channel_spurious")


@dataclass
class AuditResult:
    orders: DataFrame      # one row per judged order / alert id, with its verdict
    channels: DataFrame    # one row per (channel, alert_id)
    findings: DataFrame    # one row per discrepancy
    alerts: DataFrame      # every alert publish (for the per-minute plot)
    gaps: list[tuple[int, int, str]]
    counts: dict[str, int]
    latency_ms: list[int]
    latency_kind: list[str]


def _in_window(col: F.Column, opts: AuditOptions) -> F.Column:
    cond = F.lit(True)
    if opts.since_ms is not None:
        cond = cond & (col >= F.lit(opts.since_ms))
    if opts.until_ms is not None:
        cond = cond & (col < F.lit(opts.until_ms))
    return cond


def run_audit(spark: SparkSession, opts: AuditOptions, step: Callable[[str], None] = lambda _: None) -> AuditResult:
    ttl_ms = int(opts.book_ttl_s * 1000)
    grace_ms = int(opts.grace_s * 1000)
    margin = ttl_ms + grace_ms + int(opts.delivery_grace_s * 1000)
    read_from = None if opts.since_ms is None else opts.since_ms - margin
    read_to = None if opts.until_ms is None else opts.until_ms + margin

    step("reading traces")
    tr = traces.read_traces(spark, opts.traces_dir, read_from, read_to).cache()
    end_ts = tr.agg(F.max("ts")).first()[0] or 0
    step("finding unaudited windows")
    gaps = gaps_mod.unaudited_windows(tr, read_from, read_to)

    step("decoding trade data (JSON, text form, batches, msgpack)")
    raw_events = wire.trade_events(tr, opts.max_message_bytes)
    events = meaning.distinct_events(raw_events).cache()
    step("applying CONTRACT §1 per order")
    books = meaning.books(events, ttl_ms).cache()

    pubs = wire.alert_publishes(tr).cache()
    pub_stats = pubs.groupBy("alert_id").agg(
        F.count("*").alias("publishes"), F.min("ts").alias("first_publish_ts"),
        F.first("kind", ignorenulls=True).alias("published_kind"),
        F.first("order_id", ignorenulls=True).alias("published_order_id"))
    expected = books.where(F.col("expected_kind").isNotNull()).select(
        F.concat_ws(":", "expected_kind", "order_id").alias("alert_id"), "expected_ts", "trigger_event",
        F.lit(True).alias("expected"))

    step("comparing expected and published alerts")
    joined = expected.join(pub_stats, "alert_id", "full_outer").withColumn(
        "order_id", F.coalesce(F.regexp_extract("alert_id", r"^[^:]+:(.*)$", 1), F.col("published_order_id")))
    per_order = joined.join(books.select("order_id", "first_ts", "close_ts", "edge_ms", "requested_shares",
                                         "purchased_shares", "late_events"), "order_id", "left")
    per_order = per_order.select(
        "*",
        F.coalesce("expected", F.lit(False)).alias("should_fire"),
        F.coalesce("publishes", F.lit(0)).alias("n_publishes"),
        (F.col("first_publish_ts") - F.col("expected_ts")).alias("latency_ms"),
        F.regexp_extract("alert_id", r"^([^:]+):", 1).alias("kind"),
    ).drop("expected", "publishes")
    start = F.coalesce(F.col("first_ts"), F.col("first_publish_ts") - F.lit(ttl_ms + grace_ms))
    # An over_purchase is settled once it fired; anything else can change until the book closes.
    settled = F.col("expected_ts").isNotNull() & (F.col("kind") == "over_purchase")
    stop = F.when(settled, F.greatest("expected_ts", F.coalesce("first_publish_ts", "expected_ts"))).otherwise(
        F.greatest(F.coalesce(F.col("close_ts"), F.col("first_publish_ts")),
                   F.coalesce(F.col("first_publish_ts"), F.lit(0)))) + F.lit(grace_ms)
    unaudited = gaps_mod.overlaps_any(start, stop, gaps)
    uncertain = F.coalesce(F.col("edge_ms") < F.lit(int(opts.ttl_tolerance_s * 1000)), F.lit(False))
    pending = F.col("should_fire") & (F.col("n_publishes") == 0) & (F.col("expected_ts") + F.lit(grace_ms) > F.lit(end_ts))
    missed = F.col("should_fire") & (F.col("n_publishes") == 0)
    spurious = ~F.col("should_fire") & (F.col("n_publishes") > 0)
    duplicate = F.col("n_publishes") > 1
    late = F.col("should_fire") & (F.col("latency_ms") > F.lit(int(opts.late_after_s * 1000)))
    per_order = per_order.where(_in_window(F.coalesce("first_ts", "first_publish_ts"), opts)).withColumn(
        "verdict",
        F.when(unaudited, "unaudited").when(uncertain, "uncertain").when(pending, "pending")
        .when(missed, "missed").when(spurious, "spurious").when(duplicate, "duplicate").when(late, "late")
        .otherwise("ok")).cache()
    judged = ~F.col("verdict").isin("unaudited", "uncertain", "pending")
    order_findings = per_order.where(judged).select(
        "alert_id", "order_id", F.lit(None).cast("string").alias("channel"),
        F.filter(F.array(*[F.when(c, F.lit(n)) for n, c in
                           (("missed", missed), ("spurious", spurious), ("duplicate", duplicate), ("late", late))]),
                 lambda x: x.isNotNull()).alias("kinds"),
        F.coalesce("first_publish_ts", "expected_ts").alias("ts"),
        F.col("n_publishes").alias("count"), "latency_ms")

    step("checking channel deliveries")
    deliveries = wire.channel_deliveries(tr)
    names = sorted(set(opts.channels) | {r[0] for r in deliveries.select("channel").distinct().collect()})
    per_channel, channel_findings = _channels(spark, pub_stats, deliveries, names, gaps, end_ts, opts)

    findings = order_findings.select("alert_id", "order_id", "channel", F.explode("kinds").alias("finding"),
                                     "ts", "count", "latency_ms").unionByName(channel_findings).cache()

    step("latency and counts")
    lat_rows = per_order.where(F.col("should_fire") & F.col("latency_ms").isNotNull() & judged) \
        .select("latency_ms", "kind").collect()
    # One pass per cached input: every action is a Spark job, and jobs cost more than rows here.
    t = tr.agg(F.sum(F.when(F.col("kind").isin("publish", "deliver"), 1).otherwise(0)).alias("records")).first()
    d = deliveries.agg(F.count("*").alias("n"), F.sum(F.when(F.col("redelivered"), 1).otherwise(0)).alias("r")).first()
    e = events.agg(F.count("*").alias("n"), F.sum("copies").alias("copies")).first()
    o = books.agg(F.count("*").alias("n"), F.count("expected_kind").alias("expected")).first()
    counts = {
        "trace_records": int(t["records"] or 0),
        "trade_events_decoded": int(e["copies"] or 0),
        "distinct_events": int(e["n"]),
        "orders": int(o["n"]),
        "alert_publishes": pubs.count(),
        "expected_alerts": int(o["expected"]),
        "channels": len(names),
        "channel_deliveries": int(d["n"]),
        "channel_redeliveries": int(d["r"] or 0),
    }
    verdicts = {r["verdict"]: r["count"] for r in per_order.groupBy("verdict").count().collect()}
    counts.update({f"verdict_{k}": v for k, v in verdicts.items()})
    by_kind = {r["finding"]: r["count"] for r in findings.groupBy("finding").count().collect()}
    for name in ORDER_FINDINGS + CHANNEL_FINDINGS:
        counts[name] = int(by_kind.get(name, 0))
    return AuditResult(per_order, per_channel, findings, pubs, gaps, counts,
                       [r[0] for r in lat_rows], [r[1] for r in lat_rows])


def _channels(spark: SparkSession, pub_stats: DataFrame, deliveries: DataFrame, names: list[str],
              gaps: list[tuple[int, int, str]], end_ts: int, opts: AuditOptions) -> tuple[DataFrame, DataFrame]:
    """Every published alert once per channel: first deliveries (redelivered=false) must be
    exactly one; broker redeliveries after a consumer crash are counted, not findings."""
    grace_ms = int(opts.delivery_grace_s * 1000)
    chans = spark.createDataFrame([(n,) for n in names], "channel string")
    dstats = deliveries.groupBy("channel", "alert_id").agg(
        F.sum(F.when(~F.col("redelivered"), 1).otherwise(0)).alias("first_deliveries"),
        F.sum(F.when(F.col("redelivered"), 1).otherwise(0)).alias("redeliveries"),
        F.min("ts").alias("first_delivery_ts"))
    wanted = pub_stats.select("alert_id", "first_publish_ts").crossJoin(chans)
    per = wanted.join(dstats, ["channel", "alert_id"], "full_outer").fillna(
        {"first_deliveries": 0, "redeliveries": 0})
    published = F.col("first_publish_ts").isNotNull()
    at = F.coalesce("first_publish_ts", "first_delivery_ts")
    unaudited = gaps_mod.overlaps_any(at, at + F.lit(grace_ms), gaps)
    pending = published & (F.col("first_deliveries") + F.col("redeliveries") == 0) & (
        F.col("first_publish_ts") + F.lit(grace_ms) > F.lit(end_ts))
    missed = published & (F.col("first_deliveries") + F.col("redeliveries") == 0)
    duplicate = F.col("first_deliveries") > 1
    spurious = ~published
    per = per.where(_in_window(at, opts)).withColumn(
        "verdict", F.when(unaudited, "unaudited").when(pending, "pending").when(missed, "channel_missed")
        .when(spurious, "channel_spurious").when(duplicate, "channel_duplicate").otherwise("ok")).cache()
    judged = ~F.col("verdict").isin("unaudited", "pending")
    kinds = F.filter(F.array(F.when(missed, F.lit("channel_missed")), F.when(spurious, F.lit("channel_spurious")),
                             F.when(duplicate, F.lit("channel_duplicate"))), lambda x: x.isNotNull())
    findings = per.where(judged).select(
        "alert_id", F.regexp_extract("alert_id", r"^[^:]+:(.*)$", 1).alias("order_id"), "channel",
        F.explode(kinds).alias("finding"), at.alias("ts"),
        (F.col("first_deliveries") + F.col("redeliveries")).cast("long").alias("count"),
        F.lit(None).cast("long").alias("latency_ms"))
    return per, findings
