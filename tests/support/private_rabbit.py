"""A throwaway RabbitMQ node on free ports, for tests that stop or restart the broker.

The machine's shared broker (5672) is never touched: this node has its own node name,
AMQP and distribution ports, its own epmd port, its own mnesia and log directories and
its own Erlang cookie (a private HOME), all under a temp dir, bound to 127.0.0.1. It
can be stopped and started again mid-test (durable queues and persistent messages
survive, like a real broker restart) and is removed with its files at the end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import free_port, spawn_logged
from tests.support.waiting import wait_until

RABBIT_BIN = Path(os.environ.get("TEST_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class PrivateRabbit:
    """One private node: `start()`, `stop()`, `restart()`, `cleanup()`; `url` for clients."""

    def __init__(self, root: Path | None = None, env_file: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="aldebaran-rabbit-"))
        # A rabbitmq-env.conf of the test's: the node takes its SERVER_ADDITIONAL_ERL_ARGS from it.
        self.env_file = env_file
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
        if self.env_file is not None:
            env["RABBITMQ_CONF_ENV_FILE"] = str(self.env_file)
            del env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
        return env

    def _ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.name, *args], env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def erlang_eval(self, expression: str) -> str:
        """What `rabbitmqctl eval` prints for an Erlang expression run on the node."""
        result = self._ctl("eval", expression)
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl eval {expression!r} failed: {result.stderr or result.stdout}")
        return result.stdout.strip()

    def start(self, timeout: float = 90) -> PrivateRabbit:
        (self.root / "advanced.config").write_text("[].\n")
        self.process = spawn_logged([str(RABBIT_BIN / "rabbitmq-server")], self.root / "server.out", env=self.env(),
                                    cwd=self.root, start_new_session=True)
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
def private_rabbit(env_file: Path | None = None) -> Iterator[PrivateRabbit]:
    node = PrivateRabbit(env_file=env_file)
    try:
        yield node.start()
    finally:
        node.cleanup()
