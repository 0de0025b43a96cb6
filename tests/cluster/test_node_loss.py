"""Node loss on a private three-node RabbitMQ cluster with quorum queues (issue 11).

A held stream flows from a failover publisher through `aldebaran up --no-tracer`
(cluster URLs, `queue_type = quorum`) while the test stops the node that leads the
busiest queues (the ingress), later starts it again, and checks what the channel sink
(a real HTTP recipient behind a `webhook` channel) received against the alerts computed
offline: every expected alert exactly once. The alert tap (a quorum queue bound to the
alert exchange) must hold every alert too, within `TAP_SECONDS` of the webhook; copies there
are reported, not failed: the alert exchange is at-least-once, the channel deliverers are
where duplicates die.

Run alone: `.venv/bin/python -m pytest -m cluster -q -s tests/cluster/test_node_loss.py`
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from aldebaran.io.publisher import Body, PublishReport, publish_bodies
from aldebaran.metrics import PUBLISH_NACKS
from aldebaran.settings import Settings
from aldebaran.trades.codec import encode_json
from aldebaran.trades.generator import generate
from tests.faults.fleet import WebhookServer
from tests.support import services
from tests.support.checker import check
from tests.support.pipeline import declare, read_alert_message, running
from tests.support.processes import free_port
from tests.support.waiting import quiet_window, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
ORDERS = int(os.environ.get("CLUSTER_ORDERS", "700"))  # ~3,000 events
BATCH = 10  # events per trade message
RATE = float(os.environ.get("CLUSTER_RATE", "75"))  # events/s offered: the stream spans ~40 s
STOP_AT = 0.25  # share of the stream published when the leader's node is stopped
DOWN_SECONDS = 8.0  # how long it stays down; the stream flows through the stop and the return
TAP = "test.cluster-alert-tap"
TAP_SECONDS = 30.0  # the longest the tap may lag the webhook before a missing alert is lost


def _load_testbed():
    spec = importlib.util.spec_from_file_location("aldebaran_testbed_cluster", ROOT / "deploy/testbed/cluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cluster(tmp_path_factory) -> Iterator[object]:
    testbed = _load_testbed()
    # Ports outside the ephemeral range: the stopped node must find its own free again on restart.
    bed = testbed.Cluster(root=tmp_path_factory.mktemp("cluster"), base_port=0,
                          prefix=f"aldtest{uuid.uuid4().hex[:6]}-c", ports=[free_port() for _ in range(10)])
    with bed.running():
        print(f"\ncluster of 3 formed in {bed.formed_in:.1f}s")
        yield bed


@pytest.fixture
def recipient() -> Iterator[WebhookServer]:
    server = WebhookServer()
    yield server
    server.close()


class HeldStream(threading.Thread):
    """The failover publisher (`publish_bodies`) in its own thread and event loop."""

    def __init__(self, settings: Settings, bodies: list[Body], rate: float) -> None:
        super().__init__(daemon=True)
        self.settings, self.bodies, self.rate = settings, bodies, rate
        self.confirmed = 0
        self.timeline: list[tuple[float, int]] = []  # (monotonic, events confirmed so far)
        self.report: PublishReport | None = None
        self.error: BaseException | None = None

    def _progress(self, events: int) -> None:
        self.confirmed += events
        self.timeline.append((time.monotonic(), self.confirmed))

    def run(self) -> None:
        try:
            self.report = asyncio.run(publish_bodies(self.settings, self.bodies, rate=self.rate, window=64,
                                                     progress=self._progress))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class Monitor(threading.Thread):
    """Samples the stream every 0.5 s: events confirmed, publisher nacks, alerts at the sink."""

    def __init__(self, publisher: HeldStream, recipient: WebhookServer) -> None:
        super().__init__(daemon=True)
        self.publisher, self.recipient = publisher, recipient
        self.samples: list[tuple[float, int, float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        nacks = PUBLISH_NACKS.labels(publisher="trade")
        while not self.done.is_set():
            self.samples.append((time.monotonic(), self.publisher.confirmed, nacks._value.get(),
                                 len(self.recipient.timeline())))
            self.done.wait(0.5)

    def table(self, origin: float, marks: dict[str, float], step: float = 2.0) -> str:
        """Rates per `step` s, relative to `origin` (the stop), with the fault's marks."""
        rows = ["   t (s)  events/s  nacks/s  alerts/s"]
        start = self.samples[0][0]
        edges = [start + i * step for i in range(int((self.samples[-1][0] - start) / step) + 1)]

        def at(t: float) -> tuple[float, int, float, int]:
            return min(self.samples, key=lambda s: abs(s[0] - t))
        for a, b in itertools.pairwise(edges):
            sa, sb = at(a), at(b)
            label = " ".join(name for name, t in marks.items() if a <= t < b)
            rows.append(f"{a - origin:8.1f} {(sb[1] - sa[1]) / step:9.0f} {(sb[2] - sa[2]) / step:8.0f} "
                        f"{(sb[3] - sa[3]) / step:9.1f}  {label}")
        return "\n".join(rows)


