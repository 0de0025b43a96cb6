"""The audit: expected alerts (CONTRACT §1) against what the firehose saw, per deployment.

Findings, one row each: `missed`, `duplicate`, `spurious`, `late` per alert/order;
`channel_missed`, `channel_duplicate`, `channel_spurious` per channel, and `channel_in_doubt`
(not a discrepancy: a channel_missed the operator's in-doubt list, `--in-doubt`, accounts
for; the operator settles it). Orders whose
window touches an unaudited window get the verdict `unaudited` instead of a finding;
orders with an event within `ttl_tolerance` of their book's close are `uncertain`
(trace times and the pipeline's clock may disagree by that much); alerts still inside
their grace period at the end of the traces are `pending`. Every key includes the
deployment (`vhost`): one deployment's alerts are never judged against another's orders.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_analytics import gaps as gaps_mod
from spark_analytics import meaning, order_shuffle, records, stats, traces
from spark_analytics.in_doubt import InDoubtList
from spark_analytics.in_doubt import read as read_in_doubt
from spark_analytics.options import AuditOptions

ORDER_FINDINGS = ("missed", "duplicate", "spurious", "late")
CHANNEL_FINDINGS = ("channel_missed", "channel_duplicate", "channel_spurious", stats.IN_DOUBT)
Step = Callable[[str], None]


class TornFile(TypedDict):
    """A gzip part file that breaks off before its end (a recorder killed mid-write)."""

    file: str
    bytes_read: int
    bytes_lost: int


class FilesInfo(TypedDict, total=False):
    """Damage no deployment owns, and how many part files were read."""

    part_files: int
    corrupt_lines: int
    torn_files: list[TornFile]


@dataclass
class AuditResult:
    orders: DataFrame      # one row per judged (vhost, alert id), with its verdict
    channels: DataFrame    # one row per (vhost, channel, alert_id)
    findings: DataFrame    # one row per discrepancy
    alerts: DataFrame      # every alert publish (for the per-minute plot)
    vhosts: list[str]
    gaps: dict[str, list[gaps_mod.Window]]
    counts: dict[str, dict[str, int]]             # per vhost
    files: FilesInfo = field(default_factory=FilesInfo)   # damage no deployment owns
    latency: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # vhost or "all" -> kind -> stats
    in_doubt: InDoubtList | None = None    # the operator's list, when `--in-doubt` named one


@dataclass
class _Input:
    slim: DataFrame
    vhosts: list[str]
    end_ts: dict[str, int]
    counts: dict[str, dict[str, int]]
    files: FilesInfo
    trade_bytes: int  # of trade bodies (as their base64 tells): how finely the walk's shuffle cuts them


def _in_window(col: Column, opts: AuditOptions) -> Column:
    cond = F.lit(True)
    if opts.since_ms is not None:
        cond = cond & (col >= F.lit(opts.since_ms))
    if opts.until_ms is not None:
        cond = cond & (col < F.lit(opts.until_ms))
    return cond


def _per_vhost(vhost: Column, values: dict[str, int], default: int = 0) -> Column:
    out = F.lit(default)
    for v, value in values.items():
        out = F.when(vhost == F.lit(v), F.lit(value)).otherwise(out)
    return out


def _read(spark: SparkSession, opts: AuditOptions, files: list[str], span: tuple[int | None, int | None],
          damaged: bool) -> tuple[DataFrame, dict[str, dict[str, int]], int]:
    """The cached record frame, its counts and corrupt lines (see `traces.read_raw` for `damaged`)."""
    slim = records.decode(traces.read_raw(spark, files, *span, damaged=damaged))
    if opts.vhosts:
        slim = slim.where(F.col("vhost").isin(*opts.vhosts) | F.col("vhost").isNull())
    slim = slim.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts, corrupt = stats.record_counts(slim)   # the action that fills the cache
    except Exception:
        slim.unpersist()
        raise
    return slim, counts, corrupt


def read_span(opts: AuditOptions) -> tuple[int | None, int | None]:
    """The judged window widened by how long an order's events, alerts and deliveries can trail it."""
    margin = int((opts.book_ttl_s + opts.grace_s + opts.delivery_grace_s) * 1000)
    return (None if opts.since_ms is None else opts.since_ms - margin,
            None if opts.until_ms is None else opts.until_ms + margin)


def input_bytes(opts: AuditOptions) -> int:
    """The compressed size of the part files the audit reads (before Spark starts: it picks the JIT)."""
    total = 0
    for name in traces.part_files(opts.traces_dir, *read_span(opts)):
        with suppress(OSError):  # a file gone since the listing is the read's business, not this sum's
            total += Path(name).stat().st_size
    return total


