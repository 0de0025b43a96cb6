"""Drive the real pipeline: `aldebaran up` as a subprocess, the public ingress, an alert tap."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import msgspec
import pika
import pika.exceptions

from aldebaran.trades.codec import encode_json
from aldebaran.trades.events import TradeEvent

TAP = "test.alert-tap"


class Pipeline:
    """One `aldebaran up` process bound to a test's vhost and Redis prefix."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str, tracer: bool = False) -> None:
        self.env = env
        self.log_path = log_path
        self.args = args if tracer else ("--no-tracer", *args)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: float = 60) -> "Pipeline":
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aldebaran.cli", "up", *self.args],
            env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + wait_ready
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"aldebaran up exited with {self.process.returncode}:\n{self.log()}")
            if '"event": "ready"' in self.log():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"aldebaran up not ready after {wait_ready}s:\n{self.log()}")

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
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "aldebaran.cli", "run", *args],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
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

    def depth(self, queue: str) -> int:
        """Messages ready in `queue`; 0 while it does not exist yet."""
        try:
            return self.channel.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            self.channel = self.connection.channel()
            self.channel.confirm_delivery()
            return 0


def collect_alerts(broker: Broker, expected: int, timeout: float = 60, settle: float = 1.0) -> list[dict]:
    """Read the alert tap until `expected` alerts came (then `settle` s more for extras)."""
    alerts: list[dict] = []
    deadline = time.monotonic() + timeout
    settled_at = None
    while time.monotonic() < deadline:
        batch = broker.drain(TAP)
        for properties, body in batch:
            alerts += read_alert_message(properties, body)
        if len(alerts) >= expected:
            settled_at = settled_at or time.monotonic()
            if time.monotonic() - settled_at >= settle:
                break
        if not batch:
            time.sleep(0.1)
    return alerts


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
