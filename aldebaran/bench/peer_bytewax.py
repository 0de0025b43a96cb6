"""The over-purchase rule as a Bytewax dataflow, for the bench's side-by-side table (optional).

One worker, keyed `stateful_map` per order, a pika source draining the prefilled queue.
It computes over_purchase only: purchase_without_request needs a window per order, which
the bench's low-alert workload does not exercise (it has no orphans).
"""

from __future__ import annotations

from typing import Any, Iterable

from aldebaran.bench.peers import _events, iter_bodies

MAX_BATCH = 64


def run_dataflow(url: str, events: int) -> dict[str, Any]:
    import time

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.run import cli_main
    from bytewax.testing import TestingSink

    timing = {"started": 0.0}

    class _Partition(StatefulSourcePartition[tuple[bytes, Any], None]):
        def __init__(self) -> None:
            self._bodies = iter_bodies(url, events, lambda body, ct: len(_events(body, ct)))

        def next_batch(self) -> list[tuple[bytes, Any]]:
            batch = []
            for body, content_type in self._bodies:
                if not body:
                    return batch
                if not timing["started"]:
                    timing["started"] = time.perf_counter()
                    print("started", flush=True)
                batch.append((body, content_type))
                if len(batch) >= MAX_BATCH:
                    return batch
            if batch:
                return batch
            raise StopIteration

        def snapshot(self) -> None:
            return None

    class _Queue(FixedPartitionedSource[tuple[bytes, Any], None]):
        def list_parts(self) -> list[str]:
            return ["ingress"]

        def build_part(self, step_id: str, for_part: str, resume_state: None) -> _Partition:
            return _Partition()

    def decode(bodies: list[tuple[bytes, Any]]) -> Iterable[dict[str, Any]]:
        return [event for body, content_type in bodies for event in _events(body, content_type)]

    def order_of(event: dict[str, Any]) -> str:
        order = event.get("initial_order_id")
        return str(event["id"] if order is None else order)

    def count(state: list[Any] | None, event: dict[str, Any]) -> tuple[list[Any], bool]:
        state = state or [None, 0, set(), False]  # requested, bought, purchase ids, alerted
        if event.get("initial_order_id") is None:
            if state[0] is None:
                state[0] = event["#shares"]
        elif event["id"] not in state[2]:
            state[2].add(event["id"])
            state[1] += event["#shares"]
        fire = not state[3] and state[0] is not None and state[1] > state[0]
        state[3] = state[3] or fire
        return state, fire

    alerts: list[str] = []
    flow = Dataflow("over_purchase")
    bodies = op.input("ingress", flow, _Queue())
    keyed = op.key_on("order", op.flat_map_batch("decode", bodies, decode), order_of)
    fired = op.filter("fired", op.stateful_map("count", keyed, count), lambda kv: kv[1])
    op.output("alerts", op.map("id", fired, lambda kv: f"over_purchase:{kv[0]}"), TestingSink(alerts))
    cli_main(flow, workers_per_process=1)
    return {"events": events, "seconds": time.perf_counter() - timing["started"], "alerts": alerts}
