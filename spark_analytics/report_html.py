"""report.html: one self-contained page (plots as base64 PNGs), read top-down by an operator.

Order: verdict (alerts in doubt named in it); one row of counts per deployment; the latency
and alert-rate plots; then per deployment its findings grouped by kind (first rows only, the
rest in findings.parquet; the in-doubt rows after the discrepancies), its unaudited windows
and skipped junk; the full counts last.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime
from typing import Any

from spark_analytics.stats import FINDINGS, IN_DOUBT, JUNK, JUNK_TOTAL, KINDS

e = html.escape
COLOUR = {"clean": "#2e7d32", "in_doubt": "#6a1b9a", "unaudited": "#ef6c00", "discrepancies": "#c62828"}
# The per-deployment row, left to right; "in doubt" (at-most-once attempts the operator's
# list accounts for, `--in-doubt`) after the discrepancies: its own column, never one of them.
COLUMNS = (("trade events", "trade_events_decoded"), ("orders", "orders"), ("expected", "expected_alerts"),
           ("published", "alert_publishes"), *[(k.replace("_", " "), k) for k in FINDINGS], ("in doubt", IN_DOUBT))
NOT_READ = "<td title='no --in-doubt list given: such alerts count as channel missed'>–</td>"


def _iso(ms: int | None) -> str:
    return "" if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def plots(bins: list[tuple[float, float, int]], per_minute: list[tuple[str, int, int]]) -> tuple[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if bins:
        ax.bar([lo for lo, _, _ in bins], [n for _, _, n in bins], width=[hi - lo for lo, hi, _ in bins],
               align="edge", color="#3b6ea5")
    else:
        ax.text(0.5, 0.5, "no judged alerts", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("detection latency (ms): triggering trade publish → alert publish")
    ax.set_ylabel("alerts")
    ax.set_title("Detection latency (every deployment)")
    hist = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    vhosts = sorted({v for v, _, _ in per_minute})
    for v in vhosts:
        pts = [(m, c) for vv, m, c in per_minute if vv == v]
        xs = np.array([m for m, _ in pts], dtype="datetime64[ms]")  # epoch ms: UTC times
        ax.plot(xs, [c for _, c in pts], drawstyle="steps-post", label=v)
    if vhosts:
        locator = mdates.AutoDateLocator(tz=UTC, minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
        ax.legend(title="deployment", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no alerts", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("minute (UTC)")
    ax.set_ylabel("alerts published")
    ax.set_title("Alerts per minute")
    rate = _png(fig)
    plt.close(fig)
    return hist, rate


def _cell(key: str, c: dict[str, Any], listed: bool) -> str:
    if key == IN_DOUBT and not listed:
        return NOT_READ
    style = ("bad" if key in FINDINGS else "doubt" if key == IN_DOUBT else "") if c.get(key) else ""
    return f"<td class='{style}'>{c.get(key, 0):,}</td>"


def _deployments_table(info: dict[str, Any]) -> str:
    head = "".join(f"<th>{e(name)}</th>" for name, _ in COLUMNS)
    rows = []
    listed = info.get("in_doubt_list") is not None
    for v, d in info["deployments"].items():
        c = d["counts"]
        cells = "".join(_cell(key, c, listed) for _, key in COLUMNS)
        junk = sum(c.get(k, 0) for k in JUNK_TOTAL)
        rows.append(f"<tr><td><a href='#d-{e(v)}'>{e(v)}</a></td><td style='color:{COLOUR[d['verdict']]}'>"
                    f"{e(d['verdict'])}</td>{cells}<td>{junk:,}</td><td>{len(d['unaudited_windows'])}</td></tr>")
    body = "".join(rows) or f"<tr><td colspan={len(COLUMNS) + 4}>no deployment in the traces</td></tr>"
    return (f"<table><tr><th>deployment (vhost)</th><th>verdict</th>{head}<th>junk skipped</th>"
            f"<th>unaudited windows</th></tr>{body}</table>")


def _latency_table(info: dict[str, Any]) -> str:
    rows = [f"<tr><td>{e(v)}</td><td>{e(k)}</td><td>{s['count']:,}</td><td>{s['p50']}</td><td>{s['p95']}</td>"
            f"<td>{s['p99']}</td><td>{s['max']}</td></tr>"
            for v, d in [("every deployment", info)] + [(v, d) for v, d in info["deployments"].items()]
            for k, s in sorted(d["latency_ms"].items(), key=lambda kv: (kv[0] != "all", kv[0]))]
    return ("<table><tr><th>deployment</th><th>kind</th><th>alerts</th><th>p50</th><th>p95</th><th>p99</th>"
            f"<th>max</th></tr>{''.join(rows)}</table>")


def _findings(vhost: str, d: dict[str, Any], findings: list[dict[str, Any]], per_kind: int) -> str:
    parts = []
    for kind in KINDS:
        total = d["counts"].get(kind, 0)
        if not total:
            continue
        why = (" (not a discrepancy: no copy was taken from the channel's queue, and the channel lists the "
               "alert in doubt; ask the recipient, then <code>aldebaran delivery settle</code>)"
               if kind == IN_DOUBT else "")
        rows = "".join(
            f"<tr><td>{e(str(f['alert_id']))}</td><td>{e(str(f['order_id'] or ''))}</td>"
            f"<td>{e(str(f['channel'] or ''))}</td><td>{e(_iso(f['ts']))}</td><td>{f['count']}</td>"
            f"<td>{'' if f['latency_ms'] is None else f['latency_ms']}</td></tr>"
            for f in findings if f["vhost"] == vhost and f["finding"] == kind)
        more = (f"<p class='more'>… and {total - per_kind:,} more: findings.parquet "
                f"(vhost = '{e(vhost)}', finding = '{kind}')</p>" if total > per_kind else "")
        parts.append(f"<h4>{e(kind)}: {total:,}{why}</h4><table><tr><th>alert id</th><th>order</th><th>channel</th>"
                     f"<th>time (UTC)</th><th>count</th><th>latency ms</th></tr>{rows}</table>{more}")
    return "".join(parts) or "<p>No findings.</p>"


def _section(vhost: str, d: dict[str, Any], findings: list[dict[str, Any]], per_kind: int) -> str:
    c = d["counts"]
    gaps = "".join(f"<tr><td>{e(g['start'])}</td><td>{e(g['end'])}</td><td>{g['seconds']}</td>"
                   f"<td>{e(g['reason'])}</td></tr>" for g in d["unaudited_windows"]) \
        or "<tr><td colspan=4>none: every moment of the window was recorded</td></tr>"
    junk = "".join(f"<tr><td>{e(k)}</td><td>{c.get(k, 0):,}</td></tr>" for k in JUNK)
    every = "".join(f"<tr><td>{e(k)}</td><td>{v:,}</td></tr>" for k, v in sorted(c.items()))
    verdict = f"<span style='color:{COLOUR[d['verdict']]}'>{e(d['verdict'])}</span>"
    listed = "" if "in_doubt_listed" not in c else (
        f"<p>In-doubt list: {c['in_doubt_listed']:,} alert(s) in doubt for this deployment; "
        f"{c[IN_DOUBT]:,} of them never taken from the channel's queue (channel_in_doubt), "
        f"{c['in_doubt_delivered']:,} taken (no finding: delivered as far as the broker can tell; "
        "the recipient may still lack them); the rest are not judged here (outside the window, "
        "unaudited or pending, or a channel this audit does not check).</p>")
    return f"""<h2 id="d-{e(vhost)}">Deployment {e(vhost)}: {verdict}</h2>
