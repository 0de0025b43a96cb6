"""The audit's outputs: Parquet tables, a JSON summary, one self-contained HTML page.

The summary holds totals (`counts`, `latency_ms`, `unaudited_windows`: every deployment
together) and one section per deployment (`deployments`). Verdicts, worst first:
`discrepancies`, `unaudited`, `in_doubt` (no discrepancy, but alerts the operator has to
settle), `clean`. The HTML page is ordered as an
operator reads it: verdict, counts per deployment and the plots, then the findings by kind
(the first rows of each; all of them are in findings.parquet), then the details.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, overload

from pyspark.sql import Window
from pyspark.sql import functions as F

from spark_analytics import report_html, stats
from spark_analytics.audit import AuditResult
from spark_analytics.options import AuditOptions

EMPTY_LATENCY = {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}


@overload
def iso(ms: int) -> str: ...


@overload
def iso(ms: None) -> None: ...


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC; None stays None (an open end of the window)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _windows(spans: list[tuple[int, int, str]], vhost: str | None = None) -> list[dict[str, Any]]:
    return [{**({"vhost": vhost} if vhost is not None else {}), "start": iso(s), "end": iso(e),
             "seconds": round((e - s) / 1000, 3), "reason": r} for s, e, r in spans]


def _verdict(discrepancies: int, gaps: Sequence[object], in_doubt: int = 0) -> str:
    """Worst first. `in_doubt` is no discrepancy (the channel kept its at-most-once promise) but
    no all-clear either: the operator still has to settle those alerts (docs/audit.md)."""
    if discrepancies:
        return "discrepancies"
    if gaps:
        return "unaudited"
    return "in_doubt" if in_doubt else "clean"


def _deployment(result: AuditResult, vhost: str) -> dict[str, Any]:
    c = result.counts[vhost]
    discrepancies = sum(c[k] for k in stats.FINDINGS)
    gaps = result.gaps.get(vhost, [])
    in_doubt = c.get(stats.IN_DOUBT, 0)
    return {"verdict": _verdict(discrepancies, gaps, in_doubt), "discrepancies": discrepancies,
            "in_doubt": in_doubt, "counts": c,
            "latency_ms": result.latency.get(vhost, {"all": dict(EMPTY_LATENCY)}),
            "unaudited_windows": _windows(gaps)}


def summary(result: AuditResult, opts: AuditOptions, seconds: float) -> dict[str, Any]:
    """Totals first (what the exit status and the nightly unit go by), then per deployment."""
    deployments = {v: _deployment(result, v) for v in result.vhosts}
    counts = stats.totals(result.counts)
    for name in ("trace_records", "trade_events_decoded", "distinct_events", "orders", "alert_publishes",
                 "expected_alerts", "channel_deliveries", "channel_redeliveries", *stats.KINDS,
                 *(stats.IN_DOUBT_COUNTS if result.in_doubt is not None else ())):
        counts.setdefault(name, 0)
    torn = result.files.get("torn_files", [])
    counts["corrupt_lines"] = int(result.files.get("corrupt_lines", 0))
    counts["torn_files"] = len(torn)
    windows = sorted((w for v in result.vhosts for w in _windows(result.gaps.get(v, []), v)),
                     key=lambda w: (w["start"], w["vhost"]))
    if not result.vhosts and opts.since_ms is not None and opts.until_ms is not None:
        windows = _windows([(opts.since_ms, opts.until_ms, "no traces")], "")
    discrepancies = sum(counts[k] for k in stats.FINDINGS)
    listed = result.in_doubt
    return {
        "verdict": _verdict(discrepancies, windows, counts[stats.IN_DOUBT]),
        "discrepancies": discrepancies,
        "in_doubt": counts[stats.IN_DOUBT],
        "window": {"since": iso(opts.since_ms), "until": iso(opts.until_ms)},
        "options": {"book_ttl_s": opts.book_ttl_s, "grace_s": opts.grace_s, "late_after_s": opts.late_after_s,
                    "delivery_grace_s": opts.delivery_grace_s, "ttl_tolerance_s": opts.ttl_tolerance_s,
                    "vhosts": list(opts.vhosts), "in_doubt_files": list(opts.in_doubt_files)},
        # None: no list was given, so an interrupted at-most-once send is still `channel_missed`.
        "in_doubt_list": None if listed is None else {
            "files": listed.files, "entries": len(listed.entries), "unreadable_lines": listed.unreadable_lines},
        "counts": counts,
        "latency_ms": result.latency.get("all", {"all": dict(EMPTY_LATENCY)}),
        "unaudited_windows": windows,
        "damaged_files": torn,
        "deployments": deployments,
        "audit_seconds": round(seconds, 2),
    }


def first_findings(result: AuditResult, per_kind: int) -> list[dict[str, Any]]:
    """The first `per_kind` findings of each (vhost, kind), in time order (one small job)."""
    w = Window.partitionBy("vhost", "finding").orderBy("ts", "alert_id", "channel")
    rows = (result.findings.withColumn("_n", F.row_number().over(w)).where(F.col("_n") <= per_kind)
            .drop("_n").collect())
    return sorted((r.asDict() for r in rows), key=lambda f: (f["vhost"], f["finding"], f["ts"] or 0))


def write_outputs(result: AuditResult, info: dict[str, Any], out_dir: str, per_kind: int = 20) -> dict[str, str]:
    """Parquet tables, summary.json and report.html under `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, df in (("orders", result.orders), ("channels", result.channels), ("findings", result.findings)):
        target = out / f"{name}.parquet"
        df.write.mode("overwrite").parquet(str(target))
        paths[name] = str(target)
    (out / "summary.json").write_text(json.dumps(info, indent=2))
    paths["summary"] = str(out / "summary.json")
    per_minute = [(r["vhost"], r["minute"], r["count"]) for r in result.alerts.select(
        "vhost", (F.floor(F.col("ts") / 60000) * 60000).cast("long").alias("minute"))
        .groupBy("vhost", "minute").count().orderBy("minute").collect()]
    overall = result.latency.get("all", {}).get("all", {})
    bins = stats.histogram(result.orders, overall.get("min"), overall.get("max"))
    page = report_html.render(info, first_findings(result, per_kind), bins, per_minute, per_kind)
    (out / "report.html").write_text(page)
    paths["report"] = str(out / "report.html")
    return paths
