"""A Jepsen-style checker: what each sink received against the alerts computed offline.

For every sink: `lost` (expected, never delivered), `duplicated` (delivered more than
once; `extra_copies` counts the surplus deliveries), `unexpected` (delivered, never
expected). The expected set never comes from the pipeline: it is CONTRACT §1 applied
to the whole stream at once (`aldebaran.trades.generator.expected_alerts`).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

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
    # Repeats an at-least-once sink is allowed: the deliverer was killed between the
    # recipient's receipt and the ledger write (docs/delivery.md, "the window").
    window_repeats: dict[str, int] = field(default_factory=dict)

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
                + (f"; {sum(n - 1 for n in self.window_repeats.values())} repeats inside a deliverer kill's window"
                   if self.window_repeats else ""))


def check(sink: str, expected: set[str], delivered_ids: Iterable[str]) -> SinkReport:
    """Judge one sink's deliveries (one alert id per delivery, repeats included)."""
    counts = Counter(delivered_ids)
    return SinkReport(
        sink=sink,
        expected=len(expected),
        deliveries=sum(counts.values()),
        delivered=len(expected & counts.keys()),
        lost=sorted(expected - counts.keys()),
        duplicated={k: n for k, n in sorted(counts.items()) if n > 1},
        unexpected=sorted(counts.keys() - expected),
    )


def allow_window_repeats(report: SinkReport, arrivals: list[tuple[float, str]],
                         kill_times: list[float], in_flight: int) -> SinkReport:
    """Move repeats caused by a deliverer's SIGKILL out of `duplicated`.

    An at-least-once sink (a webhook: HTTP has no commit shared with our ledger) gets an
    alert again when its deliverer dies after the recipient took it and before the ledger
    recorded it. A repeat is allowed only when a kill lies between every two arrivals of
    that alert, and at most `in_flight` (the deliverer's prefetch) per kill; any other
    repeat stays a duplicate and fails the run.
    """
    times: dict[str, list[float]] = {}
    for at, alert_id in sorted(arrivals):
        times.setdefault(alert_id, []).append(at)
    allowed = {alert_id: copies for alert_id, copies in report.duplicated.items()
               if all(any(a < k < b for k in kill_times) for a, b in zip(times[alert_id], times[alert_id][1:]))}
    if sum(n - 1 for n in allowed.values()) > in_flight * len(kill_times):
        return report
    report.window_repeats = allowed
    report.duplicated = {k: n for k, n in report.duplicated.items() if k not in allowed}
    return report


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
