"""The over-purchase rule as a Bytewax dataflow, for the bench's side-by-side table (optional).

One worker, keyed `stateful_map` per order, a pika source draining the prefilled queue.
It computes over_purchase only: purchase_without_request needs a window per order, which
the bench's low-alert workload does not exercise (it has no orphans).

Bytewax is optional: `aldebaran.bench.peers` imports this module only when the Bytewax
peer runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.run import cli_main
from bytewax.testing import TestingSink

from aldebaran.bench.peers import _events, iter_bodies

MAX_BATCH = 64

Item = tuple[bytes, Any]  # one message: body and content type


class _Clock:
    """When the first message arrived: the drain is timed from there, as for every peer."""

    def __init__(self) -> None:
        self.started = 0.0

    def start_once(self) -> None:
        if not self.started:
            self.started = time.perf_counter()
            print("started", flush=True)


class _Partition(StatefulSourcePartition[Item, None]):
    """The queue's bodies in batches of at most MAX_BATCH, until `events` were seen."""

    def __init__(self, url: str, events: int, clock: _Clock) -> None:
        self._bodies = iter_bodies(url, events, lambda body, ct: len(_events(body, ct)))
        self._clock = clock

    def next_batch(self) -> list[Item]:
        batch: list[Item] = []
        for body, content_type in self._bodies:
            if not body:
                return batch
            self._clock.start_once()
            batch.append((body, content_type))
            if len(batch) >= MAX_BATCH:
                return batch
        if batch:
            return batch
        raise StopIteration

    def snapshot(self) -> None:
        return None


class _Queue(FixedPartitionedSource[Item, None]):
    """The prefilled ingress queue as Bytewax's one-partition source."""

    def __init__(self, url: str, events: int, clock: _Clock) -> None:
        self._url, self._events, self._clock = url, events, clock

    def list_parts(self) -> list[str]:
        return ["ingress"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _Partition:
        return _Partition(self._url, self._events, self._clock)


def _decode(bodies: list[Item]) -> Iterable[dict[str, Any]]:
    return [event for body, content_type in bodies for event in _events(body, content_type)]


def _order_of(event: dict[str, Any]) -> str:
    order = event.get("initial_order_id")
    return str(event["id"] if order is None else order)


def _count(state: list[Any] | None, event: dict[str, Any]) -> tuple[list[Any], bool]:
    """One order's state (requested, bought, purchase ids, alerted); True the once it goes over."""
    state = state or [None, 0, set(), False]
    if event.get("initial_order_id") is None:
        if state[0] is None:
            state[0] = event["#shares"]
    elif event["id"] not in state[2]:
        state[2].add(event["id"])
        state[1] += event["#shares"]
    fire = not state[3] and state[0] is not None and state[1] > state[0]
    state[3] = state[3] or fire
    return state, fire


def run_dataflow(url: str, events: int) -> dict[str, Any]:
    """Drain `events` events through the dataflow; what the bench's peers report."""
    clock = _Clock()
    alerts: list[str] = []
    flow = Dataflow("over_purchase")
    bodies = op.input("ingress", flow, _Queue(url, events, clock))
    keyed = op.key_on("order", op.flat_map_batch("decode", bodies, _decode), _order_of)
    fired = op.filter("fired", op.stateful_map("count", keyed, _count), lambda kv: kv[1])
    op.output("alerts", op.map("id", fired, lambda kv: f"over_purchase:{kv[0]}"), TestingSink(alerts))
    cli_main(flow, workers_per_process=1)
    return {"events": events, "seconds": time.perf_counter() - clock.started, "alerts": alerts}
