#!/usr/bin/env python3
"""A private three-node RabbitMQ cluster on this machine: the multi-host test bed.

    python deploy/testbed/cluster.py start [--nodes 3] [--base-port 5781] [--management]
    python deploy/testbed/cluster.py status          # members, running nodes, queue leaders
    python deploy/testbed/cluster.py urls            # ALDEBARAN_AMQP_URLS for the workers (JSON)
    python deploy/testbed/cluster.py stop-node 2     # stop one node (its data stays)
    python deploy/testbed/cluster.py start-node 2    # bring it back; it rejoins by itself
    python deploy/testbed/cluster.py stop            # reset, stop, end our epmd, delete files

Why a script and not Docker: the nodes are ordinary `rabbitmq-server` processes from the
Debian package, so the test bed starts in ~15-30 s on a loaded 2-core box and needs no
daemon. The machine's shared broker (rabbit@localhost, 5672/25672/15672, epmd 4369) is
never touched: every node here has its own node name (`aldebaran-cN@localhost`), AMQP,
distribution and management ports (base+N-1, 20000+base+N-1, 10000+base+N-1), its own
mnesia/log/config under one root directory, a private HOME (one Erlang cookie for the
nodes and the CLI) and a private epmd on its own port that this script starts and ends
by its pid. Everything binds to 127.0.0.1.

`Cluster` is also the Python API of the cluster test (`tests/cluster/`): any failure
while starting tears down what was started (`with Cluster(...).running():`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

RABBIT_BIN = Path(os.environ.get("TEST_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
DEFAULT_ROOT = Path(os.environ.get("ALDEBARAN_TESTBED_ROOT", f"/tmp/aldebaran-testbed-{os.getuid()}"))
SHARED_PORTS = {5672, 25672, 15672, 4369}  # the machine's broker and epmd: never ours
LOCAL_DIST = "-kernel inet_dist_use_interface {127,0,0,1}"


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports from the OS: every probe stays bound until all are chosen (one
    probe after another, closed each time, can be handed the same port twice)."""
    with contextlib.ExitStack() as probes:
        sockets = [probes.enter_context(socket.socket()) for _ in range(count)]
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in sockets]


@dataclass
class Node:
    index: int
    name: str
    port: int
    dist_port: int
    management_port: int
    pid: int | None = None  # the rabbitmq-server wrapper (leader of its process group)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"


