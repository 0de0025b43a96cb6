"""The fault suite's harness: workers as separate processes, real sinks, a retrying publisher.

Each worker kind runs as its own `aldebaran run KIND [NAME]` process (as the systemd
fleet runs them), so a test can SIGKILL one kind and start it again. The sinks are a
local HTTP server behind a `webhook` channel and the Redis pull queue behind a
`queue-api` channel; `deliveries()` reads what each really received, repeats included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pika
import pika.exceptions
import redis

from aldebaran.io.redis import sync_client
from aldebaran.trades.codec import encode_json
from aldebaran.trades.events import TradeEvent
from tests.support.checker import SinkReport, check
from tests.support.processes import free_port, spawn_logged
from tests.support.scale import FULL
from tests.support.waiting import quiet_window, wait_until

KINDS = ("engine", "lookout", "hook", "pull")  # the default mode; per-order tests name their kinds
PER_ORDER_ROLES = {"aggregator", "books"}
CHANNEL_KINDS = {"hook": ("channel", "hook"), "pull": ("channel", "pull")}
# CI runs a small stream; FAULTS_SCALE=full runs the recorded matrix (docs/reliability.md).
ORDERS = int(os.environ.get("FAULTS_ORDERS", "1000" if FULL else "60"))
RATE = float(os.environ.get("FAULTS_RATE", "1000" if FULL else "400"))  # events/s offered
# pytest-timeout for one fault test (pyproject's 300 s default is too short at full scale).
TEST_TIMEOUT = 2400 if FULL else 300
BATCH = 10  # events per trade message


class WebhookServer:
    """A recipient: records every POST (alert id per delivery, repeats included)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay  # seconds before answering (a slow or hanging recipient)
        self.requests = 0
        self.received: list[str] = []
        self.arrivals: list[tuple[float, str]] = []  # (monotonic time at receipt, alert id)
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                at = time.monotonic()
                with owner.lock:
                    owner.requests += 1
                if owner.delay:
                    time.sleep(owner.delay)
                try:
                    alert_id = json.loads(body)["alert_id"]
                except (ValueError, KeyError):
                    self.send_response(400)
                    self.end_headers()
                    return
                with owner.lock:
                    owner.received.append(alert_id)
                    owner.arrivals.append((at, alert_id))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def deliveries(self) -> list[str]:
        with self.lock:
            return list(self.received)

    def timeline(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.arrivals)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def channels_toml(path: Path, webhook_url: str) -> Path:
    path.write_text(
        "[[channels]]\nname = \"hook\"\nkind = \"webhook\"\n"
        f"url = \"{webhook_url}\"\nmax_attempts = 1000\nbackoff_max_seconds = 2.0\n\n"
        "[[channels]]\nname = \"pull\"\nkind = \"queue-api\"\nqueue = \"faults\"\n"
        "max_attempts = 1000\nbackoff_max_seconds = 2.0\n")
    return path


def pull_queue_deliveries(redis_url: str, prefix: str, queue: str = "faults") -> list[str]:
    """Every message the queue-api sink enqueued (one per enqueue, repeats included).

    `redis_url` may be a Sentinel URL: the master is found as the workers find it."""
    client = sync_client(redis_url, timeout=10)
    try:
        bodies = client.hvals(f"{prefix}:pullq:{queue}:bodies")
    finally:
        client.close()
    return [json.loads(json.loads(b)["message"])["alert_id"] for b in bodies]


