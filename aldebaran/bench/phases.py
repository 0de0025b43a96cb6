"""The bench's phases, each on its own vhost: raw broker ceiling, naive, per-order, sharded.

Every phase reports the same `Result`, so the table compares like with like: events/s
end to end (first publish -> last event processed), latency percentiles per stage, CPU
per process, events per AMQP message, and the alerts checked against the generator's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable

import aiormq
import httpx
import pika
from prometheus_client.parser import text_string_to_metric_families

from aldebaran.apps.trade_limits import rule as trade_rule
from aldebaran.bench.environment import CpuMeter, Place, free_ports
from aldebaran.bench.samples import read_samples
from aldebaran.bench.workload import Workload, prefix
from aldebaran.core.book import Book, Outcome
from aldebaran.io import amqp
from aldebaran.io.publisher import PUBLISHED_HEADER, Body, publish_bodies
from aldebaran.settings import Settings
from aldebaran.trades.codec import decode_message
from declare.declarer import declare_async
from declare.topology import ALERT, TRADE_DATA

Progress = Callable[[str, int, int | None], None]  # (phase, events done, total)
TAP = "bench.alert-tap"
ALERT_WAIT_SECONDS = 300
PUBLISH_CHUNK = 20  # bodies per publisher connection between backpressure checks: a wait is
# ≈ a chunk of work (≈ 1 s), far under the book ttl, so no order is split across it


EXAMPLES = 5  # wrong and missing alert ids named in a result's note


@dataclass
class Result:
    name: str
    events: int = 0
    seconds: float = 0.0
    offered: float = 0.0  # events/s asked of the publisher (0 = as fast as possible)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_source: str = ""
    cpu: dict[str, float] = field(default_factory=dict)
    batch: dict[str, float] = field(default_factory=dict)
    expected: int = 0
    correct: int = 0
    wrong: int = 0
    missing: int = 0
    duplicates: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def check(self, expected: set[str], received: Counter[str]) -> None:
        self.expected = len(expected)
        self.correct = len(expected & set(received))
        self.wrong = len(set(received) - expected)
        self.missing = len(expected - set(received))
        self.duplicates = sum(n - 1 for n in received.values() if n > 1)
        off = sorted(set(received) - expected)[:EXAMPLES] + sorted(expected - set(received))[:EXAMPLES]
        if off:  # counts alone cannot be diagnosed: name a few
            self.note = "; ".join(filter(None, [self.note, "wrong/missing e.g. " + ", ".join(off)]))


def percentiles(samples: list[tuple[float, float]]) -> dict[str, float]:
    """Weighted p50/p95/p99/max of (value, weight) samples."""
    if not samples:
        return {}
    ordered = sorted(samples)
    total = sum(w for _, w in ordered)
    marks = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
    result: dict[str, float] = {}
    seen = 0.0
    pending = sorted(marks.items(), key=lambda kv: kv[1])
    for value, weight in ordered:
        seen += weight
        while pending and seen >= pending[0][1] * total:
            result[pending.pop(0)[0]] = value
    result["max"] = ordered[-1][0]
    return result


def histogram_percentiles(buckets: list[tuple[float, float]]) -> dict[str, float]:
    """p50/p95/p99 (upper bucket bound, in ms) from cumulative Prometheus buckets (le, count)."""
    buckets = sorted(buckets)
    if not buckets or not buckets[-1][1]:
        return {}
    total = buckets[-1][1]
    result = {}
    finite = max((le for le, _ in buckets if le != float("inf")), default=0.0)
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        for le, count in buckets:
            if count >= q * total:
                # Beyond the last finite bucket: report that bound (the table says "≥").
                result[name] = (le if le != float("inf") else finite) * 1000
                if le == float("inf"):
                    result["beyond_buckets"] = 1.0
                break
    return result


def scrape(ports: list[int]) -> dict[str, dict[tuple, float]]:
    """Every sample of every process's /metrics, summed over processes: name -> labels -> value."""
    merged: dict[str, dict[tuple, float]] = {}
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = tuple(sorted(sample.labels.items()))
                bucket = merged.setdefault(sample.name, {})
                bucket[key] = bucket.get(key, 0.0) + sample.value
    return merged


def _total(metrics: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for k, v in metrics.get(name, {}).items() if wanted <= set(k))


