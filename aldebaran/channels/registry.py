"""From a channel's configuration (CONTRACT §5 `kind`) to its sink."""

from __future__ import annotations

import importlib

from aldebaran.channels.base import Sink
from aldebaran.settings import Settings

SINK_MODULES = {
    "amqp": "aldebaran.channels.amqp",
    "webhook": "aldebaran.channels.webhook",
    "email": "aldebaran.channels.email",
    "sms": "aldebaran.channels.sms",
    "push": "aldebaran.channels.push",
    "nagios": "aldebaran.channels.nagios",
    "log": "aldebaran.channels.log",
    "queue-api": "aldebaran.channels.queue_api",
}


def build_sink(config: object, settings: Settings) -> Sink:
    """The sink for one `[[channels]]` entry; modules load lazily (only what is used)."""
    module = importlib.import_module(SINK_MODULES[config.kind])  # type: ignore[attr-defined]
    return module.build(config, settings)