@dataclass
class Fleet:
    """Every worker of the pipeline, one process per kind, bound to `env`."""

    env: dict[str, str]
    logs: Path
    kinds: Sequence[str] = KINDS
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)
    _ready_before: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if PER_ORDER_ROLES & set(self.kinds):  # `aldebaran run` refuses them in the engine mode
            self.env = {"ALDEBARAN_MODE": "per-order", **self.env}

    def log_path(self, kind: str) -> Path:
        return self.logs / f"{kind}.log"

    def command(self, kind: str) -> list[str]:
        args = CHANNEL_KINDS.get(kind, (kind,))
        return [sys.executable, "-m", "aldebaran.cli", "run", *args]

    def start(self, kind: str, wait: bool = True, timeout: float = 90) -> subprocess.Popen[bytes]:
        path = self.log_path(kind)
        before = path.read_text(errors="replace").count('"event": "ready"') if path.exists() else 0
        self._ready_before[kind] = before
        process = spawn_logged(self.command(kind), path, env=self.env)
        self.processes[kind] = process
        self.starts[kind] = self.starts.get(kind, 0) + 1
        if wait:
            self.wait_ready(kind, timeout)
        return process

    def wait_ready(self, kind: str, timeout: float = 90) -> None:
        """Wait until the latest process of `kind` said it is ready."""
        before = self._ready_before.get(kind, 0)
        process = self.processes[kind]

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"{kind} exited with {process.returncode}:\n{self.tail(kind)}")
            return self.log_path(kind).read_text(errors="replace").count('"event": "ready"') > before

        wait_until(ready, lambda: f"{kind} to be ready:\n{self.tail(kind)}", timeout)

    def start_all(self) -> Fleet:
        for kind in self.kinds:
            self.start(kind, wait=False)
        for kind in self.kinds:
            self.wait_ready(kind)
        return self

    def kill(self, kind: str) -> None:
        """SIGKILL: no goodbye, no acks, no closing; the broker requeues what it held."""
        process = self.processes[kind]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        self.kills[kind] = self.kills.get(kind, 0) + 1

    def bounce(self, kind: str) -> None:
        """Kill a working process of `kind` (the previous restart is ready first) and restart it."""
        self.wait_ready(kind)
        self.kill(kind)
        self.start(kind, wait=False)

    def alive(self) -> dict[str, int | None]:
        return {kind: p.poll() for kind, p in self.processes.items()}

    def stop_all(self, timeout: float = 60) -> dict[str, int]:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = {}
        for kind, process in self.processes.items():
            try:
                codes[kind] = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[kind] = process.wait(timeout=30)
        return codes

    def tail(self, kind: str, chars: int = 4000) -> str:
        path = self.log_path(kind)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def all_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")))


class RetryingPublisher:
    """Publishes trade messages with confirms; an unconfirmed message is sent again.

    A lost connection (a broker restart, a cut) means every message not yet confirmed
    is published again on a new connection: a repeat is harmless (events count once per
    id), a loss is not. Retries for up to `patience` seconds per message.
    """

    def __init__(self, url: str, patience: float = 180) -> None:
        self.url = url
        self.patience = patience
        self.retries = 0
        self.connection: pika.BlockingConnection | None = None
        self.channel = None

    def _connect(self) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def publish_raw(self, body: bytes, content_type: str | None = "application/json",
                    headers: dict | None = None) -> None:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                if self.connection is None or not self.connection.is_open:
                    self._connect()
                self.channel.basic_publish(
                    "Aldebaran.Trade_Data", "Aldebaran.Trade_Data", body,
                    pika.BasicProperties(content_type=content_type, delivery_mode=2, headers=headers),
                    mandatory=True)
                return
            except (pika.exceptions.AMQPError, OSError) as exc:
                self.retries += 1
                self.connection = None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"publish failed for {self.patience}s: {exc!r}") from exc
                time.sleep(0.5)

    def publish_stream(self, events: Sequence[TradeEvent], *, rate: float = RATE, batch: int = BATCH,
                       at: dict[float, Callable[[], None]] | None = None) -> None:
        """Publish `events` in batches at about `rate` events/s; call `at[f]` after fraction f."""
        marks = sorted((at or {}).items())
        started = time.monotonic()
        for start in range(0, len(events), batch):
            chunk = events[start:start + batch]
            body = msgspec.json.encode(chunk[0].to_wire()) if len(chunk) == 1 else encode_json(list(chunk))
            self.publish_raw(body)
            done = start + len(chunk)
            while marks and done >= marks[0][0] * len(events):
                marks.pop(0)[1]()
            ahead = done / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        for _, action in marks:
            action()

    def close(self) -> None:
        try:
            if self.connection is not None and self.connection.is_open:
                self.connection.close()
        except Exception:  # noqa: BLE001 - closing after a fault may fail
            pass


