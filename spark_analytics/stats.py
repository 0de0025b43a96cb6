"""The audit's numbers per deployment: records, junk, events, verdicts, findings, latency.

Each function is one or two Spark jobs over cached frames: jobs cost more than rows here.
"""

from __future__ import annotations

import math
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_analytics.in_doubt import InDoubtList

FINDINGS = ("missed", "duplicate", "spurious", "late", "channel_missed", "channel_duplicate", "channel_spurious")
# Not a discrepancy: an alert never taken from a channel's queue that the operator's in-doubt
# list holds (an interrupted at-most-once send, settled by the operator). Its own row.
IN_DOUBT = "channel_in_doubt"
# What findings.parquet and the per-kind counts hold: the discrepancies, then the in-doubt.
KINDS = (*FINDINGS, IN_DOUBT)
# With `--in-doubt`: the list's entries for the deployment, and those the traces show taken
# from the channel's queue anyway (delivered as far as the broker can tell: no finding).
IN_DOUBT_COUNTS = ("in_doubt_listed", "in_doubt_delivered")

# Junk in trade bodies: counted by the per-order pass, where the bodies are decoded (`walk_counts`).
WALK_JUNK = ("trade_not_base64", "trade_not_utf8", "trade_oversize", "trade_unreadable", "trade_elements_rejected")
# What the pipeline dead-letters (or never sent) and the audit skips, counted per deployment.
JUNK = (*WALK_JUNK, "alert_unreadable", "delivery_unreadable")
# What "junk skipped" adds up: each skipped message or element once (the other JUNK counts are reasons).
JUNK_TOTAL = ("trade_unreadable", "trade_elements_rejected", "alert_unreadable", "delivery_unreadable")
RECORD_COUNTS = ("trace_records", "trade_messages", "msgpack_messages", "alert_messages", "channel_deliveries",
                 "channel_redeliveries",
                 "trace_rerecorded", *JUNK)


def _sum(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0))


def _size(arr: Column) -> Column:
    return F.when(arr.isNull(), F.lit(0)).otherwise(F.size(arr))


def empty_counts() -> dict[str, int]:
    return {name: 0 for name in RECORD_COUNTS}


def record_counts(msgs: DataFrame) -> tuple[dict[str, dict[str, int]], int]:
    """Per vhost: records of each kind, junk, the last trace time (`last_ts`, counting the
    heartbeats every deployment shares); and the number of corrupt lines. What only a trade
    body tells (`WALK_JUNK`: decoded and split in the Python workers) the per-order pass
    counts: `walk_counts`. `msgpack_messages`: trade messages whose content type is msgpack."""
    kind = F.col("kind")
    trade, alert, delivery = kind == "trade", kind == "alert", kind == "delivery"
    aggs = {
        "trace_records": _sum(kind.isin("trade", "alert", "delivery", "publish", "deliver")),
        "trade_messages": _sum(trade), "alert_messages": _sum(alert),
        "msgpack_messages": _sum(trade & F.col("msgpack")),
        "channel_deliveries": F.sum(F.when(delivery, _size(F.col("alerts"))).otherwise(0)),
        "channel_redeliveries": F.sum(F.when(delivery & F.col("redelivered"), _size(F.col("alerts"))).otherwise(0)),
        "trace_rerecorded": _sum(F.coalesce(F.col("trace_redelivered"), F.lit(False))),
        "alert_unreadable": _sum(alert & (F.col("alert_unreadable") | (_size(F.col("alerts")) == 0))),
        "delivery_unreadable": _sum(delivery & (F.col("alert_unreadable") | (_size(F.col("alerts")) == 0))),
        "last_ts": F.max(F.when(kind != "corrupt", F.col("ts"))),
        "trade_bytes": F.sum(F.when(trade, F.octet_length("b64") * 3 / 4)).cast("long"),
        "corrupt": _sum(kind == "corrupt"),
    }
    rows = msgs.groupBy("vhost").agg(*[agg.alias(name) for name, agg in aggs.items()]).collect()
    out: dict[str, dict[str, int]] = {}
    corrupt = shared_last = 0
    for r in rows:
        corrupt += int(r["corrupt"] or 0)
        if r["vhost"] is None:  # unreadable lines, and heartbeats/gaps of every deployment
            shared_last = int(r["last_ts"] or 0)
            continue
        out[r["vhost"]] = {name: int(r[name] or 0) for name in aggs if name != "corrupt"}
        out[r["vhost"]].update(dict.fromkeys(WALK_JUNK, 0))
    for c in out.values():
        c["last_ts"] = max(c["last_ts"], shared_last)
    return out, corrupt


def walk_counts(walked: DataFrame) -> dict[str, dict[str, int]]:
    """Per vhost, what the per-order pass counted (`meaning.books_and_judged`): events, orders,
    expected alerts and alert publishes, and the trade elements that are not events
    (`deferred`: bodies left to Spark's parser, see `records.elements`). One Spark job."""
    names = {"trade_events_decoded": "copies", "distinct_events": "events", "orders": "orders",
             "expected_alerts": "expected_alerts", "alert_publishes": "publishes", "trade_unreadable": "unreadable",
             "trade_elements_rejected": "rejected", "deferred": "deferred", "trade_not_base64": "not_base64",
             "trade_oversize": "oversize", "trade_not_utf8": "not_utf8"}
    sums = walked.groupBy("vhost").agg(*[F.sum(col).alias(name) for name, col in names.items()])
    return {r["vhost"]: {name: int(r[name] or 0) for name in names} for r in sums.collect()}


