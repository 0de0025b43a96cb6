"""A throwaway RabbitMQ node on free ports, for tests that stop or restart the broker.

The machine's shared broker (5672) is never touched: this node has its own node name,
AMQP and distribution ports, its own epmd port, its own mnesia and log directories and
its own Erlang cookie (a private HOME), all under a temp dir, bound to 127.0.0.1. It
can be stopped and started again mid-test (durable queues and persistent messages
survive, like a real broker restart) and is removed with its files at the end.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.waiting import wait_until

RABBIT_BIN = Path(os.environ.get("TEST_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections as their local port."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_HANDED_OUT: set[int] = set()  # a port handed out is not handed out again while this process runs


def free_port() -> int:
    """A free port outside the kernel's ephemeral range, for a server that may restart.

    While a private server is down its port is unbound, and a port of the ephemeral range can
    then become the local port of any outgoing connection on the machine (the workers' own
    reconnects to that very port included): the server could not listen on it again, and the
    test would wait out its patience on "connection refused". Ports outside the range are never
    handed out that way: the 12,000 below it, or those above it where the range starts too low.
    """
    low, high = _ephemeral_range()
    band = (max(1024, low - 12000), low) if low - 1024 >= 2000 else (high + 1, 65536)
    while True:
        port = random.randrange(*band)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class PrivateRabbit:
    """One private node: `start()`, `stop()`, `restart()`, `cleanup()`; `url` for clients."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="aldebaran-rabbit-"))
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.name = f"aldtest{uuid.uuid4().hex[:8]}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        self._prepare()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _prepare(self) -> None:
        home = self.root / "home"
        for sub in ("home", "mnesia", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(uuid.uuid4().hex.upper())
            cookie.chmod(0o400)
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = info\n"
            "vm_memory_high_watermark.relative = 0.2\n"
            "disk_free_limit.absolute = 50MB\n")
        (self.root / "enabled_plugins").write_text("[].\n")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.root / "home"),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.root / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.root / "log"),
            RABBITMQ_CONFIG_FILE=str(self.root / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.root / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.root / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.root / "rabbit.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.epmd_port),
        )
        return env

    def _ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.name, *args], env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def start(self, timeout: float = 90) -> PrivateRabbit:
        (self.root / "advanced.config").write_text("[].\n")
        with open(self.root / "server.out", "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self.env(),
                                            stdout=log, stderr=log, cwd=self.root, start_new_session=True)
        process, deadline = self.process, time.monotonic() + timeout

        def up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"private RabbitMQ exited with {process.returncode}: {self.server_log()}")
            # The listener opens near the end of boot; await_startup confirms the app runs.
            return port_open(self.port) and self._ctl(
                "await_startup", timeout=max(5.0, deadline - time.monotonic())).returncode == 0

        wait_until(up, lambda: f"the private RabbitMQ to be up: {self.server_log()}", timeout, pause=0.3)
        return self

    def server_log(self) -> str:
        out = (self.root / "server.out")
        text = out.read_text(errors="replace")[-3000:] if out.exists() else ""
        return text

    def stop(self, timeout: float = 60) -> None:
        """Stop the node cleanly (as `systemctl restart` would); data stays on disk."""
        if self.process is None:
            return
        if self.process.poll() is None:
            result = self._ctl("stop", timeout=timeout)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=30)
            if result.returncode != 0 and self.process.returncode not in (0, None):
                pass
        self.process = None

    def kill(self) -> None:
        """Hard-kill the node (its whole process group: beam and its helpers)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            # epmd was started by our node on our private port and outlives it; end that
            # one (and only that one) through its own port.
            subprocess.run(["epmd", "-port", str(self.epmd_port), "-kill"], capture_output=True, timeout=10,
                           env={**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1"})
            shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def private_rabbit() -> Iterator[PrivateRabbit]:
    node = PrivateRabbit()
    try:
        yield node.start()
    finally:
        node.cleanup()