def _load(spark: SparkSession, opts: AuditOptions, step: Step) -> _Input:
    """Read and decode every trace line once (cached), count damage, name the deployments."""
    span = read_span(opts)
    files = traces.part_files(opts.traces_dir, *span)
    step(f"reading and decoding {len(files)} part files (JSON, text form, batches, msgpack)")
    torn: list[tuple[str, int, int]] = []
    try:
        with traces.quiet(spark):
            slim, counts, corrupt = _read(spark, opts, files, span, damaged=False)
    except Exception as exc:  # anything but damage is raised again
        if not traces.is_damaged_read(exc):
            raise
        step("a part file's gzip stream breaks off: reading up to the damage, checking every file's tail")
        slim, counts, corrupt = _read(spark, opts, files, span, damaged=True)
        torn = traces.torn_tails(spark, files)
    if any(c["trace_rerecorded"] for c in counts.values()):
        step("dropping records re-recorded after a recorder crash")
        deduped = traces.drop_rerecorded(slim).persist(StorageLevel.MEMORY_AND_DISK)
        counts, corrupt = stats.record_counts(deduped)
        slim.unpersist()
        slim = deduped
    vhosts = sorted(set(counts) | set(opts.vhosts)) or []
    end_ts = {v: c.pop("last_ts", 0) or 0 for v, c in counts.items()}
    trade_bytes = sum(c.pop("trade_bytes", 0) or 0 for c in counts.values())
    for v in vhosts:
        counts.setdefault(v, stats.empty_counts())
    files_info = FilesInfo(part_files=len(files), corrupt_lines=corrupt,
                           torn_files=[TornFile(file=f, bytes_read=good, bytes_lost=size - good)
                                       for f, good, size in torn])
    return _Input(slim, vhosts, end_ts, counts, files_info, trade_bytes)


def run_audit(spark: SparkSession, opts: AuditOptions, step: Step = lambda _: None,
              in_doubt: InDoubtList | None = None) -> AuditResult:
    """Every deployment in the traces (or `opts.vhosts`) judged on its own; see the module docstring.
    `in_doubt`: the list `opts.in_doubt_files` name, when the caller has read it already."""
    if in_doubt is None and opts.in_doubt_files:
        in_doubt = read_in_doubt(opts.in_doubt_files)
    inp = _load(spark, opts, step)
    step("finding unaudited windows")
    gaps = gaps_mod.unaudited_windows(inp.slim, inp.vhosts, opts.since_ms, opts.until_ms)
    step("applying CONTRACT §1 per order")
    pubs = records.alert_publishes(inp.slim)
    alerts = _walk(inp, pubs, opts, step)
    pub_stats = alerts.where(F.col("publishes") > 0)
    step("comparing expected and published alerts")
    per_order, order_findings = _orders(alerts, gaps, inp.end_ts, opts)
    step("checking channel deliveries")
    deliveries = records.channel_deliveries(inp.slim)
    seen = {(r["vhost"], r["channel"]) for r in deliveries.select("vhost", "channel").distinct().collect()}
    names = {v: sorted(set(opts.channels) | {c for vv, c in seen if vv == v}) for v in inp.vhosts}
    listed = _listed(spark, in_doubt, inp.vhosts)
    per_channel, channel_findings = _channels(spark, pub_stats, deliveries, names, gaps, inp.end_ts, opts, listed)
    # Counted here, then written and sampled for the report: computed once.
    findings = order_findings.unionByName(channel_findings).persist(StorageLevel.MEMORY_AND_DISK)
    step("latency and counts")
    counts = stats.judged_counts(inp.counts, per_order, per_channel, findings, names)
    if in_doubt is not None:
        stats.in_doubt_counts(counts, per_channel, in_doubt)
    latency = stats.latency(per_order)
    return AuditResult(per_order, per_channel, findings, pubs, inp.vhosts, gaps, counts, inp.files, latency,
                       in_doubt)