def add_walk_counts(counts: dict[str, dict[str, int]], walked: dict[str, dict[str, int]]) -> None:
    """`walk_counts` added to the record counts (which count unreadable trade messages too)."""
    for vhost, found in walked.items():
        c = counts.setdefault(vhost, empty_counts())
        for name, n in found.items():
            if name != "deferred":
                c[name] = c.get(name, 0) + n


def judged_counts(base: dict[str, dict[str, int]], per_order: DataFrame, per_channel: DataFrame,
                  findings: DataFrame, channels: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """`base` (record and walk counts) plus verdicts and findings per vhost."""
    counts = {v: dict(c) for v, c in base.items()}
    for r in per_order.groupBy("vhost", "verdict").count().collect():
        counts[r["vhost"]][f"verdict_{r['verdict']}"] = int(r["count"])
    for r in per_channel.where(F.col("verdict") != "ok").groupBy("vhost", "verdict").count().collect():
        counts[r["vhost"]][f"channel_verdict_{r['verdict']}"] = int(r["count"])
    by_kind = {(r["vhost"], r["finding"]): int(r["count"])
               for r in findings.groupBy("vhost", "finding").count().collect()}
    for v, c in counts.items():
        for key in ("trade_events_decoded", "distinct_events", "orders", "expected_alerts", "alert_publishes"):
            c.setdefault(key, 0)
        c["channels"] = len(channels.get(v, []))
        for name in KINDS:
            c[name] = by_kind.get((v, name), 0)
    return counts


def in_doubt_counts(counts: dict[str, dict[str, int]], per_channel: DataFrame, listed: InDoubtList) -> None:
    """Add `IN_DOUBT_COUNTS` per vhost: listed entries, and judged ones the traces show delivered."""
    judged = ~F.col("verdict").isin("unaudited", "pending")
    delivered = F.col("first_deliveries") + F.col("redeliveries") > 0
    rows = per_channel.where(F.col("in_doubt") & judged & delivered).groupBy("vhost").count().collect() \
        if listed.entries else []
    by_vhost = {r["vhost"]: int(r["count"]) for r in rows}
    for v, c in counts.items():
        c["in_doubt_listed"] = listed.listed(v)
        c["in_doubt_delivered"] = by_vhost.get(v, 0)


def totals(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """The deployments' counts added up (every count is additive)."""
    out: dict[str, int] = {}
    for c in counts.values():
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


_PCT = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def latency(per_order: DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Detection latency of judged alerts: count, p50/p95/p99 (nearest rank: a latency that
    happened, as Spark's `percentile_disc`), max; per vhost and kind, with "all" for every vhost
    or kind. One Spark job counts each (vhost, kind, latency in ms); the percentiles are read off
    those counts here: a night's alerts are never collected into one task to be sorted."""
    judged = per_order.where(F.col("should_fire") & F.col("latency_ms").isNotNull()
                             & ~F.col("verdict").isin("unaudited", "uncertain", "pending"))
    groups: dict[tuple[str, str], dict[int, int]] = {}
    for r in judged.groupBy("vhost", "kind", "latency_ms").count().collect():
        for key in ((r["vhost"], r["kind"]), (r["vhost"], "all"), ("all", r["kind"]), ("all", "all")):
            found = groups.setdefault(key, {})
            found[r["latency_ms"]] = found.get(r["latency_ms"], 0) + int(r["count"])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (vhost, kind), found in groups.items():
        stats = _nearest_ranks(found)
        if vhost != "all" or kind != "all":
            del stats["min"]  # the histogram's range: kept for every vhost and kind only
        out.setdefault(vhost, {})[kind] = stats
    return out


def _nearest_ranks(counts: dict[int, int]) -> dict[str, Any]:
    """count, p50/p95/p99 (the value at rank ceil(q * n) of the sorted values), min and max."""
    values = sorted(counts)
    n = sum(counts.values())
    ranks = {name: max(1, math.ceil(q * n)) for name, q in _PCT.items()}
    out: dict[str, Any] = {"count": n}
    seen = 0
    for value in values:
        seen += counts[value]
        for name, rank in ranks.items():
            if name not in out and seen >= rank:
                out[name] = float(value)
    out["max"], out["min"] = float(values[-1]), float(values[0])
    return out


def histogram(per_order: DataFrame, low: float | None, high: float | None,
              bins: int = 60) -> list[tuple[float, float, int]]:
    """(low, high, alerts) bins of judged detection latency in [low, high], computed in Spark."""
    if low is None or high is None:
        return []
    judged = per_order.where(F.col("should_fire") & F.col("latency_ms").isNotNull()
                             & ~F.col("verdict").isin("unaudited", "uncertain", "pending"))
    width = max(1.0, (high - low) / bins)
    bucket = F.least(F.floor((F.col("latency_ms") - F.lit(low)) / F.lit(width)), F.lit(bins - 1))
    rows = judged.groupBy(bucket.alias("b")).count().collect()
    return sorted((low + r["b"] * width, low + (r["b"] + 1) * width, int(r["count"])) for r in rows)