async def _tap(url: str, received: Counter[str]) -> aiormq.abc.AbstractConnection:
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(TAP, durable=False, exclusive=True)
    await channel.queue_bind(TAP, ALERT, routing_key=ALERT)

    def on_alert(message: aiormq.abc.DeliveredMessage) -> None:
        received[message.header.properties.message_id or ""] += 1

    await channel.basic_consume(TAP, on_alert, no_ack=True)
    return connection


async def _declare(settings: Settings) -> None:
    connection = await amqp.connect(settings, "bench", robust=False)
    try:
        await declare_async(await connection.channel(), settings)
    finally:
        await connection.close()


async def _publish_rounds(settings: Settings, workload: Workload, seconds: float, rate: float,
                          progress: Progress, name: str, max_events: int = 0,
                          ports: list[int] | None = None, max_backlog: int = 400_000) -> tuple[int, set[str]]:
    """Publish whole relabelled rounds until `seconds` passed (or `max_events`); returns events, expected.

    At full speed the publisher would outrun the pipeline and bury the broker in a
    backlog (memory alarm, flow control): it publishes in chunks and waits while more
    than `max_backlog` published events are not yet in a book. That is backpressure,
    so the figure is the pipeline's sustained rate, not the publisher's. No wait lasts
    more than a quarter of the book ttl (the cap is soft): a book lives its ttl from its
    first event, so a longer pause would split an order straddling the chunk boundary
    into two verdicts the generator's expected set does not have (seen: orders at the
    boundaries of bodies 440 and 520 while the one-process pipeline was slow).
    """
    started = time.perf_counter()
    events, expected, done = 0, set(), 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        progress(name, done, None)

    for index in range(workload.max_rounds):
        bodies = workload.round_bodies(index)
        for start in range(0, len(bodies), PUBLISH_CHUNK):
            waited_until = time.perf_counter() + settings.book_ttl_seconds / 4
            while ports and not rate and time.perf_counter() < waited_until:
                processed = _total(await asyncio.to_thread(scrape, ports), "aldebaran_book_events_total")
                if events - processed <= max_backlog:
                    break
                await asyncio.sleep(0.05)
            report = await publish_bodies(settings, bodies[start:start + PUBLISH_CHUNK], rate=rate,
                                          progress=advance)
            events += report.events
        expected |= workload.round_expected(index)
        if time.perf_counter() - started >= seconds or (max_events and events >= max_events):
            break
    return events, expected


# --- (a) the broker's ceiling at the same batching ---------------------------------------

async def raw_ceiling(base: Settings, workload: Workload, progress: Progress) -> Result:
    """Publish the workload's batches and consume + ack them, nothing else."""
    result = Result("raw broker ceiling (consume + ack only)")
    with Place(base) as place:
        settings = place.settings()
        await _declare(settings)
        connection = await aiormq.connect(place.amqp_url)
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=base.router_prefetch)
        total = len(workload.bodies)
        state = {"messages": 0, "last": 0.0}
        latencies: list[tuple[float, float]] = []
        finished = asyncio.Event()

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            now = time.time() * 1000
            headers = message.header.properties.headers or {}
            published = headers.get(PUBLISHED_HEADER)
            if isinstance(published, int):
                latencies.append((now - published, workload.batch))
            state["messages"] += 1
            await channel.basic_ack(message.delivery.delivery_tag)
            if state["messages"] >= total:
                state["last"] = time.perf_counter()
                finished.set()

        await channel.basic_consume(TRADE_DATA, on_message)
        meter = CpuMeter()
        meter.start([])
        started = time.perf_counter()
        sized = [Body(b.data, b.events, b.content_type) for b in workload.bodies]
        report = await publish_bodies(settings, sized, progress=lambda n: progress(result.name, state["messages"] * workload.batch, None))
        await asyncio.wait_for(finished.wait(), timeout=600)
        result.cpu = meter.stop()
        result.events = report.events
        result.seconds = state["last"] - started
        result.latency = {"consumed": percentiles(latencies)}
        result.latency_source = "consumer (published header)"
        result.batch = {"ingress": report.events / max(1, report.messages)}
        result.note = "no alerts computed"
        await connection.close()
    return result


# --- (b) the naive baseline: one pika consumer, one event per message, a dict of books ----

