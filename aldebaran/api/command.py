"""`aldebaran api [--host --port]`: serve the pull API with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import signal

from aldebaran.errors import ConfigError
from aldebaran.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
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

    from aldebaran.api.app import create_app

    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    check_exposure(host, settings)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the handler it
    # found; a no-op handler makes that a clean exit 0 (CONTRACT §4) instead of death by signal.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level,
                access_log=settings.log_level == "debug")
    return 0
