"""`aldebaran bench`: the engine beside its peers, on the same prefilled queues, in one session.

Per workload (low-alert as 1000-event msgpack and as 100-event JSON; alert-heavy with the
lookout and two channels delivering), each system drains the same prefilled ingress:
the raw broker ceiling, a hand-written batched pika consumer, Bytewax (skipped when not
installed: `pip install 'aldebaran[bench]'`), and the engine. Each runs `--rounds` times;
the table shows the median. Then the engine paced at a fixed offered rate, for latency.
Writes the generated section of docs/benchmarks.md with this command. Figures, never
assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aldebaran.settings import Settings

if TYPE_CHECKING:  # the bench's modules load when the command runs
    from aldebaran.bench.drain import Drain
    from aldebaran.bench.targets import Results
    from aldebaran.bench.workload import Workload
    from aldebaran.io.publisher import Body

SYSTEMS = ("raw", "handwritten", "bytewax", "engine", "engine2")
WORKLOADS = ("msgpack", "json", "alert-heavy", "sustained", "paced")
NAMES = {"raw": "raw broker ceiling (consume + ack)", "handwritten": "hand-written batched pika consumer",
         "bytewax": "Bytewax 0.21, keyed stateful_map, 1 worker"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="the engine beside its peers; writes docs/benchmarks.md")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few seconds")
    parser.add_argument("--events", type=int, default=3_000_000, help="events per drain")
    parser.add_argument("--sustained-events", type=int, default=32_000_000,
                        help="events of the engine's sustained low-alert drain (0 = skip)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per system and workload (median shown)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}")
    parser.add_argument("--paced-rate", type=float, default=100_000, help="offered events/s of the paced run")
    parser.add_argument("--paced-seconds", type=float, default=20.0)
    parser.add_argument("--ttl", type=float, default=10.0, help="book_ttl_seconds of the engine runs")
    parser.add_argument("--output", default="docs", help="directory of benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print the tables only")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    if args.quick:
        args.events, args.sustained_events, args.rounds = 20_000, 0, 1
        args.paced_rate, args.paced_seconds, args.ttl = 5_000, 2.0, 2.0
    from aldebaran.bench.environment import pin_workers

    pin_workers(os.environ)
    return asyncio.run(_bench(args, settings))


async def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from aldebaran.bench import table
    from aldebaran.bench.targets import Results
    from aldebaran.bench.workload import build, prefix
    from aldebaran.trades.generator import expected_alerts

    systems = [s for s in args.systems.split(",") if s]
    chosen = {w for w in args.workloads.split(",") if w}
    if chosen - set(WORKLOADS):
        known = ",".join(WORKLOADS)
        print(f"unknown workloads {sorted(chosen - set(WORKLOADS))}; choose from {known}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    notes: list[str] = []
    if "bytewax" in systems and importlib.util.find_spec("bytewax") is None:
        systems.remove("bytewax")
        notes.append("Bytewax: skipped (not installed; `pip install 'aldebaran[bench]'`)")
    orders = max(200, args.events // 4)
    workdir = Path(tempfile.mkdtemp(prefix="aldebaran-bench-"))
    low = build(orders, batch=1000, over_share=0.01, orphans=0.0)
    msgpack_bodies = _msgpack_prefix(low, args.events)
    low_events = sum(b.events for b in msgpack_bodies)
    json_bodies, low_expected, json_events = prefix(low, low_events, batch=100)
    drains: list[str] = []
    results = Results()
    workloads = [("msgpack", "low-alert, 1000-event msgpack", msgpack_bodies, low_events, low_expected, False),
                 ("json", "low-alert, 100-event JSON", json_bodies, json_events, low_expected, False)]
    if "alert-heavy" in chosen:  # built only when drained: its expected set alone takes minutes at 3M events
        heavy = build(orders, batch=1000, over_share=0.35, orphans=0.02)
        heavy_bodies = _msgpack_prefix(heavy, args.events)
        heavy_events = sum(b.events for b in heavy_bodies)
        workloads.append(("alert-heavy", "alert-heavy, 1000-event msgpack", heavy_bodies, heavy_events,
                          expected_alerts(heavy.events[:heavy_events]), True))
    for key, label, bodies, events, expected, delivery in workloads:
        if key not in chosen:
            continue
        runs = await _workload(settings, args, systems, label, bodies, events, delivery, workdir)
        results.drains[key], results.expected[key] = runs, expected
        drains += table.drain_rows(label, runs, {run.name: _expected_for(run.name, expected) for run in runs})
        _print(drains[-len(runs):])
    if args.sustained_events and "engine" in systems and "sustained" in chosen:
        sustained = await _sustained(settings, args, low, workdir)
        results.drains["sustained"], results.expected["sustained"] = [sustained[0]], sustained[1]
        drains += table.drain_rows("low-alert, 1000-event msgpack, sustained", [sustained[0]],
                                   {sustained[0].name: sustained[1]})
        _print(drains[-1:])
    paced_rows = await _paced_rows(settings, args, systems, low, workdir, results) if "paced" in chosen else []
    notes += _notes(args)
    if "engine" in systems:
        line, results.step_us = _pure_note(settings, msgpack_bodies, json_bodies)
        notes.append(line)
    _report(args, load_before, drains, paced_rows, notes, results)
    return 0


def _report(args: argparse.Namespace, load_before: tuple[float, float, float], drains: list[str],
            paced_rows: list[str], notes: list[str], results: Results) -> None:
    """The verdicts against the targets printed; the tables, verdicts and notes written (unless --no-write)."""
    from aldebaran.bench import table, targets

    verdicts = targets.rows(results)
    _print(["", targets.HEADER, *verdicts])
    load = "/".join(f"{x:.2f}" for x in load_before) + " before, " + "/".join(f"{x:.2f}" for x in os.getloadavg())
    notes.insert(0, f"Machine: {os.cpu_count()} cores; load average (1/5/15 min) {load} after: the machine is "
                    "shared, so compare rows of one table only.")
    if not args.no_write:
        command = "aldebaran bench " + shlex.join(sys.argv[2:])
        text = table.section(command.strip(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), drains,
                             paced_rows, notes, verdicts)
        Path(args.output).mkdir(parents=True, exist_ok=True)
        table.write(Path(args.output) / "benchmarks.md", text)


async def _paced_rows(settings: Settings, args: argparse.Namespace, systems: list[str], low: Workload,
                      workdir: Path, results: Results) -> list[str]:
    """The engine paced at the offered rate, in 1000-event messages and in 100-event ones (a
    1000-event message takes ~10 ms to fill at 100k events/s; a publisher flushing every
    millisecond sends ~100-event ones; latency is measured from the publish), each after the
    broker's own floor under the same load when `raw` is among the systems; `--rounds` rounds of
    each, alternating, the round with the median p99 shown."""
    from aldebaran.bench import table
    from aldebaran.bench.environment import Place
    from aldebaran.bench.paced import Paced, paced, paced_floor

    rows = []
    for shape in (low, low.rebatched(100)):
        floors: list[Paced] = []
        engines: list[Paced] = []
        for _ in range(args.rounds):  # alternating, so that a noisy minute touches both
            if "raw" in systems:
                with Place(settings) as place:
                    floors.append(await paced_floor(place, shape, args.paced_rate, args.paced_seconds, workdir))
            if "engine" in systems:
                with Place(settings) as place:
                    engines.append(await paced(place, shape, args.paced_rate, args.paced_seconds, args.ttl, workdir))
        floor, engine = (table.median_paced(kind) if kind else None for kind in (floors, engines))
        results.paced[shape.batch] = (floor, engine)
        runs = [run for run in (floor, engine) if run is not None]
        rows += [table.paced_row(run) for run in runs]
        _print(rows[-len(runs):] if runs else [])
    return rows


def _msgpack_prefix(workload: Workload, events: int) -> list[Body]:
    """The workload's own msgpack bodies covering its first `events` events."""
    bodies: list[Body] = []
    total = 0
    for body in workload.bodies:
        if total >= events:
            break
        bodies.append(body)
        total += body.events
    return bodies


