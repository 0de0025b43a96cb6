"""Tiny, non-timed runs of `aldebaran bench`: speed is printed, never asserted; loss, wrong alerts and bounds are."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from aldebaran.bench.phases import Result, histogram_percentiles, percentiles
from aldebaran.bench.workload import build
from aldebaran.trades.codec import decode_message
from aldebaran.trades.generator import expected_alerts
from tests.support import services


def test_percentiles_are_weighted() -> None:
    assert percentiles([(1.0, 98), (10.0, 1), (100.0, 1)]) == {"p50": 1.0, "p95": 1.0, "p99": 10.0, "max": 100.0}
    assert histogram_percentiles([(0.001, 50), (0.005, 99), (0.01, 100)]) == {"p50": 1.0, "p95": 5.0, "p99": 5.0}


def test_relabelled_rounds_are_new_orders_with_their_own_expected_alerts() -> None:
    workload = build(orders=200, batch=50)
    events = [e for body in workload.round_bodies(2) for e in decode_message(body.data, body.content_type).events]
    assert len(events) == len(workload.events)
    assert not {e.order_id for e in events} & {e.order_id for e in workload.events}
    assert expected_alerts(events) == workload.round_expected(2)


def test_alert_check_counts_wrong_missing_and_repeated() -> None:
    from collections import Counter

    result = Result("x")
    result.check({"a", "b", "c"}, Counter({"a": 2, "b": 1, "z": 1}))
    assert (result.correct, result.wrong, result.missing, result.duplicates) == (2, 1, 1, 1)


def test_bench_quick_smoke_run_writes_the_table_and_plot(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(ALDEBARAN_MANAGEMENT_URL=services.MANAGEMENT_URL, ALDEBARAN_REDIS_URL=services.REDIS_URL,
               ALDEBARAN_AMQP_URL=services.AMQP_URL, ALDEBARAN_LOG_FORMAT="json", ALDEBARAN_SHARDS="4")
    result = subprocess.run(
        [sys.executable, "-m", "aldebaran.cli", "bench", "--quick", "--orders", "300", "--seconds", "0.5",
         "--phases", "raw,naive,sharded-1", "--output", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "benchmarks.md").read_text()
    assert "aldebaran bench --quick" in report and "| sharded, 1 process |" in report
    assert (tmp_path / "benchmarks.png").stat().st_size > 1000
    sharded = next(line for line in report.splitlines() if line.startswith("| sharded, 1 process"))
    assert " 0 wrong, 0 missing, 0 dup" in sharded, sharded  # correctness, not speed


def test_recovery_needs_consecutive_buckets_under_the_target() -> None:
    from aldebaran.bench.overload import recovered_at

    timeline = [(0.0, 900.0), (1.0, 4.0), (2.0, 30.0), (3.0, 4.5), (4.0, 3.0), (5.0, 2.0), (6.0, 1.0)]
    assert recovered_at(timeline, target_ms=5.0, run=3) == 3.0
    assert recovered_at(timeline[:5], target_ms=5.0, run=3) is None
    assert recovered_at([(0.0, 5.0), (1.0, 5.0), (2.0, 4.0)], target_ms=5.0, run=3) is None
    assert recovered_at([(0.0, 5.0), (1.0, 5.0), (2.0, 4.0)], target_ms=5.0, run=3, inclusive=True) == 0.0


def test_overload_section_reports_the_baseline_and_both_recovery_figures() -> None:
    """The 5-ms row stays as it was; the pre-surge baseline and the time back to it are rows of their own."""
    from aldebaran.bench.overload import Overload
    from aldebaran.bench.report import overload_markdown

    result = Overload(bound_mib=768, capacity=16_000, baseline_seconds=20, recovery_timeout=300,
                      recovery_seconds=300, p99_baseline={"p50": 19.2, "p99": 40.3, "max": 47.8},
                      baseline_target_ms=50.4, back_to_baseline_after=61.0)
    rows = _table(overload_markdown(result, "aldebaran bench --scenario overload", "context"))
    assert rows["p99 → book back under 5 ms"][0] == "not within 300 s after the surge ended"
    assert rows["p99 → book back under 5 ms"][2] == "**NO**"
    back = rows["p99 → book back to its pre-surge level"]
    assert back[0] == "61.0 s after the surge ended" and "≤ 50.4 ms" in back[1] and back[2] == "ok"
    assert rows["latency → book p50 / p99 / max, baseline before the surge"][0] == "19.2 / 40.3 / 47.8 ms"


def test_each_bench_writer_keeps_the_other_section(tmp_path) -> None:
    from aldebaran.bench.report import BEGIN, END, OVERLOAD_BEGIN, OVERLOAD_END, write_markdown

    path = tmp_path / "benchmarks.md"
    path.write_text(f"# B\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nanalysis\n\n{OVERLOAD_BEGIN}\nold overload\n"
                    f"{OVERLOAD_END}\n\ntail\n")
    write_markdown(path, f"{BEGIN}\nnew table\n{END}")
    write_markdown(path, f"{OVERLOAD_BEGIN}\nnew overload\n{OVERLOAD_END}")
    text = path.read_text()
    assert "new table" in text and "new overload" in text
    assert "old table" not in text and "old overload" not in text
    assert all(part in text for part in ("intro", "analysis", "tail"))
    assert text.index("new table") < text.index("analysis") < text.index("new overload") < text.index("tail")


def _table(section: str) -> dict[str, list[str]]:
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_bench_overload_scenario_loses_nothing_and_stays_under_the_memory_bound(tmp_path) -> None:
    """A tiny surge (2x a given capacity) and recovery: the figures must say nothing was lost,
    no alert was wrong, every worker stayed under max_rss_mib; and the section is written
    beside the full bench's table, with its command. Recovery time is printed, not asserted."""
    from aldebaran.bench.report import BEGIN, END, OVERLOAD_BEGIN, OVERLOAD_END

    (tmp_path / "benchmarks.md").write_text(f"# Benchmarks\n\n{BEGIN}\nfull table\n{END}\n\nanalysis\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(ALDEBARAN_MANAGEMENT_URL=services.MANAGEMENT_URL, ALDEBARAN_REDIS_URL=services.REDIS_URL,
               ALDEBARAN_AMQP_URL=services.AMQP_URL, ALDEBARAN_LOG_FORMAT="json", ALDEBARAN_SHARDS="4",
               ALDEBARAN_MAX_RSS_MIB="768")
    result = subprocess.run(
        [sys.executable, "-m", "aldebaran.cli", "bench", "--scenario", "overload", "--quick", "--orders", "300",
         "--batch", "100", "--capacity", "3000", "--surge-seconds", "2", "--recovery-timeout", "5",
         "--output", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "benchmarks.md").read_text()
    assert "full table" in report and "analysis" in report  # the full bench's section survived
    section = report.split(OVERLOAD_BEGIN, 1)[1].split(OVERLOAD_END, 1)[0]
    assert "Command: `aldebaran bench --scenario overload --quick --orders 300" in section
    assert "load average before" in section
    rows = _table(section)
    assert rows["events lost"][0] == "0", rows["events lost"]
    assert rows["alerts wrong"][0] == "0", rows["alerts wrong"]
    counts = rows["events published / in a book"][0].split(" (")[0]
    published, in_book = (int(n.replace(",", "")) for n in counts.split(" / "))
    assert published > 0 and in_book >= published
    assert re.match(r"^[\d,]+ events not yet in a book \([\d,]+ messages queued", rows["backlog peak"][0])
    baseline = rows["latency → book p50 / p99 / max, baseline before the surge"][0]
    assert re.match(r"^[\d.,]+ / [\d.,]+ / [\d.,]+ ms$", baseline), baseline
    assert "p99 → book back to its pre-surge level" in rows
    for process in ("up", "router", "shard-books"):
        peak, bound, within = rows[process]
        assert bound == "768" and 0 < float(peak.replace(",", "")) < 768 and within == "ok", (process, rows[process])
