"""Drive the real pipeline: `aldebaran up` as a subprocess, the public ingress, an alert tap."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pika
import pika.exceptions

from aldebaran.trades.codec import encode_json
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent
from tests.support.processes import spawn_logged
from tests.support.waiting import quiet_window, wait_until

TAP = "test.alert-tap"


class Pipeline:
    """One `aldebaran up` process bound to a test's vhost and Redis prefix."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str, tracer: bool = False) -> None:
        self.env = env
        self.log_path = log_path
        self.args = args if tracer else ("--no-tracer", *args)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: float = 60) -> Pipeline:
        self.process = spawn_logged([sys.executable, "-m", "aldebaran.cli", "up", *self.args], self.log_path,
                                    env=self.env)
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"aldebaran up exited with {process.returncode}:\n{self.log()}")
            return '"event": "ready"' in self.log()

        wait_until(ready, lambda: f"aldebaran up to be ready:\n{self.log()}", wait_ready)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)


@contextmanager
def running(env: dict[str, str], log_path: Path, *args: str) -> Iterator[Pipeline]:
    pipeline = Pipeline(env, log_path, *args).start()
    try:
        yield pipeline
    finally:
        if pipeline.process and pipeline.process.poll() is None:
            pipeline.stop()


@contextmanager
def worker(env: dict[str, str], log_path: Path, *args: str) -> Iterator[subprocess.Popen]:
    """One `aldebaran run <args>` process (a single worker of the fleet), stopped with SIGTERM."""
    process = spawn_logged([sys.executable, "-m", "aldebaran.cli", "run", *args], log_path, env=env)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


def declare(env: dict[str, str]) -> None:
    result = subprocess.run([sys.executable, "-m", "aldebaran.cli", "declare"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


class Broker:
    """A blocking pika connection for publishing trade data and reading taps."""

    def __init__(self, amqp_url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def tap_alerts(self) -> None:
        self.channel.queue_declare(TAP, durable=True)
        self.channel.queue_bind(TAP, "Aldebaran.Alert", routing_key="Aldebaran.Alert")

    def publish_raw(self, body: bytes, content_type: str | None = None) -> None:
        self.channel.basic_publish("Aldebaran.Trade_Data", "Aldebaran.Trade_Data", body,
                                   pika.BasicProperties(content_type=content_type, delivery_mode=2))

    def publish(self, events: Iterable[TradeEvent], batch: int = 1) -> None:
        chunk: list[TradeEvent] = []
        for event in events:
            chunk.append(event)
            if len(chunk) >= batch:
                self._send(chunk)
                chunk = []
        if chunk:
            self._send(chunk)

    def _send(self, chunk: list[TradeEvent]) -> None:
        body = msgspec.json.encode(chunk[0].to_wire()) if len(chunk) == 1 else encode_json(chunk)
        self.publish_raw(body, "application/json")

    def drain(self, queue: str) -> list[tuple[pika.spec.BasicProperties, bytes]]:
        messages = []
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return messages
            messages.append((properties, body))

    def drain_until(self, queue: str, count: int,
                    timeout: float = 60) -> list[tuple[pika.spec.BasicProperties, bytes]]:
        """Take messages from `queue` until `count` came or the bound passed (short then: the
        caller's assertion says what is missing)."""
        messages: list[tuple[pika.spec.BasicProperties, bytes]] = []

        def enough() -> bool:
            messages.extend(self.drain(queue))
            return len(messages) >= count

        wait_until(enough, f"{count} messages in {queue}", timeout, required=False)
        return messages

    def depth(self, queue: str) -> int:
        """Messages ready in `queue`; 0 while it does not exist yet."""
        declared = self.declared(queue)
        return declared.message_count if declared else 0

    def declared(self, queue: str) -> pika.spec.Queue.DeclareOk | None:
        """`queue`'s ready messages and consumers as the broker sees them now; None: no such queue."""
        try:
            return self.channel.queue_declare(queue, passive=True).method
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            self.channel = self.connection.channel()
            self.channel.confirm_delivery()
            return None


def collect_alerts(broker: Broker, expected: int, timeout: float = 60, settle: float = 1.0) -> list[dict]:
    """Read the alert tap until `expected` alerts came, then listen `settle` s more for extras.

    Short when the bound passes: the caller's assertion says which alerts are missing. The
    `settle` window is a quiet window: a repeat after a crash or an alert fired by a book's
    clock is ordered after nothing a test could publish, so no barrier proves it absent."""
    alerts: list[dict] = []

    def read() -> bool:
        for properties, body in broker.drain(TAP):
            alerts.extend(read_alert_message(properties, body))
        return len(alerts) >= expected

    if not wait_until(read, f"{expected} alerts on the tap", timeout, required=False):
        return alerts
    quiet_window(settle, "repeats after a crash and clock-fired alerts have no barrier", listen=read)
    return alerts


def alerts_before_barrier(broker: Broker, timeout: float = 60) -> list[dict]:
    """Publish an order that alerts at once and read the tap until its alert came: the other
    alerts read meanwhile. A barrier for the engine (the default mode) only: one consumer
    takes the ingress in order and publishes each cycle's alerts in order, so whatever the
    earlier input fires at once is on the tap before the barrier's alert."""
    order = f"barrier-{uuid.uuid4().hex[:12]}"
    marker = f"over_purchase:{order}"
    broker.publish([PurchaseRequest(order, 1, "barrier", "barrier"),
                    Purchase(f"{order}-p", order, 2, "barrier", "barrier")], batch=2)
    alerts: list[dict] = []

    def read() -> bool:
        for properties, body in broker.drain(TAP):
            alerts.extend(read_alert_message(properties, body))
        return any(alert["alert_id"] == marker for alert in alerts)

    wait_until(read, lambda: f"the barrier alert {marker} (read so far: {alert_counts(alerts)})", timeout)
    assert alert_counts(alerts)[marker] == 1, alert_counts(alerts)
    return [alert for alert in alerts if alert["alert_id"] != marker]


def read_alert_message(properties: pika.spec.BasicProperties, body: bytes) -> list[dict]:
    """The alerts of one `Aldebaran.Alert` message: one object (message_id = alert_id) or a
    batch, a JSON array under a batch id (CONTRACT §3)."""
    value = json.loads(body)
    if isinstance(value, list):
        assert properties.message_id and properties.message_id.startswith("batch:"), properties.message_id
        assert value and all(isinstance(alert, dict) for alert in value)
        return value
    assert properties.message_id == value["alert_id"]
    return [value]


def alert_counts(alerts: list[dict]) -> Counter[str]:
    return Counter(a["alert_id"] for a in alerts)
