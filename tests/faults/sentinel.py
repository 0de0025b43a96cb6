"""A private Redis Sentinel deployment: a master, its replicas and three sentinels on free ports.

Every process is a `redis-server` this harness starts (`--sentinel` for the sentinels),
with its own directory, so a test can SIGKILL the master and watch the sentinels fail
over. The machine's shared Redis (6379) is never touched. Waits poll a condition (a
sentinel's answer, a replica's link) with a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import redis

from tests.support.processes import free_port, spawn_logged
from tests.support.waiting import wait_until

SERVICE = "aldebaran"
T = TypeVar("T")


@dataclass
class Node:
    """One redis-server of the group (a data node or a sentinel)."""

    port: int
    root: Path
    process: subprocess.Popen[bytes] | None = None

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.05) -> T:
    """Poll `probe` until it returns something other than None/False; its errors count as 'not yet'."""
    def found() -> tuple[T] | None:
        value = probe()
        return None if value is None or value is False else (value,)

    return wait_until(found, what, timeout, pause=every, ignoring=(redis.RedisError, OSError))[0]


class SentinelGroup:
    """Master + `replicas` replicas + 3 sentinels (quorum 2), AOF on as in deploy/redis/redis.conf."""

    # 3 s, not 1: on a loaded 2-core box a sentinel that needs over a second to reach a
    # freshly promoted master calls it down too and fails over a second time.
    def __init__(self, root: Path, replicas: int = 1, down_after_ms: int = 3000,
                 failover_timeout_ms: int = 10_000) -> None:
        self.root = root
        self.nodes = [Node(free_port(), root / f"node{i}") for i in range(1 + replicas)]
        self.sentinels = [Node(free_port(), root / f"sentinel{i}") for i in range(3)]
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def _spawn(self, node: Node, args: list[str]) -> None:
        node.root.mkdir(parents=True, exist_ok=True)
        node.process = spawn_logged(["redis-server", *args], node.root / "redis.log", cwd=node.root)

    def start_node(self, node: Node, replica_of: int | None = None) -> None:
        args = ["--port", str(node.port), "--bind", "127.0.0.1", "--dir", str(node.root), "--save", "",
                "--appendonly", "yes", "--appendfsync", "everysec",
                "--repl-diskless-sync-delay", "0"]  # a returning replica syncs at once (default: 5 s later)
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._spawn(node, args)
        wait_for(f"redis {node.port} up", lambda: node.client().ping(), 30)

    def start(self, timeout: float = 30) -> SentinelGroup:
        master = self.nodes[0]
        self.start_node(master)
        for node in self.nodes[1:]:
            self.start_node(node, replica_of=master.port)
        self.wait_replicas(master.port, len(self.nodes) - 1, timeout)
        for sentinel in self.sentinels:
            sentinel.root.mkdir(parents=True, exist_ok=True)
            conf = sentinel.root / "sentinel.conf"  # the sentinel rewrites it: one file each
            conf.write_text(
                f"port {sentinel.port}\nbind 127.0.0.1\ndir {sentinel.root}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n")
            self._spawn(sentinel, [str(conf), "--sentinel"])
        # Ready when every sentinel knows the other two and the replicas (they gossip via hello).
        for sentinel in self.sentinels:
            wait_for(f"sentinel {sentinel.port} sees the group", lambda s=sentinel: self._sees_all(s), timeout)
        return self

    def _sees_all(self, sentinel: Node) -> bool:
        state = sentinel.client().sentinel_master(SERVICE)
        return (state["num-other-sentinels"] == len(self.sentinels) - 1
                and state["num-slaves"] >= len(self.nodes) - 1 and not state["is_sdown"])

    def master_port(self, sentinel: Node | None = None) -> int:
        """The master as a sentinel reports it."""
        _host, port = (sentinel or self.sentinels[0]).client().sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def kill(self, port: int) -> None:
        """SIGKILL one data node: no goodbye, no AOF flush beyond what `everysec` wrote."""
        node = self.node(port)
        assert node.process is not None
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(timeout=10)

    def wait_for_failover(self, old_port: int, timeout: float = 60) -> int:
        """Until every live sentinel names a new master and that node says it is one."""
        def promoted() -> int | None:
            ports = {self.master_port(s) for s in self.sentinels if s.alive}
            if len(ports) != 1 or old_port in ports:
                return None
            port = ports.pop()
            return port if self.node(port).client().info("replication")["role"] == "master" else None
        return wait_for("sentinels report a new master", promoted, timeout)

    def wait_replicas(self, master_port: int, count: int, timeout: float = 60) -> int:
        """Until `count` replicas are attached to the master with an online link."""
        def attached() -> int | None:
            info = self.node(master_port).client().info("replication")
            online = sum(1 for key, value in info.items()
                         if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online")
            return online if online >= count else None
        return wait_for(f"{count} replica(s) online on {master_port}", attached, timeout)

    def restart(self, port: int, replica_of: int | None = None) -> None:
        """Start a killed node again with its own files, as a replica of `replica_of` if given
        (what an operator or config management does). Left a master, the sentinels convert it
        themselves, but only at their next INFO of it, ~10 s later."""
        self.start_node(self.node(port), replica_of)

    def close(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            if node.alive:
                assert node.process is not None
                node.process.kill()
                node.process.wait(timeout=10)
            node.process = None
