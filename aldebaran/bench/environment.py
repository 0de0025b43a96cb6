"""A private place for one bench phase: its own vhost, Redis prefix, and process CPU accounting.

Every phase starts from an empty vhost so no phase sees another's queues, and the
machine's other users (tests running concurrently) never see the bench's.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
import uuid
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx
import psutil

import aldebaran
from aldebaran.io.redis import sync_client
from aldebaran.settings import Settings


def pin_workers(environ: MutableMapping[str, str]) -> None:
    """Every process the bench starts runs the code the bench was imported from. `python -m`
    puts its working directory first on the path: a bench imported from a second checkout (on
    `PYTHONPATH`) but run from main's directory started main's engine, and measured main twice."""
    root = str(Path(aldebaran.__file__).resolve().parents[1])
    environ["PYTHONSAFEPATH"] = "1"  # Python 3.11: no working directory first on the path
    environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [environ.get("PYTHONPATH")])])


def _management(settings: Settings) -> httpx.Client:
    parts = urlsplit(settings.management_url)
    base = urlunsplit((parts.scheme, f"{parts.hostname}:{parts.port or 15672}", parts.path.rstrip("/"), "", ""))
    return httpx.Client(base_url=base, auth=(unquote(parts.username or "guest"), unquote(parts.password or "guest")),
                        timeout=30)


@dataclass
class Place:
    """One phase's vhost and key prefix; `settings` points at both."""

    base: Settings
    vhost: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:10]}")
    prefix: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:10]}")

    @property
    def amqp_url(self) -> str:
        parts = urlsplit(self.base.amqp_url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + quote(self.vhost, safe=""), parts.query, ""))

    def settings(self, **overrides: object) -> Settings:
        return self.base.model_copy(update={"amqp_url": self.amqp_url, "amqp_urls": [],
                                            "redis_key_prefix": self.prefix, **overrides})

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for `aldebaran` subprocesses of this phase."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
        env.update(ALDEBARAN_AMQP_URL=self.amqp_url, ALDEBARAN_REDIS_URL=self.base.redis_url,
                   ALDEBARAN_REDIS_KEY_PREFIX=self.prefix, ALDEBARAN_MANAGEMENT_URL=self.base.management_url,
                   ALDEBARAN_LOG_FORMAT="json", PYTHONUNBUFFERED="1", **extra)
        return env

    def __enter__(self) -> Place:
        user = urlsplit(self.base.amqp_url).username or "guest"
        with _management(self.base) as http:
            http.put(f"/api/vhosts/{quote(self.vhost, safe='')}").raise_for_status()
            http.put(f"/api/permissions/{quote(self.vhost, safe='')}/{unquote(user)}",
                     json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
        return self

    def __exit__(self, *_: object) -> None:
        with _management(self.base) as http:
            http.delete(f"/api/vhosts/{quote(self.vhost, safe='')}")
        client = sync_client(self.base.redis_url, timeout=30, tls_ca_file=self.base.tls_ca_file)
        keys = list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        client.close()


def free_ports(count: int) -> int:
    """A base port with `count` consecutive free ports after it (metrics of child processes)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count >= 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports found")


class CpuMeter:
    """CPU seconds of named processes between `start` and `stop` (cores = seconds / wall)."""

    def __init__(self) -> None:
        self._start: dict[int, tuple[str, float]] = {}
        self.cores: dict[str, float] = {}

    @staticmethod
    def _label(process: psutil.Process) -> str:
        name = process.name()
        if name.startswith("beam"):
            return "rabbitmq"
        if name.startswith("redis"):
            return "redis"
        cmd = process.cmdline()
        if "run" in cmd and cmd.index("run") + 1 < len(cmd):
            return cmd[cmd.index("run") + 1]
        if "up" in cmd:
            return "up"
        if process.pid == os.getpid():
            return "bench"
        return name

    def processes(self, roots: list[int]) -> list[psutil.Process]:
        found = [psutil.Process(os.getpid())]
        for pid in roots:
            try:
                root = psutil.Process(pid)
                found += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for process in psutil.process_iter(["name"]):
            if (process.info["name"] or "").startswith(("beam.smp", "redis-server")):
                found.append(process)
        return found

    def start(self, roots: list[int]) -> None:
        self._start = {}
        self._t0 = time.monotonic()
        for process in self.processes(roots):
            try:
                times = process.cpu_times()
                self._start[process.pid] = (self._label(process), times.user + times.system)
            except psutil.Error:
                pass
        self._roots = roots

    def stop(self) -> dict[str, float]:
        wall = max(1e-6, time.monotonic() - self._t0)
        cores: dict[str, float] = {}
        for pid, (label, before) in self._start.items():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            cores[label] = cores.get(label, 0.0) + (times.user + times.system - before) / wall
        self.cores = cores
        return cores


async def start_worker(args: Sequence[str], log: Path, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """`aldebaran run *args` in a process of its own, its output to `log` (the child writes
    through its own copy of the descriptor; ours closes once it has started)."""
    with open(log, "wb") as out:
        return await asyncio.create_subprocess_exec(sys.executable, "-m", "aldebaran.cli", "run", *args,
                                                    env=dict(env), stdout=out, stderr=out)


async def stop_process(process: asyncio.subprocess.Process, grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds: a wedged worker must not hang the bench."""
    if process.returncode is None:
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        process.kill()
        await process.wait()
