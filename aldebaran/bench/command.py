"""`aldebaran bench`: every mode side by side, on the same generated events, in one session.

(a) the raw broker ceiling at the same batching, (b) a naive one-event-per-message
baseline, (c) the iteration-5 per-order mode, (d) the sharded mode at 1 and 2 worker
processes, then (e) a fixed-rate latency run. Writes docs/benchmarks.md and
docs/benchmarks.png with the command that produced them. Figures, never assertions.
`--scenario overload` runs the overload scenario instead (aldebaran/bench/overload.py)
and writes its own section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from aldebaran.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console

    from aldebaran.bench.workload import Workload

PHASES = ("raw", "naive", "per-order", "sharded-1", "sharded-2", "latency")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmark every mode side by side and write docs/benchmarks.md")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few seconds per phase")
    parser.add_argument("--orders", type=int, default=120_000, help="orders in the generated base stream")
    parser.add_argument("--batch", type=int, default=1000, help="events per ingress AMQP message")
    parser.add_argument("--seconds", type=float, default=60.0, help="publishing time of each sharded run")
    parser.add_argument("--naive-events", type=int, default=40_000)
    parser.add_argument("--per-order-events", type=int, default=15_000)
    parser.add_argument("--latency-rate", type=float, default=100_000, help="offered events/s of the latency run")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--ttl", type=float, default=10.0, help="book_ttl_seconds of the pipeline runs")
    parser.add_argument("--shards", type=int, help="shard queues (default: the settings' shards)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    parser.add_argument("--scenario", choices=("modes", "overload"), default="modes",
                        help="modes: every mode side by side (the phases); overload: 2x capacity, then 0.5x "
                             "until p99 recovers, in the sharded 2-process layout")
    parser.add_argument("--capacity", type=float, default=0.0,
                        help="overload: the pipeline's capacity in events/s (default: measure it first)")
    parser.add_argument("--calibrate-seconds", type=float, default=60.0,
                        help="overload: capacity measurement: this long at saturation, then its drain")
    parser.add_argument("--baseline-seconds", type=float, default=20.0,
                        help="overload: time at the recovery load right before the surge (the p99 to recover to)")
    parser.add_argument("--surge-seconds", type=float, default=60.0, help="overload: time at 2x capacity")
    parser.add_argument("--surge-factor", type=float, default=2.0)
    parser.add_argument("--recovery-factor", type=float, default=0.5)
    parser.add_argument("--recovery-timeout", type=float, default=300.0,
                        help="overload: longest wait at the recovery load for p99 under 5 ms")
    parser.add_argument("--output", default="docs", help="directory of benchmarks.md / benchmarks.png")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from aldebaran.bench import phases as ph
    from aldebaran.bench.report import markdown, plot, write_markdown
    from aldebaran.bench.workload import build

    if args.quick:
        args.orders, args.seconds, args.naive_events = min(args.orders, 1500), min(args.seconds, 2.0), 1000
        args.per_order_events, args.latency_seconds, args.ttl = 500, min(args.latency_seconds, 2.0), 3.0
        args.latency_rate = min(args.latency_rate, 20_000)
        args.calibrate_seconds, args.surge_seconds = min(args.calibrate_seconds, 3.0), min(args.surge_seconds, 3.0)
        args.recovery_timeout = min(args.recovery_timeout, 15.0)
        args.baseline_seconds = min(args.baseline_seconds, 3.0)
    updates: dict[str, object] = {}
    if args.shards:
        updates["shards"] = args.shards
    settings = settings.model_copy(update=updates)
    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(wanted) - set(PHASES)
    if unknown:
        print(f"aldebaran bench: unknown phases {sorted(unknown)}", file=sys.stderr)
        return 64
    console = Console(stderr=True)
    load = os.getloadavg()
    console.print(f"generating {args.orders:,} orders (batch {args.batch}); load {load[0]:.2f} {load[1]:.2f}")
    workload = build(args.orders, args.batch)
    if args.scenario == "overload":
        return _overload(args, settings, workload, console, load)
    results: list[ph.Result] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f} events"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        report = _reporter(progress)
        common = dict(ttl=args.ttl)
        for phase in wanted:
            if phase == "raw":
                results.append(asyncio.run(ph.raw_ceiling(settings, workload, report)))
            elif phase == "naive":
                results.append(ph.naive(settings, workload, args.naive_events, report))
            elif phase == "per-order":
                results.append(asyncio.run(ph.pipeline(
                    settings, workload, report, name="per-order (iteration 5)", mode="per-order",
                    max_events=args.per_order_events, **common)))
            elif phase == "sharded-1":
                results.append(asyncio.run(ph.pipeline(
                    settings, workload, report, name="sharded, 1 process", mode="sharded",
                    seconds=args.seconds, **common)))
            elif phase == "sharded-2":
                results.append(asyncio.run(ph.pipeline(
                    settings, workload, report, name="sharded, 2 processes (router + books)", mode="sharded",
                    aggregators=1, book_workers=1, seconds=args.seconds, **common)))
            elif phase == "latency":
                results.append(asyncio.run(ph.pipeline(
                    settings, workload, report, name="sharded, 2 processes, fixed rate", mode="sharded",
                    aggregators=1, book_workers=1, seconds=args.latency_seconds, rate=args.latency_rate,
                    **common)))
    table = Table(title="aldebaran bench")
    for column in ("mode", "events", "events/s", "p50/p95/p99/max ms (book)", "p99 alert ms", "CPU", "alerts"):
        table.add_column(column)
    for r in results:
        stage = "consumed" if "consumed" in r.latency else "book"
        lat = r.latency.get(stage) or {}
        table.add_row(r.name + (f" @{r.offered:,.0f}/s" if r.offered else ""), f"{r.events:,}", f"{r.rate:,.0f}",
                      " / ".join(f"{lat.get(k, 0):.1f}" for k in ("p50", "p95", "p99", "max")) if lat else "–",
                      f"{(r.latency.get('alert') or {}).get('p99', 0):.1f}",
                      ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05),
                      f"{r.correct}/{r.expected} ok, {r.wrong} wrong, {r.missing} missing, {r.duplicates} dup"
                      if r.expected else "–")
    Console().print(table)
    end_load = os.getloadavg()
    command = _command()
    context = (f"{_when(load, end_load)}; shards {settings.shards}, "
               f"ingress batch {args.batch} events (msgpack), router batch ≤ {settings.batch_max_events} events "
               f"or {settings.batch_linger_ms} ms, book ttl {args.ttl} s.")
    if not args.no_write:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        write_markdown(out / "benchmarks.md", markdown(results, command, context))
        plot(results, out / "benchmarks.png")
        console.print(f"wrote {out / 'benchmarks.md'} and {out / 'benchmarks.png'}")
    return 0


def _reporter(progress: Any) -> Callable[[str, int, int | None], None]:
    """One rich progress bar per named step of a phase."""
    tasks: dict[str, Any] = {}

    def report(name: str, done: int, total: int | None) -> None:
        if name not in tasks:
            tasks[name] = progress.add_task(name, total=total)
        progress.update(tasks[name], completed=done, total=total)

    return report


def _command() -> str:
    return "aldebaran bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])


def _when(load: tuple[float, float, float], end_load: tuple[float, float, float]) -> str:
    """When and how busy: the machine is shared, so the load average belongs next to every figure."""
    return (f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores; "
            f"load average before {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, after "
            f"{end_load[0]:.2f}/{end_load[1]:.2f}/{end_load[2]:.2f}")


def _overload(args: argparse.Namespace, settings: Settings, workload: Workload, console: Console,
              load: tuple[float, float, float]) -> int:
    """`--scenario overload`: run it, print the figures, write its own section of benchmarks.md."""
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from aldebaran.bench.overload import overload
    from aldebaran.bench.report import overload_markdown, write_markdown

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        report = _reporter(progress)
        result = asyncio.run(overload(
            settings, workload, report, capacity=args.capacity, calibrate_seconds=args.calibrate_seconds,
            surge_seconds=args.surge_seconds, surge_factor=args.surge_factor,
            recovery_factor=args.recovery_factor, recovery_timeout=args.recovery_timeout, ttl=args.ttl,
            baseline_seconds=args.baseline_seconds))
    context = (f"{_when(load, os.getloadavg())}. Sharded mode, `up --aggregators 1 --book-workers 1` (router "
               f"and shard book worker in their own processes, lookout in `up`); shards {settings.shards}, ingress "
               f"batch {args.batch} events (msgpack), book ttl {args.ttl} s, max_rss_mib {settings.max_rss_mib}.")
    block = overload_markdown(result, _command(), context)
    Console().print(Markdown(block))
    if not args.no_write:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        write_markdown(out / "benchmarks.md", block)
        console.print(f"wrote the overload section of {out / 'benchmarks.md'}")
    return 0