def _expected_for(name: str, expected: set[str]) -> set[str]:
    if name.startswith("Bytewax"):
        return {a for a in expected if a.startswith("over_purchase:")}
    return expected


async def _workload(settings: Settings, args: argparse.Namespace, systems: list[str], label: str,
                    bodies: list[Body], events: int, delivery: bool, workdir: Path) -> list[Drain]:
    from aldebaran.bench.drain import engine_drain, peer_drain
    from aldebaran.bench.environment import Place
    from aldebaran.bench.table import median_run

    results: list[Drain] = []
    for system in systems:
        runs: list[Drain] = []
        for _ in range(args.rounds):
            with Place(settings) as place:
                if system in ("engine", "engine2"):  # engine2: two partitioned engine processes
                    runs.append(await engine_drain(place, bodies, events, ttl=args.ttl, workdir=workdir,
                                                   delivery=delivery, processes=2 if system == "engine2" else 1))
                else:
                    runs.append(await peer_drain(place, system, NAMES[system], bodies, events, workdir))
            print(f"  {label}: {runs[-1].name}: {runs[-1].rate:,.0f} events/s", flush=True)
        results.append(median_run(runs))
    return results


async def _sustained(settings: Settings, args: argparse.Namespace, low: Workload,
                     workdir: Path) -> tuple[Drain, set[str]]:
    """The engine alone on relabelled rounds of the low-alert stream: over a minute at 490k/s."""
    from aldebaran.bench.drain import engine_drain
    from aldebaran.bench.environment import Place

    bodies: list[Body] = []
    expected: set[str] = set()
    index = 0
    while sum(b.events for b in bodies) < args.sustained_events and index < low.max_rounds:
        bodies += low.round_bodies(index)
        expected |= low.round_expected(index)
        index += 1
    with Place(settings) as place:
        run = await engine_drain(place, bodies, sum(b.events for b in bodies), ttl=args.ttl, workdir=workdir)
    run.note = f"{run.seconds:.0f} s of draining; " + run.note
    return run, expected


