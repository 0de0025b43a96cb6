"""structlog set-up: JSON lines for machines, a readable console for people, no secrets."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import structlog

from aldebaran.settings import mask_url


def _mask_secrets(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    for key, value in event_dict.items():
        if isinstance(value, str) and ("://" in value or "=" in value):
            event_dict[key] = mask_url(value)  # userinfo passwords and secret query values
        elif isinstance(value, BaseException):
            event_dict[key] = mask_url(repr(value))
    return event_dict


def configure_logging(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Configure structlog once per process; `fmt` is auto, json or console."""
    stream = stream or sys.stderr
    as_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _mask_secrets,
    ]
    if as_json:
        processors += [
            structlog.processors.format_exc_info,
            _mask_exception_text,
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=stream.isatty())]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries (aio-pika, aiormq, uvicorn) log through the standard library.
    logging.basicConfig(level=logging.WARNING, stream=stream, format="%(levelname)s %(name)s %(message)s")
    # pika and aiormq log every failed connection attempt with a traceback; we report
    # those ourselves, once, with the URL masked.
    for noisy in ("pika", "aiormq", "aio_pika"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)


def _mask_exception_text(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    exc = event_dict.get("exception")
    if isinstance(exc, str):
        event_dict["exception"] = mask_url(exc)
    return event_dict


def get_logger(name: str, **context: Any) -> structlog.stdlib.BoundLogger:
    """A logger bound to a component name (and any fixed context)."""
    return structlog.get_logger(component=name, **context)


class Throttle:
    """At most one log line per `key` each `interval` seconds, with how many were held back.

    A poison message or a flood of junk repeats one failure thousands of times a second;
    the log should say so once, with a count, not drown the lines that matter.
    """

    def __init__(self, interval: float = 10.0, max_keys: int = 1000) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """None to stay quiet; else the number of lines held back since the last one."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if last is None and len(self._last) >= self.max_keys:
            self._last.pop(next(iter(self._last)))
        self._last[key] = now
        return self._held.pop(key, 0)
