"""The audit's outputs: Parquet tables, a JSON summary, one self-contained HTML page.

The HTML embeds its plots as base64 PNGs so it can be mailed or archived as one file.
"""

from __future__ import annotations

import base64
import html
import io
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_analytics.audit import CHANNEL_FINDINGS, ORDER_FINDINGS, AuditResult
from spark_analytics.options import AuditOptions


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def percentiles(values: list[int]) -> dict[str, float | None]:
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:  # nearest-rank: a latency that actually happened
        return float(ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))])
    return {"count": len(ordered), "p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": float(ordered[-1])}


def summary(result: AuditResult, opts: AuditOptions, seconds: float) -> dict[str, Any]:
    discrepancies = sum(result.counts[k] for k in ORDER_FINDINGS + CHANNEL_FINDINGS)
    verdict = "discrepancies" if discrepancies else ("unaudited" if result.gaps else "clean")
    by_kind = {k: percentiles([v for v, kk in zip(result.latency_ms, result.latency_kind) if kk == k])
               for k in sorted(set(result.latency_kind))}
    return {
        "verdict": verdict,
        "discrepancies": discrepancies,
        "window": {"since": iso(opts.since_ms), "until": iso(opts.until_ms)},
        "options": {"book_ttl_s": opts.book_ttl_s, "grace_s": opts.grace_s, "late_after_s": opts.late_after_s,
                    "delivery_grace_s": opts.delivery_grace_s, "ttl_tolerance_s": opts.ttl_tolerance_s},
        "counts": result.counts,
        "latency_ms": {"all": percentiles(result.latency_ms), **by_kind},
        "unaudited_windows": [{"start": iso(s), "end": iso(e), "seconds": round((e - s) / 1000, 3), "reason": r}
                              for s, e, r in result.gaps],
        "audit_seconds": round(seconds, 2),
    }


def write_outputs(result: AuditResult, info: dict[str, Any], out_dir: str, max_rows: int = 500) -> dict[str, str]:
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
    findings = [r.asDict() for r in result.findings.orderBy("finding", "ts").limit(max_rows).collect()]
    per_minute = [(r["minute"], r["count"]) for r in result.alerts.selectExpr(
        "cast(floor(ts / 60000) * 60000 as long) as minute").groupBy("minute").count().orderBy("minute").collect()]
    (out / "report.html").write_text(render_html(info, findings, result.latency_ms, per_minute))
    paths["report"] = str(out / "report.html")
    return paths


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def plots(latency_ms: list[int], per_minute: list[tuple[int, int]]) -> tuple[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if latency_ms:
        ax.hist(latency_ms, bins=min(60, max(5, len(set(latency_ms)))), color="#3b6ea5")
    else:
        ax.text(0.5, 0.5, "no judged alerts", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("detection latency (ms): triggering trade publish → alert publish")
    ax.set_ylabel("alerts")
    ax.set_title("Detection latency")
    hist = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if per_minute:
        xs = [datetime.fromtimestamp(m / 1000, tz=timezone.utc) for m, _ in per_minute]
        ax.bar(xs, [c for _, c in per_minute], width=1 / 1440 * 0.9, align="edge", color="#a5563b")
        locator = mdates.AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    else:
        ax.text(0.5, 0.5, "no alerts", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("minute (UTC)")
    ax.set_ylabel("alert publishes")
    ax.set_title("Alerts per minute")
    rate = _png(fig)
    plt.close(fig)
    return hist, rate


def render_html(info: dict[str, Any], findings: list[dict[str, Any]], latency_ms: list[int],
                per_minute: list[tuple[int, int]]) -> str:
    hist, rate = plots(latency_ms, per_minute)
    e = html.escape
    colour = {"clean": "#2e7d32", "unaudited": "#ef6c00", "discrepancies": "#c62828"}[info["verdict"]]
    headline = {
        "clean": "clean: every alert accounted for",
        "unaudited": f"no discrepancy found, but {len(info['unaudited_windows'])} window(s) were not recorded: no verdict there",
        "discrepancies": f"{info['discrepancies']} discrepancies",
    }[info["verdict"]]
    counts = "".join(f"<tr><td>{e(k)}</td><td>{v}</td></tr>" for k, v in info["counts"].items())
    lat = "".join(
        f"<tr><td>{e(k)}</td><td>{v['count']}</td><td>{v['p50']}</td><td>{v['p95']}</td><td>{v['p99']}</td>"
        f"<td>{v['max']}</td></tr>" for k, v in info["latency_ms"].items())
    gaps = "".join(f"<tr><td>{e(g['start'])}</td><td>{e(g['end'])}</td><td>{g['seconds']}</td>"
                   f"<td>{e(g['reason'])}</td></tr>" for g in info["unaudited_windows"]) \
        or "<tr><td colspan=4>none: every moment of the window was recorded</td></tr>"
    rows = "".join(
        f"<tr><td>{e(f['finding'])}</td><td>{e(str(f['alert_id']))}</td><td>{e(str(f['order_id']))}</td>"
        f"<td>{e(str(f['channel'] or ''))}</td><td>{e(iso(f['ts']) or '')}</td><td>{f['count']}</td>"
        f"<td>{'' if f['latency_ms'] is None else f['latency_ms']}</td></tr>" for f in findings) \
        or "<tr><td colspan=7>none</td></tr>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Aldebaran audit: {e(info['verdict'])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }}
.verdict {{ font-size: 1.6em; color: white; background: {colour}; padding: .4em .8em; border-radius: 6px;
  display: inline-block; }}
table {{ border-collapse: collapse; margin: .5em 0 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: .25em .6em; text-align: left; font-size: .9em; }}
th {{ background: #f3f3f3; }} .plots img {{ max-width: 100%; margin-right: 1em; }}
</style></head><body>
<h1>Aldebaran alert audit</h1>
<p class="verdict">{e(headline)}</p>
<p>Window: {e(str(info['window']['since'] or 'start of traces'))} → {e(str(info['window']['until'] or 'end of traces'))}
 · audit took {info['audit_seconds']} s · book TTL {info['options']['book_ttl_s']} s
 · late after {info['options']['late_after_s']} s</p>
<h2>Unaudited windows (no verdict)</h2>
<table><tr><th>start</th><th>end</th><th>seconds</th><th>reason</th></tr>{gaps}</table>
<h2>Findings</h2>
<table><tr><th>finding</th><th>alert id</th><th>order</th><th>channel</th><th>time (UTC)</th><th>count</th>
<th>latency ms</th></tr>{rows}</table>
<h2>Detection latency (ms)</h2>
<table><tr><th>kind</th><th>alerts</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>{lat}</table>
<div class="plots"><img alt="latency histogram" src="data:image/png;base64,{hist}">
<img alt="alerts per minute" src="data:image/png;base64,{rate}"></div>
<h2>Counts</h2><table>{counts}</table>
</body></html>
"""