@dataclass
class Cluster:
    """A private cluster under `root`; its state is saved in `root/state.json`."""

    root: Path = DEFAULT_ROOT
    size: int = 3
    base_port: int = 5781
    management: bool = False
    prefix: str = "aldebaran-c"
    epmd_port: int = 0
    epmd_pid: int | None = None
    nodes: list[Node] = field(default_factory=list)
    formed_in: float = 0.0  # seconds from first boot to all members running
    # With base_port 0: the ports to take (epmd's, then each node's AMQP, distribution and
    # management port), e.g. ports outside the ephemeral range for a node that restarts;
    # empty, free ports from the OS.
    ports: list[int] = field(default_factory=list)

    # ---- layout -------------------------------------------------------------------------
    def plan(self) -> None:
        """Choose names and ports (base_port 0 = free ports from the OS)."""
        self.root = Path(self.root)
        wanted = 1 + 3 * self.size
        if self.base_port == 0 and self.ports and len(set(self.ports)) < wanted:
            raise SystemExit(f"{wanted} distinct ports needed, {len(set(self.ports))} given")
        chosen = iter((self.ports or free_ports(wanted)) if self.base_port == 0 else [])
        if not self.epmd_port:
            self.epmd_port = next(chosen) if self.base_port == 0 else 20000 + self.base_port - 1000
        self.nodes = []
        for i in range(1, self.size + 1):
            if self.base_port:
                port = self.base_port + i - 1
                dist, mgmt = 20000 + port, 10000 + port
            else:
                port, dist, mgmt = next(chosen), next(chosen), next(chosen)
            self.nodes.append(Node(i, f"{self.prefix}{i}@localhost", port, dist, mgmt))
        used = {p for n in self.nodes for p in (n.port, n.dist_port, n.management_port)} | {self.epmd_port}
        if used & SHARED_PORTS:
            raise SystemExit(f"refusing ports of the shared broker: {sorted(used & SHARED_PORTS)}")
        busy = sorted(p for p in used if port_open(p))
        if busy:
            raise SystemExit(f"ports already in use (another test bed running?): {busy}")

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def node(self, index: int) -> Node:
        return self.nodes[index - 1]

    def node_by_name(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def _dir(self, node: Node) -> Path:
        return self.root / f"node{node.index}"

    def env(self, node: Node | None = None) -> dict[str, str]:
        """Server/CLI environment: a private HOME (cookie) and epmd, all bound to 127.0.0.1."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(HOME=str(self.root / "home"), ERL_EPMD_ADDRESS="127.0.0.1", ERL_EPMD_PORT=str(self.epmd_port),
                   RABBITMQ_CTL_ERL_ARGS=LOCAL_DIST)
        if node is not None:
            d = self._dir(node)
            env.update(
                RABBITMQ_NODENAME=node.name,
                RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                RABBITMQ_NODE_PORT=str(node.port),
                RABBITMQ_DIST_PORT=str(node.dist_port),
                RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
                RABBITMQ_LOG_BASE=str(d / "log"),
                RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
                RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
                RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
                RABBITMQ_PID_FILE=str(d / "rabbit.pid"),
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=LOCAL_DIST,
            )
        return env

    def _write_files(self) -> None:
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(uuid.uuid4().hex.upper())
            cookie.chmod(0o400)
        for node in self.nodes:
            d = self._dir(node)
            for sub in ("mnesia", "log"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            conf = [
                f"listeners.tcp.1 = 127.0.0.1:{node.port}",
                "loopback_users = none",
                "log.console = false",
                "log.file.level = warning",
                # Three nodes share 24 GiB with everything else on this box.
                "vm_memory_high_watermark.relative = 0.15",
                "disk_free_limit.absolute = 50MB",
                # A stopped node is brought back by hand: no automatic partition healing games.
                "cluster_partition_handling = pause_minority",
            ]
            if self.management:
                conf += [f"management.tcp.port = {node.management_port}", "management.tcp.ip = 127.0.0.1"]
            (d / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
            (d / "advanced.config").write_text("[].\n")
            plugins = "[rabbitmq_management]." if self.management else "[]."
            (d / "enabled_plugins").write_text(plugins + "\n")

    def save(self) -> None:
        state = asdict(self)
        state["root"] = str(self.root)
        (self.root / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, root: Path = DEFAULT_ROOT) -> Cluster:
        path = Path(root) / "state.json"
        if not path.exists():
            raise SystemExit(f"no test bed under {root} (start one with `cluster.py start`)")
        state = json.loads(path.read_text())
        nodes = [Node(**n) for n in state.pop("nodes")]
        cluster = cls(**{**state, "root": Path(state["root"])})
        cluster.nodes = nodes
        return cluster

    # ---- processes -------------------------------------------------------------------------
    def ctl(self, node: Node, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", node.name, *args], env=self.env(node),
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node.name} {' '.join(args)}: {result.stderr.strip() or result.stdout}")
        return result

    def _start_epmd(self) -> None:
        if self.epmd_pid and _alive(self.epmd_pid):
            return
        with open(self.root / "epmd.out", "ab") as log:  # the child keeps its own copy
            process = subprocess.Popen(["epmd", "-port", str(self.epmd_port)], env=self.env(), stdout=log,
                                       stderr=log, start_new_session=True)
        self.epmd_pid = process.pid
        self.save()
        deadline = time.monotonic() + 15
        while not port_open(self.epmd_port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private epmd did not start on {self.epmd_port}")
            time.sleep(0.1)

    def _spawn(self, node: Node) -> None:
        with open(self._dir(node) / "server.out", "ab") as log:  # the child keeps its own copy
            process = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self.env(node), stdout=log,
                                       stderr=log, cwd=self._dir(node), start_new_session=True)
        node.pid = process.pid
        self.save()

    def _await(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.pid and not _alive(node.pid):
                raise RuntimeError(f"{node.name} exited while starting:\n{self.server_log(node)}")
            if port_open(node.port):
                left = max(5.0, deadline - time.monotonic())
                if self.ctl(node, "await_startup", timeout=left).returncode == 0:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{node.name} not up after {timeout:.0f}s:\n{self.server_log(node)}")

    def server_log(self, node: Node) -> str:
        out = self._dir(node) / "server.out"
        logs = sorted((self._dir(node) / "log").glob("*.log"))
        text = out.read_text(errors="replace")[-2000:] if out.exists() else ""
        for path in logs:
            text += f"\n--- {path.name}\n" + path.read_text(errors="replace")[-2000:]
        return text

    def start(self, timeout: float = 180) -> Cluster:
        """Boot every node at once (boot is the slow part), then join 2..N to node 1."""
        self.plan()
        if self.root.exists() and (self.root / "state.json").exists():
            raise SystemExit(f"a test bed already lives under {self.root}: `cluster.py stop` it first")
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_files()
        self.save()
        try:
            started = time.monotonic()
            self._start_epmd()
            for node in self.nodes:
                self._spawn(node)
            for node in self.nodes:
                self._await(node, timeout - (time.monotonic() - started))
            first = self.nodes[0]
            for node in self.nodes[1:]:
                self.ctl(node, "stop_app", check=True)
                self.ctl(node, "join_cluster", first.name, check=True)
                self.ctl(node, "start_app", check=True, timeout=120)
            running = self.running_nodes()
            if len(running) != self.size:
                raise RuntimeError(f"cluster formed with {running}, expected {self.size} nodes")
            self.formed_in = time.monotonic() - started
            self.save()
        except BaseException:
            self.stop()
            raise
        return self

    def running_nodes(self) -> list[str]:
        """Running members as node 1 (or the first node that answers) sees them."""
        for node in self.nodes:
            if not node.pid or not _alive(node.pid):
                continue
            result = self.ctl(node, "cluster_status", "--formatter", "json", timeout=30)
            if result.returncode == 0:
                return list(json.loads(result.stdout).get("running_nodes", []))
        return []

    def stop_node(self, index: int, timeout: float = 90) -> None:
        """Stop one node cleanly (as `systemctl stop rabbitmq-server` on a host would)."""
        node = self.node(index)
        if node.pid and _alive(node.pid):
            self.ctl(node, "stop", timeout=timeout)
            _wait_gone(node.pid, timeout)
        node.pid = None
        self.save()

    def kill_node(self, index: int) -> None:
        """Hard-kill one node's whole process group (a host losing power)."""
        node = self.node(index)
        if node.pid and _alive(node.pid):
            _killpg(node.pid)
            _wait_gone(node.pid, 30)
        node.pid = None
        self.save()

    def start_node(self, index: int, timeout: float = 120) -> None:
        """Bring a stopped member back; it rejoins the cluster from its own mnesia."""
        node = self.node(index)
        self._start_epmd()
        self._spawn(node)
        self._await(node, timeout)

    def stop(self) -> None:
        """Reset the joined nodes, stop every node, end our epmd (by pid), delete the root."""
        try:
            alive = [n for n in self.nodes if n.pid and _alive(n.pid)]
            for node in reversed(alive[1:]):  # joined members leave the cluster first
                try:
                    self.ctl(node, "stop_app", timeout=60)
                    self.ctl(node, "reset", timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            for node in reversed(alive):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.ctl(node, "stop", timeout=60)
                if not _wait_gone(node.pid, 60):  # type: ignore[arg-type]
                    _killpg(node.pid)  # type: ignore[arg-type]
                    _wait_gone(node.pid, 30)  # type: ignore[arg-type]
                node.pid = None
        finally:
            if self.epmd_pid and _alive(self.epmd_pid) and _cmdline(self.epmd_pid).startswith("epmd"):
                os.kill(self.epmd_pid, signal.SIGTERM)
                if not _wait_gone(self.epmd_pid, 10):
                    os.kill(self.epmd_pid, signal.SIGKILL)
            self.epmd_pid = None
            shutil.rmtree(self.root, ignore_errors=True)

    @contextmanager
    def running(self) -> Iterator[Cluster]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    # ---- inspection -------------------------------------------------------------------------
    def queue_leaders(self, vhost: str = "/") -> dict[str, tuple[str, int]]:
        """{queue: (leader node, messages)} from the first node that answers."""
        for node in self.nodes:
            if not node.pid or not _alive(node.pid):
                continue
            result = self.ctl(node, "list_queues", "-p", vhost, "name", "leader", "messages", "--formatter", "json",
                              timeout=60)
            if result.returncode == 0:
                return {q["name"]: (q.get("leader") or "", int(q.get("messages") or 0))
                        for q in json.loads(result.stdout)}
        return {}

    def add_vhost(self, vhost: str) -> None:
        self.ctl(self.nodes[0], "add_vhost", vhost, check=True)
        self.ctl(self.nodes[0], "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*", check=True)

    def status(self) -> str:
        lines = [f"root {self.root}  epmd 127.0.0.1:{self.epmd_port} pid {self.epmd_pid}"]
        for node in self.nodes:
            up = bool(node.pid and _alive(node.pid))
            lines.append(f"{node.name:24} amqp {node.port}  dist {node.dist_port}"
                         + (f"  mgmt {node.management_port}" if self.management else "")
                         + f"  {'running' if up else 'stopped'}")
        lines.append(f"running members: {', '.join(self.running_nodes()) or 'none'}")
        for name, (leader, messages) in sorted(self.queue_leaders().items()):
            lines.append(f"  {name:40} leader {leader:24} {messages} msgs")
        return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours is not alive.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return False


def _killpg(pid: int) -> None:
    """SIGKILL the process group a node leads (beam, erl_child_setup, inet_gethost)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"state and data (default {DEFAULT_ROOT})")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start and cluster the nodes")
    start.add_argument("--nodes", type=int, default=3)
    start.add_argument("--base-port", type=int, default=5781, help="AMQP port of node 1 (0 = free ports)")
    start.add_argument("--management", action="store_true", help="enable the management plugin on each node")
    start.add_argument("--vhost", action="append", default=[], help="also create this vhost (repeatable)")
    sub.add_parser("stop", help="reset, stop and delete the whole test bed")
    sub.add_parser("status", help="nodes, members and queue leaders")
    sub.add_parser("urls", help="the AMQP URLs as JSON (ALDEBARAN_AMQP_URLS)")
    for name in ("stop-node", "start-node", "kill-node"):
        sub.add_parser(name).add_argument("index", type=int, help="1-based node number")
    args = parser.parse_args(argv)
    if args.command == "start":
        cluster = Cluster(root=args.root, size=args.nodes, base_port=args.base_port, management=args.management)
        cluster.start()
        for vhost in args.vhost:
            cluster.add_vhost(vhost)
        print(f"cluster of {cluster.size} formed in {cluster.formed_in:.1f}s")
        print(f"export ALDEBARAN_AMQP_URLS='{json.dumps(cluster.urls)}'")
        return 0
    cluster = Cluster.load(args.root)
    if args.command == "stop":
        cluster.stop()
        print("test bed stopped and removed")
    elif args.command == "status":
        print(cluster.status())
    elif args.command == "urls":
        print(json.dumps(cluster.urls))
    elif args.command == "stop-node":
        cluster.stop_node(args.index)
    elif args.command == "kill-node":
        cluster.kill_node(args.index)
    elif args.command == "start-node":
        cluster.start_node(args.index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
