"""The paced run: the engine at a fixed offered rate, with publish->book and publish->alert latencies.

The publisher (a process of its own: `paced_publisher`) stamps every message with its publish
time (`x-aldebaran-published-us`); the engine, given a samples directory, records wall-clock
latency per message when its cycle committed (book) and per alert when the batch holding it
was confirmed (alert).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aldebaran.bench.environment import CpuMeter, Place, free_ports, start_worker, stop_process
from aldebaran.bench.metrics_scrape import scrape, total
from aldebaran.bench.paced_publisher import write_bodies
from aldebaran.bench.workload import Workload
from aldebaran.io.latency_samples import read_samples
from aldebaran.io.publisher import Body


@dataclass
class Paced:
    name: str
    offered: float
    events: int = 0
    seconds: float = 0.0
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> p50/p95/p99/max (ms)
    cpu: dict[str, float] = field(default_factory=dict)


def _offered(workload: Workload, events: float) -> list[Body]:
    """Relabelled rounds of the workload's bodies, cut at `events`."""
    bodies: list[Body] = []
    count = 0
    for index in range(workload.max_rounds):
        for position in range(len(workload.bodies)):
            if count >= events:
                return bodies
            body = workload.round_body(index, position)
            bodies.append(body)
            count += body.events
    return bodies


def percentiles(samples: list[tuple[float, float]]) -> dict[str, float]:
    """Weighted p50/p95/p99/max of (value, weight) samples."""
    if not samples:
        return {}
    ordered = sorted(samples)
    grand = sum(w for _, w in ordered)
    marks = [("p50", 0.50), ("p95", 0.95), ("p99", 0.99)]
    result: dict[str, float] = {}
    seen = 0.0
    for value, weight in ordered:
        seen += weight
        while marks and seen >= marks[0][1] * grand:
            result[marks.pop(0)[0]] = value
    result["max"] = ordered[-1][0]
    return result


async def paced(place: Place, workload: Workload, rate: float, seconds: float, ttl: float, workdir: Path) -> Paced:
    """Publish relabelled rounds at `rate` events/s for `seconds` (a publisher process of its
    own, `paced_publisher`); the engine consumes as they come. Its books live at most a quarter
    of the run, so that they close in three quarters of it, as in a long-running engine: at the
    drains' 10 s ttl, nothing closed in the first half of a 20 s run, whose p99 that flattered."""
    ttl = min(ttl, seconds / 4)
    result = Paced(f"engine, paced at {rate:,.0f} events/s offered in {workload.batch}-event messages", rate)
    samples = tempfile.mkdtemp(prefix="aldebaran-bench-", dir=workdir)
    port = free_ports(1)
    env = place.env(ALDEBARAN_BOOK_TTL_SECONDS=str(ttl), ALDEBARAN_LOG_LEVEL="warning",
                    ALDEBARAN_ENGINE__LATENCY_SAMPLES_DIR=samples)
    worker = await start_worker(["engine", "--metrics-port", str(port)], workdir / f"paced-{place.vhost}.log", env)
    try:
        while not scrape([port]):
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # consuming: the metrics server starts before the session

        async def applied(published: int) -> None:
            while total(await asyncio.to_thread(scrape, [port]), "aldebaran_book_events_total") < published:
                await asyncio.sleep(0.1)

        bodies = _offered(workload, rate * seconds)
        await _publish_and_meter(result, place, bodies, worker.pid, Path(samples), applied)
        await asyncio.sleep(1.0)  # the last alert batches confirmed and sampled
    finally:
        await stop_process(worker)
    measured = read_samples(samples)
    result.latency = {stage: percentiles(values) for stage, values in measured.items()}
    return result


async def paced_floor(place: Place, workload: Workload, rate: float, seconds: float, workdir: Path) -> Paced:
    """The same paced load taken by a consumer that only acks (`paced_floor`): the broker's
    publish -> delivered floor beside the engine's publish -> book."""
    from declare.declarer import declare

    result = Paced(f"broker floor (aiormq consume + ack), paced at {rate:,.0f} events/s offered in "
                   f"{workload.batch}-event messages", rate)
    samples = tempfile.mkdtemp(prefix="aldebaran-bench-", dir=workdir)
    await asyncio.to_thread(declare, place.settings(), lambda _: None)
    bodies = _offered(workload, rate * seconds)
    consumer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aldebaran.bench.paced_floor", samples, str(len(bodies)),
        env=place.env(ALDEBARAN_LOG_LEVEL="warning"), stdout=asyncio.subprocess.PIPE)
    try:
        async def said(word: bytes) -> None:
            assert consumer.stdout is not None
            if await asyncio.wait_for(consumer.stdout.readline(), timeout=120) != word + b"\n":
                raise RuntimeError(f"the floor consumer ended early (exit {await consumer.wait()})")

        async def taken(_: int) -> None:
            await said(b"taken")

        await said(b"consuming")  # started and consuming: its start-up is not metered

        await _publish_and_meter(result, place, bodies, consumer.pid, Path(samples), taken)
    finally:
        await stop_process(consumer)
    result.latency = {"book": percentiles(read_samples(samples)["book"])}
    return result


async def _publish_and_meter(result: Paced, place: Place, bodies: list[Body], consumer: int, samples: Path,
                             consumed: Callable[[int], Awaitable[None]]) -> None:
    """Publish `bodies` at the offered rate (the paced publisher) until `consumed(published)`
    returns; the consumer's (`consumer` and its children), RabbitMQ's and Redis's cores over
    that span into `result.cpu`."""
    source = samples / "bodies.msgpack"
    write_bodies(source, bodies)
    meter = CpuMeter()
    meter.start([consumer])
    started = time.monotonic()
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aldebaran.bench.paced_publisher", str(source), str(result.offered),
        env=place.env(ALDEBARAN_LOG_LEVEL="warning"), stdout=asyncio.subprocess.PIPE)
    out, _ = await publisher.communicate()
    if publisher.returncode != 0:
        raise RuntimeError(f"the paced publisher exited with {publisher.returncode}")
    published = int(out.split()[-1])
    await consumed(published)
    result.seconds = time.monotonic() - started
    cores = meter.stop()
    result.cpu = {"consumer": sum(v for k, v in cores.items() if k not in ("rabbitmq", "redis", "bench")),
                  "rabbitmq": cores.get("rabbitmq", 0.0), "redis": cores.get("redis", 0.0)}
    result.events = published
