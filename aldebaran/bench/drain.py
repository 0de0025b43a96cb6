"""The prefilled drain: fill the ingress with a workload, then time a consumer emptying it.

Every system in the side-by-side table is measured the same way: the queue holds the
whole workload before the consumer starts; the clock and the CPU meter (the consumer's
processes, RabbitMQ, Redis) start at its first processed message and stop when it has
processed every event, so start-up is not timed and CPU µs per event compare like with
like. Alerts are then checked against the generator's expected set.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiormq
import aiormq.abc
import msgspec
from pamqp import commands as spec

from aldebaran.bench.environment import CpuMeter, Place, free_ports, start_worker, stop_process
from aldebaran.bench.metrics_scrape import scrape, total
from aldebaran.io.alert_bus import split_alerts
from aldebaran.io.publisher import Body
from declare.declarer import declare_async
from declare.topology import ALERT, TRADE_DATA

TAP = "bench.alert-tap"
FILL_WINDOW = 200
POLL_SECONDS = 0.1


@dataclass
class Drain:
    """What one drained run measured."""

    name: str
    events: int = 0
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # label -> cores over the run
    alerts: Counter[str] | None = None  # None: this system computes no alerts
    # Seconds from the last event processed to the last alert out that an event fires (over_purchase).
    last_alert_after: float | None = None
    delivered_once: bool | None = None  # with channels: every alert landed once at each, nothing else
    note: str = ""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def cpu_us_per_event(self) -> dict[str, float]:
        """Machine CPU per event, per process kind (µs): cores x seconds / events."""
        if not self.events:
            return {}
        return {label: cores * self.seconds / self.events * 1e6 for label, cores in self.cpu.items()}


async def fill(place: Place, bodies: Sequence[Body]) -> None:
    """Declare the topology, then publish every body (persistent, confirmed) before the clock starts."""
    connection = await aiormq.connect(place.amqp_url)
    try:
        channel = await connection.channel()
        from aio_pika import connect

        declarer = await connect(place.amqp_url)
        await declare_async(await declarer.channel(), place.settings())
        await declarer.close()
        await channel.confirm_delivery()
        slots = asyncio.Semaphore(FILL_WINDOW)

        async def send(body: Body) -> None:
            async with slots:
                confirm = await channel.basic_publish(
                    body.data, exchange=TRADE_DATA, routing_key=TRADE_DATA,
                    properties=spec.Basic.Properties(delivery_mode=2, content_type=body.content_type))
                if not isinstance(confirm, spec.Basic.Ack):
                    raise RuntimeError(f"prefill refused: {confirm!r}")

        await asyncio.gather(*(send(body) for body in bodies))
    finally:
        await connection.close()


async def tap(place: Place, received: Counter[str], seen_at: list[float]) -> aiormq.abc.AbstractConnection:
    """Count every alert on `Aldebaran.Alert` (both forms) by alert id, and when each message
    holding an `over_purchase` came (fired by an event; the others fire at book close)."""
    connection = await aiormq.connect(place.amqp_url)
    channel = await connection.channel()
    await channel.queue_declare(TAP, durable=False, exclusive=True)
    await channel.queue_bind(TAP, ALERT, routing_key=ALERT)
    decoder = msgspec.json.Decoder()

    async def on_alert(message: aiormq.abc.DeliveredMessage) -> None:
        fired = False
        for raw in split_alerts(message.body):
            alert_id = decoder.decode(raw)["alert_id"]
            received[alert_id] += 1
            fired |= alert_id.startswith("over_purchase:")
        if fired:
            seen_at.append(time.monotonic())

    await channel.basic_consume(TAP, on_alert, no_ack=True)
    return connection


async def peer_drain(place: Place, kind: str, name: str, bodies: Sequence[Body], events: int,
                     workdir: Path) -> Drain:
    """One of `aldebaran.bench.peers` draining the fill in its own process."""
    result = Drain(name)
    await fill(place, bodies)
    path = workdir / f"{kind}-{place.vhost}.json"
    with open(workdir / f"{kind}-{place.vhost}.err", "wb") as errors:  # the peer keeps its own copy
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aldebaran.bench.peers", kind, place.amqp_url, str(events), str(path),
            stdout=asyncio.subprocess.PIPE, stderr=errors)
    meter = CpuMeter()
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), timeout=120)
        if line.strip() != b"started":
            raise RuntimeError(f"{kind} did not start: {line!r}")
        meter.start([process.pid])
        line = await asyncio.wait_for(process.stdout.readline(), timeout=3600)
        result.cpu = meter.stop()
        if line.strip() != b"done":
            raise RuntimeError(f"{kind} failed: {(workdir / f'{kind}-{place.vhost}.err').read_text()[-2000:]}")
    finally:
        if process.returncode is None:
            await process.wait()
    measured = json.loads(path.read_text())
    result.events, result.seconds = measured["events"], measured["seconds"]
    if measured["alerts"] is not None:
        result.alerts = Counter(measured["alerts"])
    return result


async def engine_drain(place: Place, bodies: Sequence[Body], events: int, *, ttl: float, workdir: Path,
                       delivery: bool = False, env: dict[str, str] | None = None, processes: int = 1) -> Drain:
    """`aldebaran run engine` draining the fill; with `delivery`, the lookout and two channel
    workers (queue-api and amqp) run beside it and the alerts are counted where they land.
    With `processes` > 1, that many partitioned engines share the books (docs/engine.md)."""
    from aldebaran.bench.delivery import Delivery

    plural = "process" if processes == 1 else "processes, partitioned"
    result = Drain(f"engine, {processes} {plural}" + (" (+ lookout, queue-api and amqp channels)" if delivery else ""))
    await fill(place, bodies)
    received: Counter[str] = Counter()
    seen: list[float] = []
    connection = await tap(place, received, seen)
    full_env = place.env(ALDEBARAN_BOOK_TTL_SECONDS=str(ttl), ALDEBARAN_LOG_LEVEL="warning",
                         ALDEBARAN_ENGINE__PARTITIONS=str(processes), **(env or {}))
    extra = Delivery(place, workdir, full_env) if delivery else None
    meter = CpuMeter()
    workers: list[asyncio.subprocess.Process] = []
    try:
        if extra is not None:
            await extra.start()
        ports = [free_ports(1) for _ in range(processes)]
        # Started at once; the clock runs from the first that consumes (the others' start counts).
        starts = [asyncio.ensure_future(_start_engine(place, workdir, port, partition, workers,
                                                      extra.env if extra else full_env))
                  for partition, port in enumerate(ports)]
        await next(asyncio.as_completed(starts))
        meter.start([*(w.pid for w in workers), *(extra.pids if extra else [])])  # every engine is spawned
        started = time.monotonic()
        await asyncio.gather(*starts)
        _stage(result.name, "consuming")
        result.seconds = await _processed(ports, workers, events) - started
        result.cpu = meter.stop()
        result.events = events
        finished = time.monotonic()
        _stage(result.name, f"drained; books close within {ttl + 2:g} s")
        await asyncio.sleep(ttl + 2)  # books close: purchase_without_request comes after their ttl
        result.alerts = received
        if extra is not None:
            _stage(result.name, f"waiting up to {ttl + 120:g} s for {len(received):,} alerts at both channels")
            landed = await extra.wait_landed(set(received), timeout=ttl + 120)
            result.note = extra.summary(set(received))
            result.delivered_once = extra.once(set(received))
            # over_purchase fires on an event: its tail is the column. purchase_without_request
            # fires at book close, a ttl after its order's first event (at most the last event's time).
            fired = extra.last_of_kind.get("over_purchase")
            result.last_alert_after = (fired if fired is not None else landed) - finished
            closing = extra.last_of_kind.get("purchase_without_request")
            if closing is not None:
                result.note += (f"; the last purchase_without_request (fired at book close, ttl {ttl:g} s) "
                                f"landed {closing - finished:.2f} s after the last event, "
                                f"{closing - finished - ttl:+.2f} s from the last book's latest close")
        elif seen:
            result.last_alert_after = max(seen) - finished
    finally:
        await asyncio.gather(*(stop_process(worker) for worker in workers))
        if extra is not None:
            await extra.stop()  # the lookout and channels too, whatever failed on the way
        await connection.close()
    return result


def _stage(name: str, what: str) -> None:
    """Where a drain is, on stderr: a bench that seems to hang says which wait it is in."""
    print(f"    {name}: {what}", file=sys.stderr, flush=True)


async def _start_engine(place: Place, workdir: Path, port: int, partition: int,
                        workers: list[asyncio.subprocess.Process], env: dict[str, str]) -> None:
    """One engine process (owning `partition` when partitioned) in `workers`; returns once it consumes."""
    ready = ReadySocket(workdir / f"notify-{place.vhost}-{partition}")
    worker = await start_worker(["engine", "--metrics-port", str(port)],
                                workdir / f"engine-{place.vhost}-{partition}.log",
                                dict(env, NOTIFY_SOCKET=str(ready.path), ALDEBARAN_ENGINE__PARTITION=str(partition)))
    workers.append(worker)
    await ready.wait(worker)


async def _processed(ports: list[int], workers: list[asyncio.subprocess.Process], events: int,
                     stall: float = 120.0) -> float:
    """Poll the engines' book-event counters until their sum reaches `events`; when it did (monotonic).
    A counter that stands still for `stall` seconds is an error, not a wait forever.

    Polls are spaced by half the time the rate so far says is left (at least `POLL_SECONDS`,
    at most half a second): a scrape renders every metric in the engine's process, and ten a
    second were ~4 % of its samples, taken from the run being measured."""
    last, moved, started = -1.0, time.monotonic(), time.monotonic()
    while True:
        done = total(await asyncio.to_thread(scrape, ports), "aldebaran_book_events_total")
        now = time.monotonic()
        if done >= events:
            return now
        for worker in workers:
            if worker.returncode is not None:
                raise RuntimeError(f"the engine exited with {worker.returncode}")
        if done != last:
            last, moved = done, now
        elif now - moved > stall:
            raise RuntimeError(f"the engine stalled at {done:,.0f} of {events:,} events for {stall:.0f} s")
        left = (events - done) * (now - started) / done if done > 0 else POLL_SECONDS
        await asyncio.sleep(min(0.5, max(POLL_SECONDS, left / 2)))


class ReadySocket:
    """The sd_notify socket a worker says READY=1 on once it consumes (start-up is not timed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    async def wait(self, process: asyncio.subprocess.Process, timeout: float = 120) -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    raise RuntimeError(f"the worker exited with {process.returncode}")
                try:
                    data = await asyncio.wait_for(loop.sock_recv(self.sock, 4096), timeout=0.5)
                except TimeoutError:
                    continue
                if b"READY=1" in data:
                    return
            raise RuntimeError("the worker did not say READY=1")
        finally:
            self.sock.close()
