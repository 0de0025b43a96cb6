"""The bench's outputs: a rich table on the terminal, a Markdown table and a PNG in docs/.

The Markdown goes between markers in docs/benchmarks.md so the hand-written analysis
around it survives a re-run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from aldebaran.bench.phases import Result

BEGIN = "<!-- bench:begin (written by `aldebaran bench`) -->"
END = "<!-- bench:end -->"


def _lat(result: Result, stage: str) -> str:
    values = result.latency.get(stage) or {}
    if not values:
        return "–"
    mark = "≥ " if values.get("beyond_buckets") else ""
    parts = [f"{values[k]:,.1f}" if k in values else "–" for k in ("p50", "p95", "p99", "max")]
    return mark + " / ".join(parts)


def _cpu(result: Result) -> str:
    return ", ".join(f"{name} {cores:.2f}" for name, cores in sorted(result.cpu.items(), key=lambda kv: -kv[1])
                     if cores >= 0.01)


def _alerts(result: Result) -> str:
    if not result.expected:
        return "–"
    return (f"{result.correct}/{result.expected} ok, {result.wrong} wrong, {result.missing} missing, "
            f"{result.duplicates} dup")


def markdown(results: Sequence[Result], command: str, context: str) -> str:
    lines = [BEGIN, "", f"Command: `{command}`", "", context, "",
             "| mode | events | offered ev/s | events/s | latency ms → book p50/p95/p99/max "
             "| → alert p50/p95/p99/max | CPU (cores) | events/message | alerts |",
             "|---|---:|---:|---:|---|---|---|---|---|"]
    for r in results:
        first_stage = "consumed" if "consumed" in r.latency else "book"
        batch = ", ".join(f"{k} {v:.0f}" for k, v in r.batch.items())
        lines.append(f"| {r.name} | {r.events:,} | {r.offered:,.0f} | {r.rate:,.0f} | {_lat(r, first_stage)} "
                     f"| {_lat(r, 'alert')} | {_cpu(r)} | {batch} | {_alerts(r)} |")
    lines += ["", "Latency sources: " + "; ".join(f"{r.name}: {r.latency_source}" for r in results
                                                  if r.latency_source) + "."]
    lines += ["", "Notes: " + "; ".join(f"{r.name}: {r.note}" for r in results if r.note) + ".", "", END]
    return "\n".join(lines)


def write_markdown(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def plot(results: Sequence[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    names = [r.name.split(" (")[0] + (f"\n@{r.offered:,.0f}/s" if r.offered else "") for r in results]
    left.barh(names, [r.rate for r in results], color="#4477aa")
    left.set_xscale("log")
    left.set_xlabel("events/s (log scale)")
    left.axvline(250_000, color="#cc3311", linestyle="--", label="target 250k/s")
    left.legend()
    left.invert_yaxis()
    for stage, offset, colour in (("book", -0.2, "#228833"), ("alert", 0.2, "#ccbb44")):
        values = [(r.latency.get(stage) or r.latency.get("consumed") or {}).get("p99", 0) if stage == "book"
                  else (r.latency.get(stage) or {}).get("p99", 0) for r in results]
        right.barh([i + offset for i in range(len(results))], values, height=0.4, color=colour,
                   label=f"p99 → {stage}")
    right.set_yticks(range(len(results)))
    right.set_yticklabels(names)
    right.invert_yaxis()
    right.axvline(5, color="#cc3311", linestyle="--", label="target 5 ms")
    right.set_xscale("symlog", linthresh=1)
    right.set_xlabel("p99 latency, ms")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
