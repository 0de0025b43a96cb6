"""`aldebaran api [--host --port]`: serve the pull API and dashboard with uvicorn.

Under systemd (`aldebaran-api.service`, Type=notify) the server itself says READY=1
once it accepts connections and WATCHDOG=1 from its own main loop, so a wedged event
loop stops the beats and systemd restarts it.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import signal
import time
from typing import TYPE_CHECKING

from aldebaran import systemd
from aldebaran.errors import ConfigError, ExitCode
from aldebaran.settings import Settings

if TYPE_CHECKING:  # uvicorn is imported when the command runs
    import socket

    import uvicorn


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("api", help="serve the AweQ-style pull API (OpenAPI at /docs)")
    parser.add_argument("--host", help="address to bind (default: api_host setting)")
    parser.add_argument("--port", type=int, help="port to bind (default: api_port setting)")
    parser.set_defaults(handler=handle)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (where no token is required)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, settings: Settings) -> None:
    """Refuse to expose an unauthenticated queue beyond this machine."""
    if not settings.api_token and not is_loopback(host):
        raise ConfigError(f"api: binding {host} (not loopback) requires api_token (ALDEBARAN_API_TOKEN)")


def handle(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from aldebaran.api.dashboard import create_app

    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    check_exposure(host, settings)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the handler it
    # found; a no-op handler makes that a clean exit 0 (CONTRACT §4) instead of death by signal.
    signal.signal(signal.SIGTERM, lambda *_: None)
    config = uvicorn.Config(create_app(settings), host=host, port=port, log_level=settings.log_level,
                            access_log=settings.log_level == "debug")
    server = _notifying_server(uvicorn.Server)(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    # As `uvicorn.run`: a server that never started (port taken, lifespan failed) is a failure.
    return ExitCode.OK if server.started else ExitCode.UNAVAILABLE


def _notifying_server(base: type[uvicorn.Server]) -> type[uvicorn.Server]:
    """A uvicorn Server that reports READY=1 once serving and WATCHDOG=1 from its main loop."""

    class NotifyingServer(base):  # type: ignore[valid-type, misc]  # a class made from an argument
        _next_beat = 0.0

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                systemd.notify("READY=1")

        async def on_tick(self, counter: int) -> bool:
            interval = systemd.watchdog_interval()
            if interval is not None and time.monotonic() >= self._next_beat:
                systemd.notify("WATCHDOG=1")
                self._next_beat = time.monotonic() + interval
            should_exit = await super().on_tick(counter)
            if should_exit:
                systemd.notify("STOPPING=1")
            return should_exit

    return NotifyingServer
