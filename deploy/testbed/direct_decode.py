"""What the engine step would gain if the codec decoded trade events straight into their final type.

Today msgspec decodes a batch into wire structs (`_Wire`: an id that may be an integer, an
optional `initial_order_id`) and `_typed` builds a `PurchaseRequest` or a `Purchase` from each:
two objects per event, one of them dying at once, and a Python loop around the second. One
event type that is its own wire form (an optional order id, `None` for a request) would let
msgspec build the final object in C; what stays in Python is the checks msgspec cannot make
cheaply (blank ids, ids over 200 bytes of UTF-8) and the shared client and stock strings.

This runs the engine step (`Engine.cycle`, one 1000-event low-alert msgpack message a cycle, no
broker, no Redis) with today's rule and codec ("today") and with a prototype of that design
("direct": `DirectEvent`, a codec yielding it and `trade_limits` rewritten for it), in
alternating rounds, checks both fire the same alerts and count the same events, and prints µs
of CPU per event. Under `valgrind --tool=cachegrind` run one side at a time (argument `today`
or `direct`, and `setup` for the workload's cost alone, to subtract): instructions do not
depend on the host's noise.

    .venv/bin/python deploy/testbed/direct_decode.py [rounds, default 3] [today|direct|setup] [orders]

Not the project's codec: integer ids, the slow path's worded rejects and the internal pack
format are left out (a batch the prototype refuses raises).
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.apps.trade_limits import Order, TradeLimits
from aldebaran.bench.pure import fresh_engine
from aldebaran.bench.workload import build
from aldebaran.core.rule import Alert
from aldebaran.core.wal import WalMessage
from aldebaran.runtime_tuning import tune_gc
from aldebaran.settings import Settings
from aldebaran.trades.codec import _LABELS, Decoded, DecodeError, _new_label
from aldebaran.trades.events import MAX_SHARES, SHORT_ID, id_too_long

_Label = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class DirectEvent(msgspec.Struct, rename={"shares": "#shares", "order": "initial_order_id"},
                  forbid_unknown_fields=True, gc=False):
    """A request (`order` None) or a purchase of order `order`, as the wire carries it."""

    id: _Label
    shares: Annotated[int, msgspec.Meta(gt=0, le=MAX_SHARES)]
    client: _Label
    stock: _Label
    order: _Label | None = None


_batch = msgspec.msgpack.Decoder(list[DirectEvent])


class DirectCodec:
    """The fast path only: a batch decoded into `DirectEvent`s, labels shared as the codec shares them."""

    name = "trades-direct"
    event_types = (DirectEvent,)

    def decode(self, body: bytes, content_type: str | None, max_bytes: int) -> Decoded:
        events = _batch.decode(body)
        labels = _LABELS  # the codec's own shared labels
        for event in events:
            ident, order = event.id, event.order  # the checks inline: a call per event cost ~6 % of the step
            if (ident.isspace() or (len(ident) > SHORT_ID and id_too_long(ident) is not None)
                    or (order is not None and (order.isspace() or (len(order) > SHORT_ID
                                                                   and id_too_long(order) is not None)))):
                raise ValueError("the prototype has no slow path")
            event.client = labels.get(event.client) or _new_label(event.client)
            event.stock = labels.get(event.stock) or _new_label(event.stock)
            if not (event.client and event.stock):
                raise ValueError("the prototype has no slow path")
        return Decoded(events=events)  # type: ignore[arg-type]

    def dead_letters(self, decoded: Decoded, body: bytes) -> list[DecodeError]:
        return decoded.rejects


class DirectTradeLimits(TradeLimits):
    """`trade_limits` on `DirectEvent`: a field test where the rule asked the event's class."""

    codec = DirectCodec()  # type: ignore[assignment]
    event_types = (DirectEvent,)  # type: ignore[assignment]

    def key(self, event: Any, at: float = 0.0) -> str:
        return event.order or event.id

    def partition_key(self, event: Any) -> str:
        return event.order or event.id

    def event_id(self, event: Any) -> str:
        return "" if event.order is None else event.id

    def opens(self, event: Any) -> bool:
        return event.order is None

    def apply(self, state: Order, event: Any, now: datetime) -> list[Alert]:
        if event.order is not None:
            state.purchases[event.id] = event
            state.purchased += event.shares
        elif state.request is None:
            state.request = event
        return self._check(state, now)


def one_round(side: str, settings: Settings, messages: list[WalMessage], events: int) -> tuple[float, tuple[int, ...]]:
    """A fresh engine of `side` over `messages`: µs of CPU per event, and (alerts, applied, duplicates)."""
    engine = fresh_engine(settings, None if side == "today" else [DirectTradeLimits()])
    now = datetime.now(UTC)
    alerts = applied = duplicate = 0
    started = time.process_time()
    for stamp, message in enumerate(messages, start=1_000_000):
        cycle = engine.cycle([message], stamp, now)
        alerts += len(cycle.alerts)
        applied += cycle.applied
        duplicate += cycle.duplicate
    return (time.process_time() - started) / events * 1e6, (alerts, applied, duplicate)


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    sides = ["today", "direct"] if len(argv) < 2 else [argv[1]]
    orders = int(argv[2]) if len(argv) > 2 else 220_000
    workload = build(orders, 1000, over_share=0.01)
    messages = [WalMessage(body.content_type, body.data) for body in workload.bodies]
    events = sum(body.events for body in workload.bodies)
    settings = Settings()
    tune_gc()
    print(f"{events:,} events in {len(messages)} messages")
    if sides == ["setup"]:
        return 0
    counts: dict[str, tuple[int, ...]] = {}
    for _ in range(rounds):
        for side in sides:
            per_event, counts[side] = one_round(side, settings, messages, events)
            print(f"{side:>6}: {per_event:.3f} µs of CPU per event (alerts, applied, duplicates: {counts[side]})",
                  flush=True)
    if len(set(counts.values())) > 1:
        print("the two sides disagree")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