def naive(base: Settings, workload: Workload, events: int, progress: Progress) -> Result:
    """Iteration-3 style: pre-fill single-event messages, then time one pika consumer draining them."""
    result = Result("naive (pika, 1 event/message, dict of books)")
    bodies, expected, count = prefix(workload, events, batch=1)
    with Place(base) as place:
        asyncio.run(_declare(place.settings()))
        params = pika.URLParameters(place.amqp_url)
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        for n, body in enumerate(bodies):  # the fill is not timed
            channel.basic_publish(TRADE_DATA, TRADE_DATA, body.data,
                                  pika.BasicProperties(content_type="application/json", delivery_mode=2))
            if n % 5000 == 0:
                progress(result.name + " (fill)", n, count)
        books: dict[str, Book] = {}
        alerts: Counter[str] = Counter()
        channel.basic_qos(prefetch_count=100)
        from datetime import datetime, timezone

        state = {"done": 0}

        def on_message(ch, method, properties, body) -> None:  # type: ignore[no-untyped-def]
            decoded = decode_message(body, properties.content_type, base.max_message_bytes)
            now = time.time()
            for event in decoded.events:
                key = trade_rule.key(event)
                book = books.get(key)
                if book is None:
                    book = books[key] = Book(trade_rule, key, opened_at=now, ttl=base.book_ttl_seconds)
                offer = book.offer(event, at=now, now=datetime.now(timezone.utc))
                if offer.outcome is Outcome.APPLIED:
                    for alert in offer.alerts:
                        ch.basic_publish(ALERT, ALERT, alert.to_json(),
                                         pika.BasicProperties(message_id=alert.alert_id, delivery_mode=2))
                        alerts[alert.alert_id] += 1
            ch.basic_ack(method.delivery_tag)
            state["done"] += 1
            if state["done"] % 2000 == 0:
                progress(result.name, state["done"], count)
            if state["done"] >= count:
                ch.stop_consuming()

        meter = CpuMeter()
        meter.start([])
        started = time.perf_counter()
        channel.basic_consume(TRADE_DATA, on_message)
        channel.start_consuming()
        result.seconds = time.perf_counter() - started
        result.cpu = meter.stop()
        now = datetime.now(timezone.utc)
        for book in books.values():
            for alert in book.close(now):
                alerts[alert.alert_id] += 1
        connection.close()
    result.events = count
    result.check(expected, alerts)
    result.batch = {"ingress": 1.0}
    result.latency_source = "n/a (drain of a pre-filled queue)"
    result.note = "alerts computed in-process; books closed at the end"
    return result


# --- (c), (d) the real pipeline: `aldebaran up` in a mode --------------------------------

async def pipeline(base: Settings, workload: Workload, progress: Progress, *, name: str, mode: str,
                   aggregators: int = 0, book_workers: int = 0, seconds: float = 0.0,
                   max_events: int = 0, rate: float = 0.0, ttl: float = 10.0,
                   log_dir: Path | None = None) -> Result:
    """Run `aldebaran up` on a fresh vhost, publish, wait until every event reached its book."""
    result = Result(name, offered=rate)
    samples_dir = tempfile.mkdtemp(prefix="aldebaran-bench-")
    with Place(base) as place:
        overrides = {"mode": mode, "book_ttl_seconds": ttl}
        settings = place.settings(**overrides)
        await _declare(settings)
        received: Counter[str] = Counter()
        tap = await _tap(place.amqp_url, received)
        try:
            async with running_up(place, samples_dir, mode=mode, ttl=ttl, aggregators=aggregators,
                                  book_workers=book_workers, log_dir=log_dir) as (process, ports):
                meter = CpuMeter()
                meter.start([process.pid])
                started = time.perf_counter()
                watcher = asyncio.ensure_future(_wait_processed(ports, progress, name))
                if max_events and not seconds:
                    bodies, expected, count = prefix(workload, max_events)
                    report = await publish_bodies(settings, bodies, rate=rate)
                    events = report.events
                else:
                    events, expected = await _publish_rounds(settings, workload, seconds, rate, progress,
                                                             name + " (publish)", max_events, ports=ports)
                watcher.cancel()
                finished = await _wait_processed(ports, progress, name, total=events, timeout=900)
                result.cpu = meter.stop()
                result.events = events
                result.seconds = finished - started
                await wait_alerts(received, expected, ttl, progress, name)
                result.note = f"alerts complete {time.perf_counter() - started:.1f} s after the first publish"
                metrics = scrape(ports)
                result.check(expected, received)
                for stage in ("ingress", "shard", "book"):
                    count = _total(metrics, "aldebaran_batch_events_count", stage=stage)
                    if count:
                        result.batch[stage] = _total(metrics, "aldebaran_batch_events_sum", stage=stage) / count
                if mode == "per-order":
                    result.batch["book"] = 1.0
                    for stage in ("book", "alert"):
                        buckets = [(float(dict(k)["le"]), v) for k, v in
                                   metrics.get("aldebaran_processing_latency_seconds_bucket", {}).items()
                                   if dict(k).get("stage") == stage]
                        result.latency[stage] = histogram_percentiles(buckets)
                    result.latency_source = "Prometheus histogram (bucket upper bounds)"
        finally:
            await tap.close()
        if mode == "sharded":
            samples = read_samples(samples_dir)
            result.latency = {stage: percentiles(values) for stage, values in samples.items()}
            result.latency_source = "worker samples (published header -> book / alert confirmed)"
    return result