def _walk(inp: _Input, pubs: DataFrame, opts: AuditOptions, step: Step) -> DataFrame:
    """CONTRACT §1 per order and the alerts expected or published (cached: `published.JUDGED_SCHEMA`
    rows with an alert id); what the walk counted goes into `inp.counts`. Trade bodies are split
    in the Python workers; when some need Spark's own parser (`bodies`), the walk runs again
    with it, so those are read exactly as before."""
    ttl_ms = int(opts.book_ttl_s * 1000)
    buckets = order_shuffle.bucket_count(inp.trade_bytes)
    size = opts.max_message_bytes
    walked = meaning.books_and_judged(records.element_blobs(inp.slim, buckets, size), pubs, ttl_ms, buckets)
    walked = walked.persist(StorageLevel.MEMORY_AND_DISK)
    counted = stats.walk_counts(walked)  # the action that walks
    if any(c["deferred"] for c in counted.values()):
        step("reading bodies that are not strict JSON with Spark's parser")
        walked.unpersist()
        walked = meaning.books_and_judged(records.element_blobs(inp.slim, buckets, size, spark_parser=True), pubs,
                                          ttl_ms, buckets)
        walked = walked.persist(StorageLevel.MEMORY_AND_DISK)
        counted = stats.walk_counts(walked)
    stats.add_walk_counts(inp.counts, counted)
    return walked.where(F.col("alert_id").isNotNull())


def _listed(spark: SparkSession, in_doubt: InDoubtList | None, vhosts: list[str]) -> DataFrame | None:
    """The in-doubt entries of the judged deployments, one row per (vhost, channel, alert_id)."""
    rows = sorted(e for e in (in_doubt.entries if in_doubt else ()) if e[0] in vhosts)
    if not rows:
        return None
    return spark.createDataFrame(rows, "vhost string, channel string, alert_id string").withColumn(
        "in_doubt", F.lit(True))


def _orders(alerts: DataFrame, gaps: dict[str, list[gaps_mod.Window]], end_ts: dict[str, int],
            opts: AuditOptions) -> tuple[DataFrame, DataFrame]:
    """One row per (vhost, alert id) expected or published, with its verdict; and the findings.
    (`alerts`: the walk's, each with its order's book; `published.judged`.)"""
    ttl_ms, grace_ms = int(opts.book_ttl_s * 1000), int(opts.grace_s * 1000)
    per = alerts.select("vhost", "order_id", "alert_id", "expected_ts", "trigger_event", "first_publish_ts",
                        "published_kind", "published_order_id", "first_ts", "close_ts", "edge_ms", "requested_shares",
                        "purchased_shares", "late_events", "expected", "publishes")
    per = per.select(
        "*", F.coalesce("expected", F.lit(False)).alias("should_fire"),
        F.coalesce("publishes", F.lit(0)).alias("n_publishes"),
        (F.col("first_publish_ts") - F.col("expected_ts")).alias("latency_ms"),
        F.regexp_extract("alert_id", r"^([^:]+):", 1).alias("kind")).drop("expected", "publishes")
    start = F.coalesce(F.col("first_ts"), F.col("first_publish_ts") - F.lit(ttl_ms + grace_ms))
    # An over_purchase is settled once it fired; anything else can change until the book closes.
    settled = F.col("expected_ts").isNotNull() & (F.col("kind") == "over_purchase")
    stop = F.when(settled, F.greatest("expected_ts", F.coalesce("first_publish_ts", "expected_ts"))).otherwise(
        F.greatest(F.coalesce(F.col("close_ts"), F.col("first_publish_ts")),
                   F.coalesce(F.col("first_publish_ts"), F.lit(0)))) + F.lit(grace_ms)
    unaudited = gaps_mod.overlaps_any(F.col("vhost"), start, stop, gaps)
    uncertain = F.coalesce(F.col("edge_ms") < F.lit(int(opts.ttl_tolerance_s * 1000)), F.lit(False))
    missed = F.col("should_fire") & (F.col("n_publishes") == 0)
    pending = missed & (F.col("expected_ts") + F.lit(grace_ms) > _per_vhost(F.col("vhost"), end_ts))
    spurious = ~F.col("should_fire") & (F.col("n_publishes") > 0)
    duplicate = F.col("n_publishes") > 1
    late = F.col("should_fire") & (F.col("latency_ms") > F.lit(int(opts.late_after_s * 1000)))
    per = per.where(_in_window(F.coalesce("first_ts", "first_publish_ts"), opts)).withColumn(
        "verdict",
        F.when(unaudited, "unaudited").when(uncertain, "uncertain").when(pending, "pending")
        .when(missed, "missed").when(spurious, "spurious").when(duplicate, "duplicate").when(late, "late")
        .otherwise("ok")).persist(StorageLevel.MEMORY_AND_DISK)
    judged = ~F.col("verdict").isin("unaudited", "uncertain", "pending")
    kinds = F.array(*[F.when(c, F.lit(n)) for n, c in
                      (("missed", missed), ("spurious", spurious), ("duplicate", duplicate), ("late", late))])
    findings = per.where(judged).select(
        "vhost", "alert_id", "order_id", F.lit(None).cast("string").alias("channel"), F.explode(kinds).alias("finding"),
        F.coalesce("first_publish_ts", "expected_ts").alias("ts"), F.col("n_publishes").alias("count"), "latency_ms")
    return per, findings.where(F.col("finding").isNotNull())  # (a lambda filter would not be compiled)


