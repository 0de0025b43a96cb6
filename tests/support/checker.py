"""A Jepsen-style checker: what each sink received against the alerts computed offline.

For every sink: `lost` (expected, never delivered), `duplicated` (delivered more than
once; `extra_copies` counts the surplus deliveries), `unexpected` (delivered, never
expected). The expected set never comes from the pipeline: it is CONTRACT §1 applied
to the whole stream at once (`aldebaran.trades.generator.expected_alerts`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent
from aldebaran.trades.generator import CLIENTS, STOCKS, Stream, disorder


@dataclass
class SinkReport:
    sink: str
    expected: int
    deliveries: int
    delivered: int  # distinct expected alert ids that arrived
    lost: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)  # alert id -> copies received
    unexpected: list[str] = field(default_factory=list)
    # At-most-once: alerts whose attempt a kill interrupted, listed for the operator. The
    # recipient may or may not have one; either way it is not lost and must not come twice.
    in_doubt: list[str] = field(default_factory=list)

    @property
    def extra_copies(self) -> int:
        return sum(n - 1 for n in self.duplicated.values())

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected)

    def line(self) -> str:
        return (f"{self.sink}: expected {self.expected}, delivered {self.delivered} "
                f"({self.deliveries} deliveries), lost {len(self.lost)}, duplicated {len(self.duplicated)} "
                f"(+{self.extra_copies} copies), unexpected {len(self.unexpected)}"
                + (f", in doubt {len(self.in_doubt)}" if self.in_doubt else ""))


def check(sink: str, expected: set[str], delivered_ids: Iterable[str], in_doubt: Iterable[str] = ()) -> SinkReport:
    """Judge one sink's deliveries (one alert id per delivery, repeats included).

    An alert in doubt counts as accounted for (delivered + in doubt = expected), but an
    id in doubt that was never expected is unexpected, like a delivery of one.
    """
    counts = Counter(delivered_ids)
    doubt = set(in_doubt)
    return SinkReport(
        sink=sink,
        expected=len(expected),
        deliveries=sum(counts.values()),
        delivered=len(expected & counts.keys()),
        lost=sorted(expected - counts.keys() - doubt),
        duplicated={k: n for k, n in sorted(counts.items()) if n > 1},
        unexpected=sorted((counts.keys() | doubt) - expected),
        in_doubt=sorted(doubt),
    )


def fault_stream(orders: int, seed: int = 11, fills: tuple[int, int] = (4, 40), orphans: float = 0.05,
                 duplicates: float = 0.02, shuffle_window: int = 60, prefix: str = "f") -> Stream:
    """`orders` orders with many small purchases each (the fault suite's workload).

    About a third of the orders over-purchase (some only on their last fill, so the
    alert depends on every event counting), `orphans` lose their request
    (purchase_without_request at close), `duplicates` of the events are sent twice.
    Disorder stays local (`shuffle_window`) so every order's events arrive close together.
    """
    rng = random.Random(seed)
    events: list[TradeEvent] = []
    for n in range(orders):
        order_id = f"{prefix}{n}"
        client, stock = rng.choice(CLIENTS), rng.choice(STOCKS)
        count = rng.randint(*fills)
        shares = [rng.randint(1, 100) for _ in range(count)]
        total = sum(shares)
        roll = rng.random()
        if roll < 0.2:
            limit = total - shares[-1] // 2 - 1 if shares[-1] > 1 else total - 1  # over only at the last fill
        elif roll < 0.35:
            limit = max(1, total - rng.randint(1, max(1, total // 2)))  # clearly over
        elif roll < 0.45:
            limit = total  # exactly at the limit: never fires
        else:
            limit = total + rng.randint(1, 200)
        if rng.random() >= orphans:
            events.append(PurchaseRequest(order_id, max(1, limit), client, stock))
        events += [Purchase(f"{order_id}-p{i}", order_id, s, client, stock) for i, s in enumerate(shares)]
    return disorder(events, rng, shuffle_window, duplicates)
