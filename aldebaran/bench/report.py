"""The bench's outputs: a rich table on the terminal, a Markdown table and a PNG in docs/.

The Markdown goes between markers in docs/benchmarks.md so the hand-written analysis
around it survives a re-run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from aldebaran.bench.overload import BASELINE_MARGIN, P99_TARGET_MS, RECOVERED_BUCKETS, Overload
from aldebaran.bench.phases import Result

BEGIN = "<!-- bench:begin (written by `aldebaran bench`) -->"
END = "<!-- bench:end -->"
OVERLOAD_BEGIN = "<!-- overload:begin (written by `aldebaran bench --scenario overload`) -->"
OVERLOAD_END = "<!-- overload:end -->"
TIMELINE_STEP = 30.0  # seconds between the p99 figures of the overload section's timeline


def _lat(result: Result, stage: str) -> str:
    values = result.latency.get(stage) or {}
    if not values:
        return "–"
    mark = "≥ " if values.get("beyond_buckets") else ""
    parts = [f"{values[k]:,.1f}" if k in values else "–" for k in ("p50", "p95", "p99", "max")]
    return mark + " / ".join(parts)


def _cpu(result: Result) -> str:
    return _cpu_text(result.cpu)


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
    """Replace only the section `block` belongs to (found by its begin marker); every other
    section, and the hand-written text around them, stays: a full run keeps the overload
    section and an overload run keeps the full table."""
    begin, end = (OVERLOAD_BEGIN, OVERLOAD_END) if block.startswith(OVERLOAD_BEGIN) else (BEGIN, END)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def _seconds(value: float | None, waited: float) -> str:
    return f"{value:.1f} s" if value is not None else f"not within {waited:.0f} s"


def _p(values: dict[str, float]) -> str:
    return " / ".join(f"{values[k]:,.1f}" for k in ("p50", "p99", "max")) if values else "–"


def _first_half(o: Overload) -> str:
    """The rate into books in the calibration's first half beside the capacity: how far the
    intake of a fresh pipeline overstates what it finishes."""
    return f" (intake in the first half: {o.capacity_first_half:,.0f})" if o.capacity_first_half else ""


def overload_markdown(o: Overload, command: str, context: str) -> str:
    """The overload section: the issue's figures, each next to the bound it must respect."""
    ok = {True: "ok", False: "**NO**"}
    lines = [OVERLOAD_BEGIN, "", f"Command: `{command}`", "", context, "",
             "| figure | value | bound / target | within |", "|---|---:|---|---|",
             f"| capacity | {o.capacity:,.0f} events/s{_first_half(o)} | {o.capacity_source} | – |",
             f"| surge | {o.capacity * o.surge_factor:,.0f} events/s asked, {o.surge_offered:,.0f} confirmed, "
             f"for {o.surge_seconds:g} s | {o.surge_factor:g} × capacity | – |",
             f"| recovery load | {o.capacity * o.recovery_factor:,.0f} events/s for {o.recovery_seconds:.0f} s "
             f"| {o.recovery_factor:g} × capacity, until p99 is back under {P99_TARGET_MS:g} ms and to its "
             f"pre-surge level, or {o.recovery_timeout:g} s | – |",
             f"| events published / in a book | {o.published:,} / {o.processed:,} (late: {o.late:,}) | – | – |",
             f"| events lost | {o.lost:,} | 0 | {ok[o.lost == 0]} |",
             f"| alerts wrong | {o.alerts.wrong:,} | 0 | {ok[o.alerts.wrong == 0]} |",
             f"| alerts | {o.alerts.correct:,}/{o.alerts.expected:,} ok, {o.alerts.missing:,} missing, "
             f"{o.alerts.duplicates:,} dup | – | {ok[o.alerts.missing == 0 and o.alerts.duplicates == 0]} |",
             f"| backlog peak | {o.backlog_peak:,} events not yet in a book ({o.backlog_peak_messages:,} messages "
             f"queued, shard heartbeats included), {o.backlog_peak_at:.0f} s after the surge began "
             f"| ingress_max_length {o.ingress_max_length or 'unbounded'} | – |",
             f"| backlog drained (≤ 1 s of work) | {_seconds(o.drained_after, o.recovery_seconds)} after the surge "
             f"ended, at the recovery load | ≈ 2 × surge seconds | – |",
             f"| last event in its book | {_seconds(o.all_in_after, o.recovery_seconds)} after the surge ended "
             f"(publishing stopped at {o.recovery_seconds:.0f} s) | – | – |",
             f"| p99 → book back under {P99_TARGET_MS:g} ms | {_seconds(o.recovered_after, o.recovery_seconds)} "
             f"after the surge ended | {RECOVERED_BUCKETS} consecutive 1-s buckets under {P99_TARGET_MS:g} ms "
             f"| {ok[o.recovered_after is not None]} |",
             f"| p99 → book back to its pre-surge level | {_seconds(o.back_to_baseline_after, o.recovery_seconds)} "
             f"after the surge ended | {RECOVERED_BUCKETS} consecutive 1-s buckets ≤ {o.baseline_target_ms:,.1f} ms "
             f"(max of {P99_TARGET_MS:g} ms and {BASELINE_MARGIN:g} × the baseline's p99) "
             f"| {ok[o.back_to_baseline_after is not None]} |",
             f"| latency → book p50 / p99 / max, baseline before the surge | {_p(o.p99_baseline)} ms "
             f"| {o.recovery_factor:g} × capacity for {o.baseline_seconds:g} s after a full drain, "
             f"straight into the surge | – |",
             f"| latency → book p50 / p99 / max, during the surge | {_p(o.p99_surge)} ms | – | – |",
             f"| latency → book p50 / p99 / max, {'once recovered' if o.recovered_after is not None else 'last 10 s'} "
             f"| {_p(o.p99_after)} ms | {P99_TARGET_MS:g} ms p99 | – |",
             f"| publisher refused (nacks) / connection.blocked episodes | {o.nacks:,} / {o.blocked:,} "
             f"| retried with backoff | – |",
             f"| shard worker holds, at peak | {o.books_open_peak:,} open books, {o.done_markers_peak:,} done "
             f"markers ({o.done_markers_forgotten:,} forgotten early) | shard_done_max_markers | – |",
             "", "| process | peak RSS MiB | bound MiB | within |", "|---|---:|---:|---|"]
    for name, peak in sorted(o.rss_mib.items()):
        lines.append(f"| {name} | {peak:,.1f} | {o.bound_mib:,} | {ok[peak < o.bound_mib]} |")
    for name, (peak, limit) in sorted(o.services_mib.items()):
        bound = f"{limit:,.0f}" if limit else "none set"
        lines.append(f"| {name} (shared service, whole node) | {peak:,.1f} | {bound} | "
                     f"{ok[not limit or peak < limit]} |")
    every, mark = [], 0.0
    for t, p99 in o.p99_timeline:
        if t >= mark:
            every.append(f"+{t:.0f} s {p99:,.1f}")
            mark = (t // TIMELINE_STEP + 1) * TIMELINE_STEP
    lines += ["", "CPU (cores, baseline + surge + recovery): " + (_cpu_text(o.cpu) or "–") + ".", "",
              f"p99 → book (ms) of 1-s buckets after the surge ended, one per {TIMELINE_STEP:.0f} s: "
              + ("; ".join(every) or "–") + "."]
    for name, ids, count in (("wrong", o.wrong_examples, o.alerts.wrong),
                             ("missing", o.missing_examples, o.alerts.missing)):
        if ids:
            lines += ["", f"Alerts {name} (first {len(ids)} of {count:,}): "
                      + ", ".join(f"`{i}`" for i in ids) + "."]
    if o.note:
        lines += ["", "Note: " + o.note + "."]
    lines += ["", OVERLOAD_END]
    return "\n".join(lines)


def _cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {cores:.2f}" for name, cores in sorted(cpu.items(), key=lambda kv: -kv[1])
                     if cores >= 0.01)


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
