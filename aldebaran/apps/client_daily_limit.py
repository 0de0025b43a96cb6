"""Per-client daily share limit: one alert per client and UTC day over `max_shares`.

The worked example of docs/extending.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from aldebaran.core.rule import Alert, iso_utc
from aldebaran.trades.codec import TRADE_CODEC
from aldebaran.trades.events import TradeEvent

DAY_SECONDS = 86400.0
CLOSE_SLACK_SECONDS = 60.0  # a book outlives its day a little: stamps near midnight still count


class Options(BaseModel):
    """`[app_options.client_daily_limit]`: the limit has no sensible default, so it is required."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_shares: Annotated[int, Field(gt=0)]


@dataclass(slots=True)
class Day:
    key: str  # "<YYYY-MM-DD>:<client>": the day is fixed-width, the client may hold any character
    purchased: int = 0
    purchase_ids: list[str] = field(default_factory=list)
    alerted: bool = False


class ClientDailyLimit:
    name = "client_daily_limit"
    queue_prefix = "daily-"
    codec = TRADE_CODEC

    def __init__(self, options: Options) -> None:
        self.max_shares = options.max_shares

    def accepts(self, event: TradeEvent) -> bool:
        return event.initial_order_id is not None  # purchases only

    def key(self, event: TradeEvent, at: float) -> str:
        return f"{datetime.fromtimestamp(at, UTC):%Y-%m-%d}:{event.client}"

    def partition_key(self, event: TradeEvent) -> str:
        # The key without its day: engines stamping a purchase either side of midnight agree.
        return event.client

    def event_id(self, event: TradeEvent) -> str:
        # An unambiguous (order, purchase) pair: trade_limits counts purchase ids per order too.
        return f"{len(event.order_id)}:{event.order_id}:{event.id}"

    def opens(self, event: TradeEvent) -> bool:
        return False  # nothing opens a day: the aggregator announces a key when first seen

    def ttl_seconds(self, default: float) -> float:
        return DAY_SECONDS + CLOSE_SLACK_SECONDS  # from the day's first purchase: past midnight

    def new_state(self, key: str) -> Day:
        return Day(key=key)

    def apply(self, state: Day, event: TradeEvent, now: datetime) -> list[Alert]:
        state.purchased += event.shares
        state.purchase_ids.append(event.id)
        if state.alerted or state.purchased <= self.max_shares:
            return []
        state.alerted = True
        day, client = state.key[:10], state.key[11:]
        return [Alert(alert_id=f"{self.name}:{client}:{day}", kind=self.name, key=state.key,
                      detected_at=iso_utc(now),
                      fields={"client": client, "day": day, "max_shares": self.max_shares,
                              "purchased_shares": state.purchased,
                              "purchase_ids": list(state.purchase_ids)})]

    def close(self, state: Day, now: datetime) -> list[Alert]:
        return []  # the day is over: closing only forgets it

    def is_final(self, state: Day) -> bool:
        return state.alerted


def make_rule(options: Options) -> ClientDailyLimit:
    return ClientDailyLimit(options)
