"""A deterministic trade stream with its expected alerts computed offline.

Used by `aldebaran demo`, `aldebaran bench` and the end-to-end tests: the expected set
comes from CONTRACT §1 applied to the whole stream at once, never from the pipeline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import pairwise

from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent

CLIENTS = ("Sendence", "Goldman", "Acme Capital", "Northwind", "Globex")
STOCKS = ("AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "IBM")


@dataclass
class Stream:
    events: list[TradeEvent] = field(default_factory=list)
    expected: set[str] = field(default_factory=set)  # alert ids

    @property
    def orders(self) -> int:
        return len({e.order_id for e in self.events})


def expected_alerts(events: list[TradeEvent]) -> set[str]:
    """CONTRACT §1 over a whole stream: distinct events per order, sums, comparison."""
    requests: dict[str, int] = {}
    purchased: dict[str, dict[str, int]] = {}
    for event in events:
        if event.is_request:
            requests.setdefault(event.id, event.shares)
        else:
            purchased.setdefault(event.order_id, {})[event.id] = event.shares
    alerts = set()
    for order, fills in purchased.items():
        if order not in requests:
            alerts.add(f"purchase_without_request:{order}")
        elif sum(fills.values()) > requests[order]:
            alerts.add(f"over_purchase:{order}")
    return alerts


def generate(orders: int, seed: int = 7, prefix: str = "o", duplicates: float = 0.02,
             orphans: float = 0.0, shuffle_window: int = 50, over_share: float = 0.35) -> Stream:
    """`orders` orders of 1-6 purchases each; `over_share` of them over-purchase (about a third).

    `duplicates` re-sends that share of events; `orphans` drops the request of that
    share of orders (they fire purchase_without_request when their book closes);
    `shuffle_window` lets purchases overtake their request within a local window.
    """
    rng = random.Random(seed)
    events: list[TradeEvent] = []
    for n in range(orders):
        order_id = f"{prefix}{n}"
        client, stock = rng.choice(CLIENTS), rng.choice(STOCKS)
        limit = rng.randint(50, 100)
        fills = rng.randint(1, 6)
        over = rng.random() < over_share
        target = limit + rng.randint(1, 30) if over else rng.randint(fills, limit)
        shares = _split(rng, target, fills)
        if rng.random() >= orphans:
            events.append(PurchaseRequest(order_id, limit, client, stock))
        events += [Purchase(f"{order_id}-p{i}", order_id, s, client, stock) for i, s in enumerate(shares)]
    return disorder(events, rng, shuffle_window, duplicates)


def disorder(events: list[TradeEvent], rng: random.Random, shuffle_window: int, duplicates: float) -> Stream:
    """Shuffle within local windows (purchases may overtake their request) and re-send a
    share of the events a little later, as redeliveries and publisher retries do."""
    for start in range(0, len(events), shuffle_window):
        window = events[start:start + shuffle_window]
        rng.shuffle(window)
        events[start:start + shuffle_window] = window
    repeats = [rng.randrange(len(events)) for _ in range(int(len(events) * duplicates))]
    for index in sorted(repeats, reverse=True):
        events.insert(min(len(events), index + rng.randint(1, 20)), events[index])
    return Stream(events, expected_alerts(events))


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
    """`parts` positive integers summing to `total` (total >= parts)."""
    cuts = sorted(rng.sample(range(1, total), parts - 1)) if parts > 1 else []
    bounds = [0, *cuts, total]
    return [b - a for a, b in pairwise(bounds)]
