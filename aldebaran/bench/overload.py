"""The overload scenario: twice the capacity for a minute, then half of it until latency recovers.

docs/backpressure.md promises that under overload memory stays within configured bounds,
nothing is lost, alerts stay right, and the pipeline recovers. This scenario offers the
load to the sharded pipeline in its fastest layout (router and shard book worker in their
own processes), samples every worker's RSS, the backlog and the latency as it goes, and
reports the figures; like the rest of the bench it asserts nothing.

The recovery load also runs for BASELINE_SECONDS right before the surge: the latency this box
gives that load unhurried, which the recovery is measured back to beside the 5-ms target.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import aiormq
import aiormq.abc
import aiormq.exceptions
import httpx
import psutil
import redis

from aldebaran.bench.environment import CpuMeter, Place, _management
from aldebaran.bench.phases import (Progress, Result, _declare, _tap, _total, percentiles, running_up, scrape,
                                    wait_alerts)
from aldebaran.bench.samples import SampleTail
from aldebaran.bench.workload import Workload
from aldebaran.io.publisher import Body, PublishReport, publish_bodies
from aldebaran.log import get_logger
from aldebaran.settings import Settings
from declare.topology import TRADE_DATA, shard_queue

log = get_logger("bench")
P99_TARGET_MS = 5.0
RECOVERED_BUCKETS = 3  # consecutive 1-s buckets under the target: recovered, not a lucky second
# The recovery load for this long right before the surge: the p99 this box gives that load when not
# overloaded, which "back to its pre-surge p99" is measured against (5 ms may be out of its reach).
BASELINE_SECONDS = 20.0
BASELINE_MARGIN = 1.25  # back to the pre-surge p99: within this factor of it (and never asked under 5 ms)
SAMPLE_LAG_SECONDS = 2.0  # workers flush latency samples once a second; the monitor reads every SAMPLE_SECONDS
SAMPLE_SECONDS = 0.5
# Events not yet in a book while measuring capacity: enough to keep the workers saturated,
# not so many that the measurement starts the surge's trouble early.
CALIBRATION_BACKLOG_SECONDS = 3.0
CALIBRATION_MIN_BACKLOG = 20_000
CALIBRATION_WARMUP_SECONDS = 60.0
CALIBRATION_CHUNK_EVENTS = 20_000  # per publisher connection between backlog checks
# A backlog wait this share of book_ttl long cuts the feed: an order straddling a shorter one
# still has all its events in its book (see _calibrate).
CALIBRATION_CUT_TTL_SHARE = 0.25
ALERT_EXAMPLES = 10  # ids of wrong and of missing alerts kept for the report: enough to diagnose, short
DRAIN_SECONDS = 900.0  # after the recovery, for the backlog's last events to reach their books
PUBLISH_RETRIES = 100_000  # a refused publish is retried (slowing down) for as long as the run lasts


@dataclass
class Overload:
    """Everything the scenario measured; `lost` and `alerts.wrong` must be 0, RSS under the bound."""

    bound_mib: int
    capacity: float = 0.0
    capacity_source: str = ""
    capacity_first_half: float = 0.0  # events/s into books in the calibration's first 30 s (0 = given)
    surge_factor: float = 2.0
    recovery_factor: float = 0.5
    surge_seconds: float = 0.0
    baseline_seconds: float = 0.0  # the recovery load right before the surge
    surge_offered: float = 0.0  # events/s the publisher actually got confirmed during the surge
    recovery_timeout: float = 0.0
    recovery_seconds: float = 0.0  # how long the recovery load ran
    published: int = 0
    processed: int = 0  # events offered to a book: applied + duplicate + late
    late: int = 0
    nacks: int = 0
    blocked: int = 0
    alerts: Result = field(default_factory=lambda: Result("overload"))
    wrong_examples: list[str] = field(default_factory=list)  # sorted, the first ALERT_EXAMPLES
    missing_examples: list[str] = field(default_factory=list)
    rss_mib: dict[str, float] = field(default_factory=dict)  # worker process -> peak
    services_mib: dict[str, tuple[float, float]] = field(default_factory=dict)  # peak, its own limit (0 = none)
    cpu: dict[str, float] = field(default_factory=dict)
    backlog_peak: int = 0  # events published, not yet in a book
    backlog_peak_messages: int = 0  # ready in the ingress and shard queues
    backlog_peak_at: float = 0.0  # seconds after the surge began
    books_open_peak: int = 0  # what the shard worker's memory holds: open books ...
    done_markers_peak: int = 0  # ... and closed orders remembered for late events
    done_markers_forgotten: int = 0  # dropped early at shard_done_max_markers
    drained_after: float | None = None  # seconds after the surge ended, while the recovery load ran
    all_in_after: float | None = None  # seconds after the surge ended when the last event reached a book
    recovered_after: float | None = None  # seconds after the surge ended: p99 under P99_TARGET_MS
    back_to_baseline_after: float | None = None  # ... p99 at most baseline_target_ms
    p99_baseline: dict[str, float] = field(default_factory=dict)  # latency at the baseline load
    baseline_target_ms: float = 0.0  # max(P99_TARGET_MS, BASELINE_MARGIN x the baseline's p99)
    p99_timeline: list[tuple[float, float]] = field(default_factory=list)  # (s after surge end, p99 ms)
    p99_surge: dict[str, float] = field(default_factory=dict)
    p99_after: dict[str, float] = field(default_factory=dict)  # latency once recovered (or the last 10 s)
    ingress_max_length: int = 0
    note: str = ""

    @property
    def lost(self) -> int:
        return max(0, self.published - self.processed)


class _Feed:
    """Bodies in publish order across relabelled rounds, and the alerts of exactly what was taken.

    A book lives book_ttl from its first event, so an order whose events straddle a publishing
    pause longer than that is split in two books: `cut` before a pause skips to the next clean
    boundary (the skipped bodies are never published), and the alerts are computed per range taken.
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.round, self.index = 0, 0
        self.start = 0  # first body of the open range, in the current round
        self.ranges: list[tuple[int, int, int]] = []  # closed ranges taken: (round, start body, end body)
        self.confirmed = 0

    def take(self, until: Callable[[], bool]) -> Iterator[Body]:
        while not until() and not self.exhausted:
            body = self.workload.round_body(self.round, self.index)
            self.index += 1
            if self.index == len(self.workload.bodies):
                self._next_round()
            yield body

    def cut(self) -> None:
        """Close the open range and move to the next clean boundary: call before publishing pauses.
        Cutting again before anything is taken changes nothing."""
        self._close()
        self.index = self.start = self.workload.next_clean(self.index)
        if self.index == len(self.workload.bodies):
            self._next_round()

    def _next_round(self) -> None:
        self._close()
        self.round, self.index, self.start = self.round + 1, 0, 0

    def _close(self) -> None:
        if self.index > self.start:
            self.ranges.append((self.round, self.start, self.index))
        self.start = self.index

    def confirm(self, events: int) -> None:
        self.confirmed += events

    @property
    def exhausted(self) -> bool:
        return self.round >= self.workload.max_rounds

    def expected(self) -> set[str]:
        """The union over the ranges taken: independent, as each starts at a clean boundary or a new round."""
        alerts: set[str] = set()
        for round_index, start, end in [*self.ranges, (self.round, self.start, self.index)]:
            if end > start:
                alerts |= self.workload.range_expected(round_index, start, end)
        return alerts


