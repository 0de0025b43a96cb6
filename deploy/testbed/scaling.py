#!/usr/bin/env python3
"""Scaling figure on the private three-node cluster: events/s with 1, 2 and 4 book workers.

    .venv/bin/python deploy/testbed/scaling.py [--workers 1,2,4] [--seconds 20] [--raw]

Starts its own test bed (deploy/testbed/cluster.py, free ports, management plugin on),
then runs `aldebaran bench`'s own pipeline phase (aldebaran/bench/phases.py: `aldebaran
up` on a fresh vhost, the generated workload in 1000-event msgpack messages, sustained
rate = first publish -> last event in a book, alerts checked against the generator's)
once per worker count, in the sharded mode (`up --aggregators 1 --book-workers M`),
with every queue quorum (3 replicas) and every client given all three node URLs. The
only difference from `aldebaran bench` is where it runs: the bench's `Place` (one vhost
on one broker) is swapped for one that spreads the cluster's URLs. The cluster's CPU
(the three beam processes) is metered beside the workers'. Prints a table and writes
`--json`; the bed is always stopped and removed at the end (also on failure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster  # noqa: E402

from aldebaran.bench import environment, phases  # noqa: E402
from aldebaran.bench.workload import build  # noqa: E402
from aldebaran.settings import Settings  # noqa: E402


def cluster_place(urls: list[str]) -> type:
    """A bench `Place` whose settings and workers know every node of the cluster."""

    class ClusterPlace(environment.Place):
        def _urls(self) -> list[str]:
            return [u.rstrip("/") + "/" + quote(self.vhost, safe="") for u in urls]

        def settings(self, **overrides: object) -> Settings:
            return super().settings(**overrides).model_copy(update={"amqp_urls": self._urls()})

        def env(self, **extra: str) -> dict[str, str]:
            env = super().env(**extra)
            env.update(ALDEBARAN_AMQP_URLS=json.dumps(self._urls()), ALDEBARAN_QUEUE_TYPE="quorum")
            return env

    return ClusterPlace


class BrokerCpu:
    """CPU seconds of the cluster's nodes (each node's process group) over a run."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def _total(self) -> float:
        total = 0.0
        for node in self.cluster.nodes:
            if not node.pid:
                continue
            try:
                root = psutil.Process(node.pid)
                for proc in [root, *root.children(recursive=True)]:
                    times = proc.cpu_times()
                    total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def __enter__(self) -> "BrokerCpu":
        self.start, self.t0 = self._total(), time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.cores = (self._total() - self.start) / (time.perf_counter() - self.t0)


async def declare_rate(url: str, arguments: dict[str, object], count: int, channels: int = 10) -> float:
    """Per-order book queues declared per second (over `channels` channels), then deleted."""
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        pool = [await connection.channel() for _ in range(channels)]
        names = [f"scaling-book-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)]
        started = time.perf_counter()

        async def lane(k: int) -> None:
            for name in names[k::channels]:
                await pool[k].declare_queue(name, durable=True, arguments=arguments)
        await asyncio.gather(*(lane(k) for k in range(channels)))
        rate = count / (time.perf_counter() - started)
        for k, name in enumerate(names):
            await pool[k % channels].queue_delete(name)
        return rate
    finally:
        await connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="book-worker process counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="publishing time per run")
    parser.add_argument("--orders", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--raw", action="store_true", help="also measure the broker ceiling (bench phase a)")
    parser.add_argument("--declares", type=int, default=0, metavar="N",
                        help="also time N per-order book queue declares, quorum vs classic")
    parser.add_argument("--per-order", type=int, default=0, metavar="EVENTS",
                        help="also run the per-order mode (1 process) on this many events")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    bed = Cluster(root=Path(tempfile.mkdtemp(prefix="aldebaran-scaling-")), base_port=0, management=True,
                  prefix=f"aldscale{uuid.uuid4().hex[:6]}-c")
    rows: list[dict[str, object]] = []
    load0 = os.getloadavg()
    with bed.running():
        print(f"cluster of 3 formed in {bed.formed_in:.1f}s", flush=True)
        first = bed.nodes[0]
        base = Settings(amqp_url=first.url, amqp_urls=bed.urls, queue_type="quorum", shards=args.shards,
                        management_url=f"http://guest:guest@127.0.0.1:{first.management_port}/")
        phases.Place = cluster_place(bed.urls)  # the only change: where the phase runs
        workload = build(args.orders, args.batch)
        last = [0.0]

        def progress(name: str, done: int, total: int | None) -> None:
            if time.monotonic() - last[0] > 5:
                last[0] = time.monotonic()
                print(f"  {name}: {done:,}" + (f"/{total:,}" if total else ""), flush=True)

        if args.declares:
            from declare.topology import book_queue_arguments

            for queue_type in ("classic", "quorum"):
                arguments = book_queue_arguments(base.model_copy(update={"queue_type": queue_type}))
                rate = asyncio.run(declare_rate(first.url, arguments, args.declares))
                row = {"run": f"per-order book queue declares, {queue_type}", "declares_per_s": round(rate)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        runs: list[tuple[str, int]] = ([("raw", 0)] if args.raw else [])
        runs += [("per-order", 1)] if args.per_order else []
        runs += [("sharded", int(n)) for n in args.workers.split(",")]
        for kind, workers in runs:
            with BrokerCpu(bed) as broker:
                if kind == "raw":
                    result = asyncio.run(phases.raw_ceiling(base, workload, progress))
                elif kind == "per-order":
                    result = asyncio.run(phases.pipeline(
                        base, workload, progress, name="per-order (iteration 5), 1 process", mode="per-order",
                        max_events=args.per_order, ttl=args.ttl))
                else:
                    result = asyncio.run(phases.pipeline(
                        base, workload, progress, name=f"sharded, router + {workers} book workers",
                        mode="sharded", aggregators=1, book_workers=workers, seconds=args.seconds, ttl=args.ttl))
            row = {"run": result.name, "book_workers": workers, "events": result.events,
                   "seconds": round(result.seconds, 2), "events_per_s": round(result.rate),
                   "worker_cpu": {k: round(v, 2) for k, v in result.cpu.items()},
                   "broker_cores": round(broker.cores, 2),
                   "alerts": f"{result.correct}/{result.expected} ok, {result.wrong} wrong, "
                             f"{result.missing} missing, {result.duplicates} dup" if result.expected else "-",
                   "load": [round(x, 2) for x in os.getloadavg()]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nload average before {load0[0]:.2f}/{load0[1]:.2f}; {os.cpu_count()} cores; batch {args.batch}; "
          f"shards {args.shards}; quorum queues, 3 replicas")
    print(f"{'run':42} {'events':>9} {'events/s':>9} {'broker cores':>12}  worker CPU")
    for row in rows:
        if "declares_per_s" in row:
            print(f"{row['run']:42} {row['declares_per_s']:>9,} declares/s")
            continue
        print(f"{row['run']:42} {row['events']:>9,} {row['events_per_s']:>9,} {row['broker_cores']:>12}  "
              f"{row['worker_cpu']}  {row['alerts']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