def wait_for_sinks(expected: set[str], sinks: dict[str, Callable[[], list[str]]], timeout: float,
                   settle: float = 3.0, in_doubt: dict[str, Callable[[], list[str]]] | None = None,
                   ) -> dict[str, SinkReport]:
    """Poll every sink until it has every expected alert, or has it in doubt (at-most-once,
    `in_doubt` readers by sink), or the bounded wait ends; then keep listening `settle`
    seconds more so late repeats are caught too (a quiet window: a repeat comes from a
    redelivery after a fault, which nothing the test could publish is ordered after)."""
    doubt = in_doubt or {}

    def accounted(name: str, read: Callable[[], list[str]]) -> bool:
        return expected <= set(read()) | set(doubt[name]() if name in doubt else ())

    wait_until(lambda: all(accounted(name, read) for name, read in sinks.items()),
               "every sink to account for every expected alert", timeout, pause=0.5, required=False)
    quiet_window(settle, "a late repeat follows a redelivery after a fault: no barrier orders it")
    return {name: check(name, expected, read(), doubt[name]() if name in doubt else ())
            for name, read in sinks.items()}


def in_doubt_ids(redis_url: str, prefix: str, channel: str = "hook") -> list[str]:
    """The alert ids an at-most-once channel lists in doubt (aldebaran/channels/ledger.py)."""
    client = sync_client(redis_url, timeout=10)
    try:
        return [json.loads(field)[0] for field in client.hkeys(f"{prefix}:in-doubt:{channel}")]
    finally:
        client.close()


def describe(reports: Iterable[SinkReport]) -> str:
    return "\n".join(r.line() + (f"\n  lost: {r.lost[:10]}\n  dup: {list(r.duplicated.items())[:10]}"
                                 f"\n  unexpected: {r.unexpected[:10]}" if not r.ok else "") for r in reports)


class PrivateRedis:
    """A throwaway redis-server on a free port with AOF on (as deploy/redis/redis.conf)."""

    def __init__(self, root: Path, password: str | None = None) -> None:
        self.password = password
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _client(self, timeout: float) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=timeout)

    def start(self, timeout: float = 30) -> PrivateRedis:
        self.process = spawn_logged(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--appendonly", "yes",
             "--appendfsync", "everysec", "--dir", str(self.root), "--save", "",
             *(["--requirepass", self.password] if self.password else [])], self.root / "redis.log")
        process = self.process

        def up() -> bool:
            if process.poll() is not None:
                raise RuntimeError((self.root / "redis.log").read_text()[-2000:])
            return bool(self._client(1).ping())

        wait_until(up, "the private redis-server to answer", timeout, ignoring=(redis.exceptions.RedisError,))
        return self

    def stop(self) -> None:
        """SHUTDOWN (flushes the AOF), as a service restart does."""
        if self.process is None:
            return
        with contextlib.suppress(redis.exceptions.RedisError):
            self._client(5).shutdown()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, down_seconds: float = 2.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()
        self.restarts += 1

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class Fault(threading.Thread):
    """A fault injected from a thread, so the publisher keeps publishing (and retrying)
    meanwhile. What the fault raised is kept: a restart that never came back is reported as
    itself, not as the publisher's "connection refused" minutes later."""

    def __init__(self, action: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.action = action
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.action()
        except BaseException as exc:  # noqa: BLE001 - kept for the test to raise
            self.error = exc


def in_background(action: Callable[[], None]) -> Callable[[], Fault]:
    """A mark's action that starts `action` as a Fault and returns it."""
    def start() -> Fault:
        fault = Fault(action)
        fault.start()
        return fault
    return start


def raise_fault_errors(faults: Iterable[Fault]) -> None:
    """Raise what the first failed fault raised, if one failed."""
    for fault in faults:
        if fault.error is not None:
            raise RuntimeError(f"a fault injected mid-stream failed: {fault.error!r}") from fault.error
