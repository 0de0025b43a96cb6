"""A worker tells systemd it is ready and alive: READY=1, then WATCHDOG=1, then STOPPING=1.

The test plays systemd: it binds the unix datagram socket named by NOTIFY_SOCKET, sets
WATCHDOG_USEC, starts a worker process and reads what it sends. It uses the real
`aldebaran run lookout` when that worker exists, and otherwise a minimal worker run by
the same `workers.runtime.run_workers`.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

MINIMAL_WORKER = """
import asyncio
from aldebaran.settings import load_settings
from workers.runtime import run_workers

class Idle:
    name = "idle"
    async def run(self, life):
        life.ready()
        await life.wait_stopping()

raise SystemExit(run_workers(load_settings(), [Idle()]))
"""


def _worker_command() -> list[str]:
    if importlib.util.find_spec("workers.lookout") is not None:
        return [str(Path(sys.executable).with_name("aldebaran")), "run", "lookout"]
    return [sys.executable, "-c", MINIMAL_WORKER]


def _beats_after_ready(seen: list[str]) -> int:
    return seen[seen.index("READY=1"):].count("WATCHDOG=1") if "READY=1" in seen else 0


def _receive(sock: socket.socket, seen: list[str]) -> None:
    """One datagram (the socket timeout only bounds a hang; nothing here is timed)."""
    seen.extend(sock.recv(4096).decode().splitlines())


def test_worker_sends_ready_watchdog_and_stopping(tmp_path: Path, worker_env: dict[str, str]) -> None:
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(30)
        env = dict(worker_env, NOTIFY_SOCKET=address, WATCHDOG_USEC="200000")
        env.pop("WATCHDOG_PID", None)
        proc = subprocess.Popen(_worker_command(), env=env, cwd=Path(__file__).resolve().parents[1],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seen: list[str] = []
        try:
            while _beats_after_ready(seen) < 2:
                _receive(sock, seen)
            proc.send_signal(signal.SIGTERM)
            while "STOPPING=1" not in seen:
                _receive(sock, seen)
            output, _ = proc.communicate(timeout=30)
        except (TimeoutError, subprocess.TimeoutExpired) as exc:  # the socket or the exit
            proc.kill()
            raise AssertionError(
                f"no notification; saw {seen}; worker said:\n{proc.communicate()[0].decode()}") from exc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, output.decode(errors="replace")
    assert seen.index("READY=1") < seen.index("STOPPING=1")
    assert _beats_after_ready(seen) >= 2


def test_no_notify_socket_means_no_notification() -> None:
    """Outside systemd (no NOTIFY_SOCKET) notify() is a no-op, not an error."""
    from aldebaran import systemd

    saved = os.environ.pop("NOTIFY_SOCKET", None)
    try:
        assert systemd.notify("READY=1") is False
    finally:
        if saved is not None:
            os.environ["NOTIFY_SOCKET"] = saved


def test_api_sends_ready_and_watchdog(tmp_path: Path, worker_env: dict[str, str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(8)
        env = dict(worker_env, NOTIFY_SOCKET=address, WATCHDOG_USEC="200000")
        proc = subprocess.Popen([str(Path(sys.executable).with_name("aldebaran")), "api", "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen: list[str] = []
        try:
            while _beats_after_ready(seen) < 1:
                _receive(sock, seen)
        except TimeoutError:
            pass
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "READY=1" in seen and _beats_after_ready(seen) >= 1, seen