def _notes(args: argparse.Namespace) -> list[str]:
    return [
        f"Each drain: the queue is prefilled (persistent messages) before the consumer starts; the clock and the "
        f"CPU meter run from its first processed message to its last. {args.rounds} rounds per row, median shown.",
        "CPU µs/event: the system's own processes, then RabbitMQ and Redis over the same span; the bench's own "
        "process (prefill, tap, scraping) is not counted.",
        "hand-written: dicts, dedup by purchase id, acks every 100 messages whatever happened to its alerts "
        "(kept in memory only): no crash safety. Bytewax: the same rule in a keyed stateful_map, over_purchase "
        "only (no per-order window for purchase_without_request), recovery off.",
        "The engine: crash-safe as documented in docs/engine.md: every acked event is in the Redis write-ahead "
        "log, every alert is recorded and confirmed on Aldebaran.Alert before the events that fired it are acked.",
    ]


def _pure_note(settings: Settings, msgpack_bodies: list[Body], json_bodies: list[Body]
               ) -> tuple[str, tuple[float, float]]:
    """The engine step alone (`aldebaran/bench/pure.py`) on the first million events of each shape:
    the note, and µs per msgpack and per JSON event."""
    from aldebaran.bench.pure import cycle_us_per_event

    def first(bodies: list[Body], events: int = 1_000_000) -> list[Body]:
        taken: list[Body] = []
        count = 0
        for body in bodies:
            if count >= events:
                break
            taken.append(body)
            count += body.events
        return taken

    msgpack = cycle_us_per_event(settings, first(msgpack_bodies), per_cycle=1)
    json = cycle_us_per_event(settings, first(json_bodies), per_cycle=8)
    line = (f"The engine step alone (`Engine.cycle`: decode, dedup, books, rule; no broker, no Redis; "
            f"best of 3 over up to 1M events): {msgpack:.2f} µs of CPU per event in 1000-event msgpack "
            f"messages, {json:.2f} in 100-event JSON.")
    print(line, flush=True)
    return line, (msgpack, json)


def _print(rows: list[str]) -> None:
    for row in rows:
        print(row, flush=True)