class _BlockedCounter(logging.Handler):
    """aiormq logs `connection.blocked` from the broker; count the episodes."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "was blocked by" in record.getMessage():
            self.count += 1


class _Monitor:
    """Samples RSS, backlog and latency every `SAMPLE_SECONDS` while the scenario runs."""

    def __init__(self, root: int, ports: list[int], amqp_url: str, shards: int, samples_dir: str,
                 feed: _Feed) -> None:
        self.root, self.ports, self.amqp_url, self.shards, self.feed = root, ports, amqp_url, shards, feed
        self.tail = SampleTail(samples_dir)
        self.rss: dict[int, tuple[str, float]] = {}  # pid -> label, peak MiB
        self.services: dict[str, float] = {}
        self.processed = 0
        self.processed_sample = (time.monotonic(), 0)  # when `processed` was read, and its value
        self.late = 0
        self.backlog = 0
        self.books_open_peak = self.done_markers_peak = self.done_markers_forgotten = 0
        self.backlog_peak, self.backlog_peak_messages, self.backlog_peak_time = 0, 0, 0.0
        self.buckets: list[tuple[float, list[tuple[float, float]]]] = []  # (monotonic, samples of that second)
        self._shared = [p for p in psutil.process_iter(["name"])
                        if (p.info["name"] or "").startswith(("beam.smp", "redis-server"))]

    async def run(self) -> None:
        connection = await aiormq.connect(self.amqp_url)
        bucket_start, bucket = time.monotonic(), []
        try:
            while True:
                await asyncio.to_thread(self._sample_rss)
                metrics = await asyncio.to_thread(scrape, self.ports)
                self.processed = int(_total(metrics, "aldebaran_book_events_total"))
                self.processed_sample = (time.monotonic(), self.processed)
                self.late = int(_total(metrics, "aldebaran_book_events_total", outcome="late"))
                self.books_open_peak = max(self.books_open_peak, int(_total(metrics, "aldebaran_books_open")))
                self.done_markers_peak = max(self.done_markers_peak,
                                             int(_total(metrics, "aldebaran_shard_done_markers")))
                self.done_markers_forgotten = int(_total(metrics, "aldebaran_shard_done_markers_forgotten_total"))
                self.backlog = max(0, self.feed.confirmed - self.processed)
                if self.backlog > self.backlog_peak:
                    self.backlog_peak, self.backlog_peak_time = self.backlog, time.monotonic()
                try:
                    self.backlog_peak_messages = max(self.backlog_peak_messages, await self._queued(connection))
                except aiormq.exceptions.AMQPError as exc:
                    log.warning("bench could not read queue depths", error=str(exc))
                bucket += self.tail.read_new("book")
                if time.monotonic() - bucket_start >= 1.0:
                    self.buckets.append((bucket_start, bucket))
                    bucket_start, bucket = time.monotonic(), []
                await asyncio.sleep(SAMPLE_SECONDS)
        finally:
            await connection.close()

    async def _queued(self, connection: aiormq.abc.AbstractConnection) -> int:
        """Messages ready in the ingress and shard queues (passive declares: exact, unlike the
        management API's 5-s statistics)."""
        channel = await connection.channel()
        try:
            total = 0
            for queue in [TRADE_DATA] + [shard_queue(n) for n in range(self.shards)]:
                total += (await channel.queue_declare(queue, passive=True)).message_count or 0
            return total
        finally:
            if not channel.is_closed:
                await channel.close()

    def _sample_rss(self) -> None:
        try:
            root = psutil.Process(self.root)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            processes = []
        for process in processes:
            try:
                mib = process.memory_info().rss / 2**20
                label = self.rss[process.pid][0] if process.pid in self.rss else CpuMeter._label(process)
            except psutil.Error:
                continue
            self.rss[process.pid] = (label, max(mib, self.rss.get(process.pid, ("", 0.0))[1]))
        for process in self._shared:
            try:
                label = "rabbitmq" if process.name().startswith("beam") else "redis"
                mib = process.memory_info().rss / 2**20
            except psutil.Error:
                continue
            self.services[label] = max(self.services.get(label, 0.0), mib)

    def read_high_water(self) -> None:
        """The kernel's own peak (VmHWM) of every worker: catches a spike between two samples."""
        for pid, (label, peak) in list(self.rss.items()):
            try:
                with open(f"/proc/{pid}/status") as fh:
                    hwm = next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM:"))
            except (OSError, StopIteration, ValueError):
                continue
            self.rss[pid] = (label, max(peak, hwm))

    def peaks(self) -> dict[str, float]:
        result: dict[str, float] = {}
        for label, peak in self.rss.values():
            result[label] = max(result.get(label, 0.0), peak)
        return result

    def p99_since(self, start: float) -> list[tuple[float, float]]:
        """(bucket start, p99 ms) of every 1-s bucket from `start` on that holds samples."""
        return [(t, percentiles(samples)["p99"]) for t, samples in self.buckets if t >= start and samples]

    def samples_between(self, start: float, end: float) -> list[tuple[float, float]]:
        return [s for t, samples in self.buckets if start <= t < end for s in samples]


def recovered_at(timeline: list[tuple[float, float]], target_ms: float = P99_TARGET_MS,
                 run: int = RECOVERED_BUCKETS, *, inclusive: bool = False) -> float | None:
    """Start of the first `run` consecutive buckets whose p99 is under `target_ms` (or equal to it,
    when `inclusive`)."""
    streak: list[float] = []
    for t, p99 in timeline:
        streak = streak + [t] if p99 < target_ms or (inclusive and p99 == target_ms) else []
        if len(streak) >= run:
            return streak[0]
    return None


def _service_limits(base: Settings) -> dict[str, float]:
    """RabbitMQ's memory high watermark and Redis's maxmemory, MiB (0 = none set)."""
    limits = {"rabbitmq": 0.0, "redis": 0.0}
    try:
        with _management(base) as http:
            limits["rabbitmq"] = sum(n.get("mem_limit", 0) for n in http.get("/api/nodes").json()) / 2**20
    except (httpx.HTTPError, ValueError):
        pass
    try:
        client = redis.Redis.from_url(base.redis_url)
        limits["redis"] = int(client.config_get("maxmemory").get("maxmemory", 0)) / 2**20
        client.close()
    except redis.RedisError:
        pass
    return limits


async def overload(base: Settings, workload: Workload, progress: Progress, *, capacity: float = 0.0,
                   calibrate_seconds: float = 60.0, surge_seconds: float = 60.0, surge_factor: float = 2.0,
                   recovery_factor: float = 0.5, recovery_timeout: float = 300.0, ttl: float = 10.0,
                   baseline_seconds: float = BASELINE_SECONDS) -> Overload:
    """Run the scenario on a fresh vhost; see the module docstring."""
    result = Overload(bound_mib=base.max_rss_mib, surge_factor=surge_factor, recovery_factor=recovery_factor,
                      surge_seconds=surge_seconds, baseline_seconds=baseline_seconds,
                      recovery_timeout=recovery_timeout,
                      ingress_max_length=base.ingress_max_length)
    samples_dir = tempfile.mkdtemp(prefix="aldebaran-overload-")
    blocked = _BlockedCounter()
    logging.getLogger("aiormq.connection").addHandler(blocked)
    reports: list[PublishReport] = []
    with Place(base) as place:
        settings = place.settings(mode="sharded", book_ttl_seconds=ttl)
        await _declare(settings)
        received: Counter[str] = Counter()
        tap = await _tap(place.amqp_url, received)
        feed = _Feed(workload)
        try:
            async with running_up(place, samples_dir, mode="sharded", ttl=ttl, aggregators=1, book_workers=1,
                                  ALDEBARAN_MAX_RSS_MIB=str(base.max_rss_mib),
                                  ALDEBARAN_INGRESS_MAX_LENGTH=str(base.ingress_max_length)) as (process, ports):
                monitor = _Monitor(process.pid, ports, place.amqp_url, base.shards, samples_dir, feed)
                sampler = asyncio.ensure_future(monitor.run())
                try:
                    if capacity:
                        result.capacity, result.capacity_source = capacity, "given (--capacity)"
                    else:
                        result.capacity, result.capacity_first_half = await _calibrate(
                            settings, feed, monitor, calibrate_seconds, progress, reports)
                        result.capacity_source = (f"measured: events into books from the start of "
                                                  f"{calibrate_seconds:g} s at saturation until all were in "
                                                  f"a book (the drain counts)")
                    feed.cut()
                    await _drain(feed, monitor, progress, "overload: drain before the surge")
                    meter = CpuMeter()
                    meter.start([process.pid])
                    surge_start, surge_end = await _surge_and_recover(settings, feed, monitor, result, progress,
                                                                      reports)
                    if await _drain(feed, monitor, progress, "overload: last events", timeout=DRAIN_SECONDS):
                        result.all_in_after = time.monotonic() - surge_end
                    else:
                        result.note = "; ".join(filter(None, [
                            result.note, f"{feed.confirmed - monitor.processed:,} events were still queued "
                                         f"{DRAIN_SECONDS:.0f} s after the recovery ended; counted as lost"]))
                    result.cpu = meter.stop()
                    monitor.read_high_water()
                finally:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
                _collect(result, monitor, surge_start, surge_end, _service_limits(base))
                expected = feed.expected()
                await wait_alerts(received, expected, ttl, progress, "overload")
                result.alerts.check(expected, received)
                _examples(result, expected, received)
        finally:
            await tap.close()
            logging.getLogger("aiormq.connection").removeHandler(blocked)
    result.nacks = sum(r.nacks for r in reports)
    result.blocked = blocked.count
    return result


def _paced(settings: Settings, feed: _Feed, until: Callable[[], bool], rate: float,
           count: Callable[[int], None]) -> asyncio.Future[PublishReport]:
    """A publisher offering `rate` events/s from the feed until `until()`."""
    return asyncio.ensure_future(publish_bodies(settings, feed.take(until), rate=rate, progress=count,
                                                max_retries=PUBLISH_RETRIES))


async def _surge_and_recover(settings: Settings, feed: _Feed, monitor: _Monitor, result: Overload,
                             progress: Progress, reports: list[PublishReport]) -> tuple[float, float]:
    """Offer recovery_factor x capacity for baseline_seconds (the p99 to recover to), surge_factor x
    capacity for surge_seconds, then recovery_factor x capacity until p99 recovered (or the timeout);
    paced publishers back to back, so no gap between them (and no order straddles a pause)."""
    low = result.capacity * result.recovery_factor

    def count(n: int) -> None:
        feed.confirm(n)
        progress("overload: published", feed.confirmed, None)

    await asyncio.sleep(SAMPLE_LAG_SECONDS)  # the drain's last samples land before the baseline's window
    baseline_start = time.monotonic()
    surge_start = baseline_start + result.baseline_seconds
    surge_end = surge_start + result.surge_seconds
    recovered = asyncio.Event()
    publishers = [_paced(settings, feed, lambda: time.monotonic() >= surge_start, low, count)]
    try:
        await asyncio.sleep(max(0.0, surge_start - time.monotonic()))
        _baseline(result, monitor, baseline_start, surge_start)
        monitor.backlog_peak = monitor.backlog_peak_messages = 0  # the surge's, not calibration's
        before = feed.confirmed
        publishers.append(_paced(settings, feed, lambda: time.monotonic() >= surge_end,
                                 result.capacity * result.surge_factor, count))
        await asyncio.sleep(max(0.0, surge_end - time.monotonic()))
        result.surge_offered = (feed.confirmed - before) / result.surge_seconds
        publishers.append(_paced(settings, feed, recovered.is_set, low, count))
        await _watch_recovery(feed, monitor, result, surge_end, progress)
    finally:
        recovered.set()
        reports.extend(await asyncio.gather(*publishers))
    result.recovery_seconds = time.monotonic() - surge_end
    if feed.exhausted:
        result.note = "the workload's rounds ran out before recovery: use more --orders"
    return surge_start, surge_end


def _baseline(result: Overload, monitor: _Monitor, start: float, end: float) -> None:
    """The baseline's latency from the 1-s buckets closed before the surge began (none of the
    surge's samples), and the p99 the recovery is measured back to."""
    result.p99_baseline = percentiles(monitor.samples_between(start, end))
    result.baseline_target_ms = max(P99_TARGET_MS, BASELINE_MARGIN * result.p99_baseline.get("p99", 0.0))


async def _watch_recovery(feed: _Feed, monitor: _Monitor, result: Overload, surge_end: float,
                          progress: Progress) -> None:
    """Follow the recovery load until both recovery figures are known (p99 under the 5-ms target,
    p99 back to its pre-surge level), the timeout, or the workload's end."""
    drained_below = max(feed.workload.batch, result.capacity * result.recovery_factor)  # ~1 s of work
    while time.monotonic() - surge_end < result.recovery_timeout and not feed.exhausted:
        await asyncio.sleep(SAMPLE_SECONDS)
        if result.drained_after is None and monitor.backlog <= drained_below:
            result.drained_after = time.monotonic() - surge_end
        timeline = monitor.p99_since(surge_end)
        result.recovered_after = _after(recovered_at(timeline), surge_end)
        result.back_to_baseline_after = _after(
            recovered_at(timeline, result.baseline_target_ms, inclusive=True), surge_end)
        if result.recovered_after is not None and result.back_to_baseline_after is not None:
            return
        progress("overload: recovery (s)", int(time.monotonic() - surge_end), int(result.recovery_timeout))


def _after(at: float | None, origin: float) -> float | None:
    return None if at is None else at - origin


def _collect(result: Overload, monitor: _Monitor, surge_start: float, surge_end: float,
             limits: dict[str, float]) -> None:
    """The monitor's samples into the result's figures."""
    result.published = monitor.feed.confirmed
    result.processed = monitor.processed
    result.late = monitor.late
    result.backlog_peak = monitor.backlog_peak
    result.backlog_peak_messages = monitor.backlog_peak_messages
    result.backlog_peak_at = max(0.0, monitor.backlog_peak_time - surge_start)
    result.rss_mib = monitor.peaks()
    result.books_open_peak = monitor.books_open_peak
    result.done_markers_peak = monitor.done_markers_peak
    result.done_markers_forgotten = monitor.done_markers_forgotten
    result.services_mib = {name: (peak, limits.get(name, 0.0)) for name, peak in monitor.services.items()}
    result.p99_timeline = [(t - surge_end, p99) for t, p99 in monitor.p99_since(surge_end)]
    result.p99_surge = percentiles(monitor.samples_between(surge_start, surge_end))
    end = surge_end + result.recovery_seconds
    after = surge_end + result.recovered_after if result.recovered_after is not None else end - 10
    result.p99_after = percentiles(monitor.samples_between(after, end))


def _examples(result: Overload, expected: set[str], received: Counter[str]) -> None:
    """Keep and log a few ids of the wrong and the missing alerts: counts alone cannot be diagnosed."""
    got = set(received)
    result.wrong_examples = sorted(got - expected)[:ALERT_EXAMPLES]
    result.missing_examples = sorted(expected - got)[:ALERT_EXAMPLES]
    if result.wrong_examples:
        log.warning("overload alerts wrong", count=result.alerts.wrong, first=result.wrong_examples)
    if result.missing_examples:
        log.warning("overload alerts missing", count=result.alerts.missing, first=result.missing_examples)


async def _calibrate(settings: Settings, feed: _Feed, monitor: _Monitor, seconds: float, progress: Progress,
                     reports: list[PublishReport]) -> tuple[float, float]:
    """Publish as fast as the pipeline takes it (backlog capped) for `seconds`, once the first
    events are through, then wait until every event is in a book; returns events into books per
    second from the window's start to that moment, and over the window's first half.

    Why the drain counts: rates read while the backlog is still queued say what the workers took
    in, not what they finish. Measured inside the window, a fresh pipeline looked 5-10x faster
    than it sustained (prefetched messages, books not yet closing), and "half capacity" was more
    than the pipeline could take. The first half's rate is reported beside it.

    A backlog wait that lasts a quarter of book_ttl cuts the feed, once: an order straddling a
    shorter wait still has all its events in its book, and cutting at every wait would skip to
    the round's end each time (the workload's bodies have almost no clean boundary inside a round)
    and run out of rounds within the calibration."""
    stop = asyncio.Event()
    chunk = max(1, CALIBRATION_CHUNK_EVENTS // feed.workload.batch)
    cut_after = CALIBRATION_CUT_TTL_SHARE * settings.book_ttl_seconds
    started = time.monotonic()

    async def publish() -> None:
        waiting_since: float | None = None
        cut = False
        while not stop.is_set() and not feed.exhausted:
            rate = monitor.processed / max(1e-3, time.monotonic() - started)
            if monitor.backlog > max(CALIBRATION_MIN_BACKLOG, CALIBRATION_BACKLOG_SECONDS * rate):
                waiting_since = waiting_since or time.monotonic()
                if not cut and time.monotonic() - waiting_since >= cut_after:
                    feed.cut()
                    cut = True
                await asyncio.sleep(0.05)
                continue
            waiting_since, cut = None, False
            taken = iter(range(chunk))
            reports.append(await publish_bodies(settings, feed.take(lambda: stop.is_set() or next(taken, None) is None),
                                                progress=feed.confirm, max_retries=PUBLISH_RETRIES))

    publisher = asyncio.ensure_future(publish())
    try:
        warm_until = time.monotonic() + CALIBRATION_WARMUP_SECONDS
        while monitor.processed < CALIBRATION_MIN_BACKLOG and time.monotonic() < warm_until:
            await asyncio.sleep(SAMPLE_SECONDS)
        t0, n0 = monitor.processed_sample
        await asyncio.sleep(seconds / 2)
        tm, nm = monitor.processed_sample
        progress("overload: measuring capacity", monitor.processed, None)
        await asyncio.sleep(seconds / 2)
    finally:
        stop.set()
        await publisher
    await _drain(feed, monitor, progress, "overload: measuring capacity (drain)")
    t1, n1 = monitor.processed_sample
    if t1 <= t0 or n1 <= n0:
        raise RuntimeError("capacity could not be measured: no events reached a book (give --capacity)")
    first = (nm - n0) / (tm - t0) if tm > t0 else 0.0
    return (n1 - n0) / (t1 - t0), first


async def _drain(feed: _Feed, monitor: _Monitor, progress: Progress, name: str,
                 timeout: float = DRAIN_SECONDS) -> bool:
    """Wait until every confirmed event reached a book; False after `timeout` (the rest counts as lost)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(SAMPLE_SECONDS)
        progress(name, monitor.processed, feed.confirmed)
        if monitor.processed >= feed.confirmed:
            return True
    log.warning("events not all in a book after the timeout", confirmed=feed.confirmed,
                processed=monitor.processed, timeout_seconds=timeout)
    return False