def _channels(spark: SparkSession, pub_stats: DataFrame, deliveries: DataFrame, names: dict[str, list[str]],
              gaps: dict[str, list[gaps_mod.Window]], end_ts: dict[str, int],
              opts: AuditOptions, listed: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:
    """Every published alert once per channel of its deployment: first deliveries
    (redelivered=false) must be exactly one; broker redeliveries after a consumer crash are
    counted, not findings. An at-most-once channel keeps its in-doubt attempts in Redis, not
    in traces: a published alert never delivered that the operator's list (`listed`) holds for
    that deployment and channel is `channel_in_doubt`, else `channel_missed`."""
    grace_ms = int(opts.delivery_grace_s * 1000)
    chans = spark.createDataFrame([(v, n) for v, ns in names.items() for n in ns], "vhost string, channel string")
    # Every published alert once per channel, and every delivery, grouped by (vhost, channel, alert):
    # one aggregation (partial sums before the shuffle) instead of a full outer join of the two.
    wanted = pub_stats.select("vhost", "alert_id", "first_publish_ts").join(F.broadcast(chans), "vhost").select(
        "vhost", "channel", "alert_id", "first_publish_ts", F.lit(None).cast("boolean").alias("redelivered"),
        F.lit(None).cast("long").alias("ts"))
    got = deliveries.select("vhost", "channel", "alert_id", F.lit(None).cast("long").alias("first_publish_ts"),
                            "redelivered", "ts")
    per = wanted.unionByName(got).groupBy("vhost", "channel", "alert_id").agg(
        F.min("first_publish_ts").alias("first_publish_ts"),
        F.sum(F.when(~F.col("redelivered"), 1).otherwise(0)).alias("first_deliveries"),
        F.sum(F.when(F.col("redelivered"), 1).otherwise(0)).alias("redeliveries"),
        F.min("ts").alias("first_delivery_ts"))
    per = (per.join(F.broadcast(listed), ["vhost", "channel", "alert_id"], "left").fillna({"in_doubt": False})
           if listed is not None else per.withColumn("in_doubt", F.lit(False)))
    published = F.col("first_publish_ts").isNotNull()
    at = F.coalesce("first_publish_ts", "first_delivery_ts")
    unaudited = gaps_mod.overlaps_any(F.col("vhost"), at, at + F.lit(grace_ms), gaps)
    none = F.col("first_deliveries") + F.col("redeliveries") == 0
    pending = published & none & (F.col("first_publish_ts") + F.lit(grace_ms) > _per_vhost(F.col("vhost"), end_ts))
    in_doubt = published & none & F.col("in_doubt")
    missed = published & none & ~F.col("in_doubt")
    duplicate = F.col("first_deliveries") > 1
    spurious = ~published
    per = per.where(_in_window(at, opts)).withColumn(
        "verdict", F.when(unaudited, "unaudited").when(pending, "pending").when(in_doubt, stats.IN_DOUBT)
        .when(missed, "channel_missed").when(spurious, "channel_spurious").when(duplicate, "channel_duplicate")
        .otherwise("ok")).persist(StorageLevel.MEMORY_AND_DISK)
    judged = ~F.col("verdict").isin("unaudited", "pending")
    kinds = F.array(F.when(missed, F.lit("channel_missed")), F.when(spurious, F.lit("channel_spurious")),
                    F.when(duplicate, F.lit("channel_duplicate")), F.when(in_doubt, F.lit(stats.IN_DOUBT)))
    findings = per.where(judged).select(
        "vhost", "alert_id", F.regexp_extract("alert_id", r"^[^:]+:(.*)$", 1).alias("order_id"), "channel",
        F.explode(kinds).alias("finding"), at.alias("ts"),
        (F.col("first_deliveries") + F.col("redeliveries")).cast("long").alias("count"),
        F.lit(None).cast("long").alias("latency_ms"))
    return per, findings.where(F.col("finding").isNotNull())
