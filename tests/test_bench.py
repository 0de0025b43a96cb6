"""Tiny, non-timed runs of `aldebaran bench`: speed is printed, never asserted; wrong alerts are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aldebaran
from aldebaran.bench.drain import Drain
from aldebaran.bench.paced import Paced, percentiles
from aldebaran.bench.table import BEGIN, END, alert_cell, median_paced, write
from aldebaran.bench.targets import Results
from aldebaran.bench.targets import rows as verdict_rows
from aldebaran.bench.workload import build
from aldebaran.trades.codec import decode_message
from aldebaran.trades.generator import expected_alerts
from tests.support import services


def test_percentiles_are_weighted() -> None:
    assert percentiles([(1.0, 98), (10.0, 1), (100.0, 1)]) == {"p50": 1.0, "p95": 1.0, "p99": 10.0, "max": 100.0}


def test_the_paced_row_is_the_round_with_the_median_p99_and_names_every_rounds() -> None:
    runs = [Paced(f"engine {n}", 100_000, latency={"book": {"p50": 1.0, "p95": 2.0, "p99": p99}})
            for n, p99 in enumerate((6.0, 4.25, 5.0))]
    chosen = median_paced(runs)
    assert chosen is runs[2]
    assert chosen.name == "engine 2 (p99 → book of 3 rounds, median shown: 6.0, 4.2, 5.0)"
    alone = Paced("floor", 100_000, latency={"book": {"p99": 1.5}})
    assert median_paced([alone]).name == "floor"


def test_relabelled_rounds_are_new_orders_with_their_own_expected_alerts() -> None:
    workload = build(orders=200, batch=50)
    events = [e for body in workload.round_bodies(2) for e in decode_message(body.data, body.content_type).events]
    assert len(events) == len(workload.events)
    assert not {e.order_id for e in events} & {e.order_id for e in workload.events}
    assert expected_alerts(events) == workload.round_expected(2)


def test_the_alert_cell_counts_ok_wrong_missing_and_repeated() -> None:
    run = Drain("x", alerts=Counter({"a": 2, "b": 1, "z": 1}))
    assert alert_cell(run, {"a", "b", "c"}) == "2 / 1 / 1 / 1"
    assert alert_cell(Drain("raw"), {"a"}).startswith("–")


def test_targets_are_judged_from_the_run_with_how_far_they_are_missed() -> None:
    expected = {"over_purchase:1", "over_purchase:2"}
    once = Counter(expected)
    engine = Drain("engine, 1 process", events=1_000_000, seconds=2.0, alerts=once,
                   cpu={"engine": 0.5, "rabbitmq": 0.1, "redis": 0.1, "bench": 3.0})  # 500k/s, 1.4 µs
    slow_json = Drain("engine, 1 process", events=100_000, seconds=1.0, alerts=Counter({"over_purchase:1": 2}))
    hand = Drain("hand-written batched pika consumer", events=1_000_000, seconds=1.0)
    heavy = Drain("engine, 1 process (+ lookout, queue-api and amqp channels)", events=1_000_000, seconds=8.0,
                  alerts=once, delivered_once=False, last_alert_after=2.5)
    short = Drain("engine, 1 process", events=10_000_000, seconds=20.0, alerts=once)
    floor = Paced("broker floor", 100_000, latency={"book": {"p99": 3.5}})
    paced = Paced("engine", 100_000, latency={"book": {"p99": 12.5}, "alert": {"p99": 20.0}})
    results = Results(drains={"msgpack": [engine], "json": [hand, slow_json], "alert-heavy": [heavy],
                              "sustained": [short]},
                      expected={key: expected for key in ("msgpack", "json", "alert-heavy", "sustained")},
                      paced={1000: (floor, paced)}, step_us=(1.5, 3.3))
    table = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in verdict_rows(results)}
    first = table["≥ 250,000 events/s, low-alert 1000-event msgpack, every alert right"]
    assert first == ["500,000 events/s", "met (2.00×) |"]
    assert table["the same sustained for 60 s"][1] == "not judged: 20 s of draining, under 60 |"
    json = table["≥ 150,000 events/s, 100-event JSON"][1]
    assert json == "**missed** by 1.50×; the alerts were not exact either |"
    wrong = Results(drains={"msgpack": [engine]}, expected={"msgpack": {"over_purchase:9"}})
    assert verdict_rows(wrong)[0].endswith("| **missed**: the alerts were not exact (the rate met (2.00×)) |")
    assert table["JSON: ≥ 0.6× the hand-written consumer"] == ["0.10×", "**missed** by 6.00× |"]
    assert table["JSON: ≥ 1.5× Bytewax"][1] == "not in this run |"
    heavy_row = next(v for k, v in table.items() if k.startswith("alert-heavy: ≥"))
    assert "not exactly once" in heavy_row[0] and heavy_row[1].startswith("**missed**")
    assert next(v for k, v in table.items() if k.startswith("alert-heavy: the last"))[1] == "**missed** by 1.25× |"
    book = next(v for k, v in table.items() if "publish→book" in k)
    assert book == ["12.5 ms; the broker's floor p99 3.5 ms", "**missed** by 2.50× |"]
    assert next(v for k, v in table.items() if "publish→alert" in k)[1] == "met (1.25× under) |"
    light = Results(paced={100: (None, Paced("engine", 5_000, latency={"book": {"p99": 1.0}}))})
    assert "| not judged: offered 5,000 events/s, the target's load is 100,000 |" in verdict_rows(light)[7]
    cpu = next(v for k, v in table.items() if "(low-alert msgpack)" in k)
    assert cpu == ["1.40 µs at 500,000 events/s", "met (5.71× under) |"]  # the bench's own process not counted
    assert next(v for k, v in table.items() if k.startswith("the engine step"))[1] == "**missed** by 1.10× |"


def test_the_writer_replaces_only_the_generated_section(tmp_path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(f"# B\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nanalysis\n")
    write(path, f"{BEGIN}\nnew table\n{END}")
    text = path.read_text()
    assert "new table" in text and "old table" not in text and "intro" in text and "analysis" in text


def test_bench_quick_smoke_run_writes_every_row_with_correct_alerts(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(ALDEBARAN_MANAGEMENT_URL=services.MANAGEMENT_URL, ALDEBARAN_REDIS_URL=services.REDIS_URL,
               ALDEBARAN_AMQP_URL=services.AMQP_URL, ALDEBARAN_LOG_FORMAT="json")
    try:  # under pytest's own 300 s, so that a wedged bench says where it was
        result = subprocess.run(
            [sys.executable, "-m", "aldebaran.cli", "bench", "--quick", "--systems", "raw,handwritten,engine,engine2",
             "--output", str(tmp_path)], env=env, capture_output=True, text=True, timeout=270)
    except subprocess.TimeoutExpired as exc:
        # The tail: the rows done, then the stage the bench was waiting in (stderr).
        raise AssertionError(f"the bench hung: {str(exc.stdout)[-3000:]} {str(exc.stderr)[-3000:]}") from exc
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "benchmarks.md").read_text()
    assert "aldebaran bench --quick" in report
    rows = [line for line in report.splitlines()
            if line.startswith("| ") and any(cell.strip().startswith("engine") for cell in line.split("|")[1:3])]
    # Three drains, each by one engine and by two partitioned ones, then the paced runs.
    assert len(rows) == 8, report
    assert [("2 processes, partitioned" in row) for row in rows[:6]] == [False, True] * 3, rows
    assert "in 1000-event messages" in rows[6] and "in 100-event messages" in rows[7], rows[6:]
    floors = [line for line in report.splitlines() if line.startswith("| broker floor")]
    assert len(floors) == 2, report  # the broker's own publish -> delivered under each paced load
    for row in floors:  # every message delivered and stamped: a p50 of the floor is a number
        cells = row.split("|")
        assert (float(cells[4].split("/")[0]) >= 0
                and (cells[5].strip(), cells[6].strip()) == ("– / –", "– / – / –")), row
    for row in rows[6:]:  # each message is delivered, then its cycle starts, then it is in its book
        delivered, started = (float(part) for part in row.split("|")[5].split("/"))
        assert 0 <= delivered <= started <= float(row.split("|")[4].split("/")[2]), row
    for row in rows[:6]:  # correctness, not speed: every alert once, none wrong
        ok, wrong, missing, dup = (cell.strip() for cell in row.split("|")[7].split("/"))
        assert (wrong, missing, dup) == ("0", "0", "0") and int(ok.replace(",", "")) > 0, row
    assert re.search(r"The engine step alone .*: \d+\.\d\d µs of CPU per event in 1000-event msgpack", report)
    for row in rows[4:6]:  # alert-heavy: both channels got every alert once
        assert "queue-api" in row and "0 repeated" in row, row
    verdicts = report[report.index("| target (issue 17) |"):].splitlines()
    heavy = next(line for line in verdicts if line.startswith("| alert-heavy: ≥"))
    assert "every alert once at both channels" in heavy, heavy  # judged from the channels' own counts
    paced = [line for line in verdicts if line.startswith("| paced at")]
    assert len(paced) == 4 and "the broker's floor p99" in paced[0], paced


def test_the_bench_s_workers_run_the_code_the_bench_was_imported_from(tmp_path) -> None:
    """`python -m` puts its working directory first on the path: an `aldebaran` package there
    would be what a worker imports, whatever tree the bench itself runs."""
    from aldebaran.bench.environment import pin_workers

    shadow = tmp_path / "aldebaran"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('the shadow package')\n")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    command = [sys.executable, "-m", "aldebaran.cli", "--help"]
    unpinned = subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60)
    assert "the shadow package" in unpinned.stderr  # the hazard is real
    pin_workers(environ)
    pinned = subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60)
    assert pinned.returncode == 0 and "usage: aldebaran" in pinned.stdout, pinned.stderr
    assert environ["PYTHONPATH"].split(os.pathsep)[0] == str(Path(aldebaran.__file__).resolve().parents[1])