def _await_new_leader(cluster, queue: str, old: str, timeout: float = 60) -> float:
    """Seconds until `queue` reports a leader other than `old` (polled through the CLI)."""
    started = time.monotonic()

    def moved() -> bool:
        leader = cluster.queue_leaders().get(queue, ("", 0))[0]
        return bool(leader) and leader != old

    found = wait_until(moved, f"a new leader for {queue}", timeout, pause=0.5, required=False)
    return time.monotonic() - started if found else float("nan")


def _tap(url: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(TAP, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(TAP, "Aldebaran.Alert", routing_key="Aldebaran.Alert")
    finally:
        connection.close()


def _drain_tap(urls: list[str]) -> list[str]:
    for url in urls:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
        except pika.exceptions.AMQPConnectionError:
            continue
        try:
            channel = connection.channel()
            ids = []
            while True:
                method, properties, body = channel.basic_get(TAP, auto_ack=True)
                if method is None:
                    return ids
                ids += [alert["alert_id"] for alert in read_alert_message(properties, body)]
        finally:
            connection.close()
    raise AssertionError("no cluster node answers")


def _tap_alerts(urls: list[str], expected: set[str], timeout: float = TAP_SECONDS) -> tuple[list[str], float]:
    """What the tap holds once it holds every expected alert, or when `timeout` has passed; and
    after how many seconds. A quorum queue whose leader was on the stopped node can take the
    publishes confirmed meanwhile only after the cluster settles (seen once: 5 of 258 missing
    at the first look while the webhook had all of them)."""
    started = time.monotonic()
    ids: list[str] = []

    def holds_all() -> bool:
        ids.extend(_drain_tap(urls))
        return expected <= set(ids)

    wait_until(holds_all, "every alert in the tap", timeout, pause=0.5, required=False)
    return ids, time.monotonic() - started


def test_stop_the_leader_node_mid_stream(cluster, recipient: WebhookServer, redis_prefix: str, tmp_path: Path) -> None:
    urls: list[str] = cluster.urls
    config = tmp_path / "channels.toml"
    config.write_text("[[channels]]\nname = \"hook\"\nkind = \"webhook\"\n"
                      f"url = \"{recipient.url}\"\nmax_attempts = 1000\nbackoff_max_seconds = 2.0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(
        ALDEBARAN_AMQP_URL=urls[0],
        ALDEBARAN_AMQP_URLS=json.dumps(urls),
        ALDEBARAN_QUEUE_TYPE="quorum",
        ALDEBARAN_REDIS_URL=services.REDIS_URL,
        ALDEBARAN_REDIS_KEY_PREFIX=redis_prefix,
        ALDEBARAN_MANAGEMENT_URL=f"http://guest:guest@127.0.0.1:{cluster.nodes[0].management_port}/",
        ALDEBARAN_TRACES_DIR=str(tmp_path / "traces"),
        ALDEBARAN_CONFIG=str(config),
        ALDEBARAN_SHUTDOWN_GRACE_SECONDS="15",
        ALDEBARAN_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    settings = Settings(amqp_url=urls[0], amqp_urls=urls, queue_type="quorum", redis_url=services.REDIS_URL,
                        redis_key_prefix=redis_prefix)
    stream = generate(ORDERS, seed=11)
    bodies = [Body(encode_json(stream.events[i:i + BATCH]), len(stream.events[i:i + BATCH]))
              for i in range(0, len(stream.events), BATCH)]
    declare(env)
    _tap(urls[0])
    leaders = cluster.queue_leaders()
    busiest = leaders["Aldebaran.Trade_Data"][0]
    victim = cluster.node_by_name(busiest)
    print(f"queue leaders: { {q: leader for q, (leader, _) in leaders.items()} }; "
          f"stopping {victim.name} (node {victim.index})")

    with running(env, tmp_path / "up.log") as pipeline:
        publisher = HeldStream(settings, bodies, RATE)
        monitor = Monitor(publisher, recipient)
        monitor.start()
        publisher.start()
        wait_until(lambda: publisher.confirmed >= STOP_AT * len(stream.events) or not publisher.is_alive(),
                   "the stream to reach the stop point", timeout=120, pause=0.05)
        stop_started = time.monotonic()
        confirmed_at_stop = publisher.confirmed
        cluster.stop_node(victim.index)
        stop_done = time.monotonic()
        new_leader_after = _await_new_leader(cluster, "Aldebaran.Trade_Data", victim.name)
        time.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - stop_done)))
        restart_started = time.monotonic()
        cluster.start_node(victim.index)
        back = time.monotonic()
        publisher.join(timeout=180)
        assert not publisher.is_alive(), "the publisher never finished"
        assert publisher.error is None, repr(publisher.error)
        stream_done = publisher.timeline[-1][0]  # the last confirm

        wait_until(lambda: stream.expected <= set(recipient.deliveries()), "every alert at the webhook",
                   timeout=150, pause=0.5, required=False)
        quiet_window(3, "a late copy follows a redelivery after the node loss: no barrier orders it")
        all_in = time.monotonic()
        monitor.done.set()
        up_log = pipeline.log()
    report = check("webhook", stream.expected, recipient.deliveries())
    tap_ids, tap_seconds = _tap_alerts(urls, stream.expected)
    tap = check("alert tap", stream.expected, tap_ids)

    # Recovery: the longest stretch without a publisher confirm after the stop began,
    # and when the sink got its first alert after the stop.
    after = [t for t, _ in publisher.timeline if t >= stop_started]
    confirm_gap = max((b - a for a, b in zip([stop_started, *after], after, strict=False)), default=float("nan"))
    arrivals = sorted(t for t, _ in recipient.timeline() if t >= stop_started)
    alert_gap = max((b - a for a, b in zip([stop_started, *arrivals], arrivals, strict=False)), default=float("nan"))
    assert publisher.report is not None
    print(f"\n{len(stream.events)} events, {stream.orders} orders, {len(stream.expected)} expected alerts; "
          f"stopped {victim.name} at {confirmed_at_stop} events confirmed")
    print(f"node stop took {stop_done - stop_started:.1f}s, down {restart_started - stop_done:.1f}s, "
          f"restart took {back - restart_started:.1f}s")
    print(f"publisher: {publisher.report.events} events confirmed in {publisher.report.elapsed:.1f}s, "
          f"{publisher.report.failovers} failovers, {publisher.report.resends} re-sends, "
          f"{publisher.report.nacks} nacks")
    print(f"recovery: longest gap without a publisher confirm after the stop began {confirm_gap:.1f}s; "
          f"longest gap without an alert at the sink {alert_gap:.1f}s; every expected alert in "
          f"{all_in - 3 - stream_done:.1f}s after the last confirm")
    print(f"Aldebaran.Trade_Data had a new leader {new_leader_after:.1f}s after the stop completed "
          f"(as seen by polling rabbitmqctl list_queues name leader)")
    print(monitor.table(stop_started, {"<stop": stop_started, "stopped": stop_done, "<restart": restart_started,
                                       "back": back, "stream-end": stream_done}))
    print(report.line())
    print(tap.line() + f" ({tap_seconds:.1f}s of looking, from 3 s after the webhook had every alert)")
    print(f"worker reconnects logged: {up_log.count('reconnected to broker')}")
    assert report.ok, report.line() + "\n" + up_log[-4000:]
    assert not tap.lost and not tap.unexpected, tap.line()
