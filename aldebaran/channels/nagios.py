"""`nagios`: a passive service check result written to the external command file.

The command file is a FIFO Nagios reads; it is opened without creating it and without
blocking (no reader = Nagios is down = a retryable error), and each line goes out in one
write() so concurrent writers cannot interleave.
"""

from __future__ import annotations

import asyncio
import os
import time

from aldebaran.channels.base import Alert, NotDelivered
from aldebaran.settings import NagiosChannel, Settings


def command_line(config: NagiosChannel, alert: Alert, now: float) -> str:
    """`[epoch] PROCESS_SERVICE_CHECK_RESULT;host;service;code;text` (one line, no `\\n` inside)."""
    text = " ".join(alert.summary().split())
    return (f"[{int(now)}] PROCESS_SERVICE_CHECK_RESULT;{config.host_name};{config.service_description};"
            f"{config.return_code};{text}\n")


def _write(path: str, line: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError as exc:  # no file, or no reader on the FIFO: nothing was written
        raise NotDelivered(f"cannot open the command file {path}: {type(exc).__name__}: {exc}") from None
    try:
        os.write(fd, line.encode())
    except BlockingIOError:  # the FIFO is full: a line up to PIPE_BUF is written whole or not at all
        raise NotDelivered(f"the command file {path} is full (Nagios is not reading)") from None
    finally:
        os.close(fd)


class NagiosSink:
    targets = ("",)

    def __init__(self, config: NagiosChannel) -> None:
        self._config = config

    async def start(self) -> None:
        return None

    async def send(self, alert: Alert, target: str) -> None:
        await asyncio.to_thread(_write, self._config.command_file, command_line(self._config, alert, time.time()))

    async def close(self) -> None:
        return None


def build(config: NagiosChannel, settings: Settings) -> NagiosSink:
    return NagiosSink(config)