<h3>Findings by kind</h3>{_findings(vhost, d, findings, per_kind)}{listed}
<h3>Unaudited windows (no verdict)</h3>
<table><tr><th>start</th><th>end</th><th>seconds</th><th>reason</th></tr>{gaps}</table>
<h3>Junk skipped (the pipeline dead-letters it; it changes no book)</h3><table>{junk}</table>
<details><summary>every count</summary><table>{every}</table></details>"""


def _headline(info: dict[str, Any]) -> str:
    """The banner; alerts in doubt are named in it whatever else the verdict says."""
    n, doubt = len(info["deployments"]), info.get("in_doubt", 0)
    waiting = f"{doubt:,} alert deliver{'ies' if doubt != 1 else 'y'} in doubt, for the operator to settle"
    headline = {
        "clean": f"clean: every alert accounted for ({n} deployment{'s' if n != 1 else ''})",
        "in_doubt": f"no discrepancy, but {waiting} (aldebaran delivery in-doubt)",
        "unaudited": f"no discrepancy found, but {len(info['unaudited_windows'])} window(s) were not recorded: "
                     "no verdict there",
        "discrepancies": f"{info['discrepancies']:,} discrepancies",
    }[info["verdict"]]
    return headline if info["verdict"] == "in_doubt" or not doubt else f"{headline} · {waiting}"


def render(info: dict[str, Any], findings: list[dict[str, Any]], bins: list[tuple[float, float, int]],
           per_minute: list[tuple[str, int, int]], per_kind: int) -> str:
    hist, rate = plots(bins, per_minute)
    headline = _headline(info)
    files = info["counts"]
    torn = "".join(f"<li>{e(t['file'])}: {t['bytes_lost']:,} bytes after byte {t['bytes_read']:,} unreadable</li>"
                   for t in info["damaged_files"])
    sections = "".join(_section(v, d, findings, per_kind) for v, d in info["deployments"].items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Aldebaran audit: {e(info['verdict'])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }}
.verdict {{ font-size: 1.6em; color: white; background: {COLOUR[info['verdict']]}; padding: .4em .8em;
  border-radius: 6px; display: inline-block; }}
table {{ border-collapse: collapse; margin: .5em 0 1.2em; }}
td, th {{ border: 1px solid #ccc; padding: .25em .6em; text-align: left; font-size: .9em; }}
th {{ background: #f3f3f3; }} td.bad {{ color: #c62828; font-weight: bold; }}
td.doubt {{ color: {COLOUR['in_doubt']}; font-weight: bold; }}
.plots img {{ max-width: 49%; }} .more {{ color: #555; font-size: .9em; }}
</style></head><body>
<h1>Aldebaran alert audit</h1>
<p class="verdict">{e(headline)}</p>
<p>Window: {e(str(info['window']['since'] or 'start of traces'))} → {e(str(info['window']['until'] or 'end of traces'))}
 · audit took {info['audit_seconds']} s · book TTL {info['options']['book_ttl_s']} s
 · late after {info['options']['late_after_s']} s</p>
<h2>Deployments</h2>{_deployments_table(info)}
<div class="plots"><img alt="latency histogram" src="data:image/png;base64,{hist}">
<img alt="alerts per minute" src="data:image/png;base64,{rate}"></div>
<h3>Detection latency (ms)</h3>{_latency_table(info)}
{sections}
<h2>Trace files</h2>
<p>{info['counts']['corrupt_lines']:,} unreadable line(s) (not a JSON record: a half-written line, garbage,
bytes that are not UTF-8) skipped; {files['torn_files']} part file(s) break off before their end
(a torn gzip tail: read up to the break).</p><ul>{torn}</ul>
</body></html>
"""
