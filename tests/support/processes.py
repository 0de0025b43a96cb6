"""Child processes and ports of the tests: servers and workers started with their output in a log file."""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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


def spawn_logged(args: Sequence[str], log_path: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """Start `args` with stdout and stderr appended to `log_path` (the child keeps its own copy
    of the descriptor, so the file is closed here at once); `popen` goes to `subprocess.Popen`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(args), stdout=log, stderr=log, **popen)
