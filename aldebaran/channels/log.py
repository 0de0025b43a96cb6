"""`log`: one structured log line per alert (for operators and as a last-resort sink)."""

from __future__ import annotations

from aldebaran.channels.base import Alert
from aldebaran.log import get_logger
from aldebaran.settings import LogChannel, Settings


class LogSink:
    targets = ("",)

    def __init__(self, config: LogChannel) -> None:
        self._log = get_logger("channel.log", channel=config.name)

    async def start(self) -> None:
        return None

    async def send(self, alert: Alert, target: str) -> None:
        self._log.warning("alert", alert_id=alert.alert_id, alert=alert.fields)

    async def close(self) -> None:
        return None


def build(config: LogChannel, settings: Settings) -> LogSink:
    return LogSink(config)
