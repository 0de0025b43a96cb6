"""A tiny, non-timed smoke run of `aldebaran bench`: every number is printed, none asserted."""

from __future__ import annotations

import os
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