async def wait_alerts(received: Counter[str], expected: set[str], ttl: float, progress: Progress,
                      name: str) -> None:
    """Wait while alerts keep coming, so "missing" means missing, not slow.

    Alerts trail the events (closing waits for the ttl; the outbox has its own pace).
    """
    deadline = time.monotonic() + ttl + ALERT_WAIT_SECONDS
    last_count, last_change = -1, time.monotonic()
    while time.monotonic() < deadline and not expected <= set(received):
        if sum(received.values()) != last_count:
            last_count, last_change = sum(received.values()), time.monotonic()
        elif time.monotonic() - last_change > ttl + 15:
            break
        progress(name + " (alerts)", len(set(received)), len(expected))
        await asyncio.sleep(0.25)
    await asyncio.sleep(1.5)  # repeats, if any, show up too


@asynccontextmanager
async def running_up(place: Place, samples_dir: str, *, mode: str, ttl: float, aggregators: int = 0,
                     book_workers: int = 0, log_dir: Path | None = None,
                     **env: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[int]]]:
    """`aldebaran up` on `place`, ready (READY=1), with one metrics port per process; stopped on exit.

    Extra `env` (`ALDEBARAN_*`) goes to every worker process.
    """
    base = place.base
    ports_base = free_ports(1 + aggregators + book_workers)
    ports = list(range(ports_base, ports_base + 1 + aggregators + book_workers))
    full_env = place.env(ALDEBARAN_MODE=mode, ALDEBARAN_BOOK_TTL_SECONDS=str(ttl),
                         ALDEBARAN_SHARDS=str(base.shards), ALDEBARAN_LOG_LEVEL="warning",
                         ALDEBARAN_LATENCY_SAMPLES_DIR=samples_dir,
                         ALDEBARAN_BATCH_MAX_EVENTS=str(base.batch_max_events),
                         ALDEBARAN_BATCH_LINGER_MS=str(base.batch_linger_ms), **env)
    log_path = (log_dir or Path(samples_dir)) / f"up-{place.vhost}.log"
    args = [sys.executable, "-m", "aldebaran.cli", "up", "--no-tracer", "--metrics-port", str(ports[0])]
    if aggregators:
        args += ["--aggregators", str(aggregators)]
    if book_workers:
        args += ["--book-workers", str(book_workers)]
    notify_path = os.path.join(samples_dir, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_path)
    sock.setblocking(False)
    full_env["NOTIFY_SOCKET"] = notify_path
    with open(log_path, "wb") as log:
        process = await asyncio.create_subprocess_exec(*args, env=full_env, stdout=log, stderr=log)
    try:
        await _wait_ready(process, sock, log_path)
        yield process, ports
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=40)
            except asyncio.TimeoutError:
                process.kill()
        sock.close()


async def _wait_ready(process: asyncio.subprocess.Process, sock: socket.socket, log_path: Path,
                      timeout: float = 90) -> None:
    """Wait for `up`'s sd_notify READY=1 (its log may be at warning level)."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"aldebaran up exited with {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 4096), timeout=0.5)
        except asyncio.TimeoutError:
            continue
        if b"READY=1" in data:
            return
    raise RuntimeError(f"aldebaran up not ready after {timeout}s: {log_path}")


async def _wait_processed(ports: list[int], progress: Progress, name: str, total: int | None = None,
                          timeout: float = 3600) -> float:
    """Poll the workers' book-event counters; the time when they reached `total`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = await asyncio.to_thread(scrape, ports)
        done = int(_total(metrics, "aldebaran_book_events_total"))
        progress(name, done, total)
        if total is not None and done >= total:
            return time.perf_counter()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{name}: events not all processed after {timeout}s")
