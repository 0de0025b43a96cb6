"""A test application whose rule raises on chosen input, standing in for a buggy rule.

Loaded by its dotted name (`ALDEBARAN_APPS='["trade_limits", "tests.support.explodes_app"]'`):
it raises on every purchase whose client is `boom`, and when a book whose first purchase
id starts with `boom-at-close` closes. It never alerts.
"""

from __future__ import annotations

from datetime import datetime

from aldebaran.core.rule import Alert
from aldebaran.trades.codec import TRADE_CODEC
from aldebaran.trades.events import TradeEvent


class Explodes:
    name = "explodes"
    queue_prefix = "explodes-"
    codec = TRADE_CODEC

    def accepts(self, event: TradeEvent) -> bool:
        return event.initial_order_id is not None

    def key(self, event: TradeEvent, at: float = 0.0) -> str:
        return event.order_id

    def event_id(self, event: TradeEvent) -> str:
        return event.id

    def opens(self, event: TradeEvent) -> bool:
        return False

    def ttl_seconds(self, default: float) -> float:
        return default

    def new_state(self, key: str) -> list[str]:
        return []

    def apply(self, state: list[str], event: TradeEvent, now: datetime) -> list[Alert]:
        if event.client == "boom":
            raise ValueError(f"boom on purchase {event.id}")
        state.append(event.id)
        return []

    def close(self, state: list[str], now: datetime) -> list[Alert]:
        if state and state[0].startswith("boom-at-close"):
            raise RuntimeError("boom at close")
        return []

    def is_final(self, state: list[str]) -> bool:
        return False


rule = Explodes()
