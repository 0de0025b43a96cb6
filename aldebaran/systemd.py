"""sd_notify without a daemon: READY=1 once started, WATCHDOG=1 while healthy."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send one sd_notify datagram; False when not run by systemd (no NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:  # the supervisor's socket went away: a notification is never worth a crash
        return False
    return True


def watchdog_interval() -> float | None:
    """Half the watchdog period systemd asked for, in seconds (None when not asked)."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit():
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2_000_000
