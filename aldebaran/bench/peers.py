"""The engine's peers in the bench, each a process draining the prefilled ingress on its own.

`python -m aldebaran.bench.peers KIND AMQP_URL EVENTS RESULT_PATH`:
- `raw`: consume and ack, nothing else: the broker's ceiling at this batching;
- `handwritten`: what a user writes in an afternoon: a batched pika consumer, plain
  dicts, the over-purchase rule with dedup by purchase id, no crash safety (acks every
  few hundred messages whatever happened to the alerts, which are only kept in memory);
- `bytewax`: the same rule as a Bytewax dataflow (keyed `stateful_map`, one worker),
  reading the queue through a pika source; skipped when Bytewax is not installed.

Each prints `started` on its first message (the harness starts its CPU clock there) and
writes {"events", "seconds", "alerts"} to RESULT_PATH when it has seen EVENTS events.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pika

QUEUE = "Aldebaran.Trade_Data"
PREFETCH = 200
ACK_EVERY = 100

_msgpack = msgspec.msgpack.Decoder()
_json = msgspec.json.Decoder()


def _events(body: bytes, content_type: str | None) -> list[dict[str, Any]]:
    value = _msgpack.decode(body) if content_type == "application/msgpack" else _json.decode(body)
    return value if isinstance(value, list) else [value]


class OverPurchase:
    """The rule over plain dicts: one alert per order whose distinct purchases exceed its request."""

    def __init__(self) -> None:
        self.requested: dict[str, int] = {}
        self.bought: dict[str, int] = {}
        self.seen: dict[str, set[str]] = {}
        self.alerts: set[str] = set()

    def apply(self, event: dict[str, Any]) -> None:
        order = event.get("initial_order_id")
        if order is None:
            order = str(event["id"])
            if order in self.requested:
                return
            self.requested[order] = event["#shares"]
        else:
            order = str(order)
            ids = self.seen.setdefault(order, set())
            if event["id"] in ids:
                return
            ids.add(event["id"])
            self.bought[order] = self.bought.get(order, 0) + event["#shares"]
        if order not in self.alerts and order in self.requested and self.bought.get(order, 0) > self.requested[order]:
            self.alerts.add(order)

    def alert_ids(self) -> list[str]:
        over = [f"over_purchase:{order}" for order in self.alerts]
        return over + [f"purchase_without_request:{order}" for order in self.bought if order not in self.requested]


def _consume(url: str, on_body: Callable[[bytes, str | None], int], events: int) -> tuple[int, float]:
    """Drain the queue through `on_body` (returns events in the body) until `events` were seen."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    seen, unacked, started = 0, 0, 0.0
    for method, properties, body in channel.consume(QUEUE):
        if not started:
            started = time.perf_counter()
            print("started", flush=True)
        seen += on_body(body, properties.content_type)
        unacked += 1
        if unacked >= ACK_EVERY or seen >= events:
            channel.basic_ack(method.delivery_tag, multiple=True)
            unacked = 0
        if seen >= events:
            break
    elapsed = time.perf_counter() - started
    connection.close()
    return seen, elapsed


def raw(url: str, events: int) -> dict[str, Any]:
    def count(body: bytes, content_type: str | None) -> int:
        return len(_events(body, content_type))

    seen, elapsed = _consume(url, count, events)
    return {"events": seen, "seconds": elapsed, "alerts": None}


def handwritten(url: str, events: int) -> dict[str, Any]:
    rule = OverPurchase()

    def apply(body: bytes, content_type: str | None) -> int:
        batch = _events(body, content_type)
        for event in batch:
            rule.apply(event)
        return len(batch)

    seen, elapsed = _consume(url, apply, events)
    return {"events": seen, "seconds": elapsed, "alerts": rule.alert_ids()}


def bytewax(url: str, events: int) -> dict[str, Any]:
    from aldebaran.bench.peer_bytewax import run_dataflow

    return run_dataflow(url, events)


PEERS: dict[str, Callable[[str, int], dict[str, Any]]] = {"raw": raw, "handwritten": handwritten, "bytewax": bytewax}


def iter_bodies(url: str, events: int,
                counted: Callable[[bytes, str | None], int]) -> Iterator[tuple[bytes, str | None]]:
    """For sources that pull: the queue's bodies until `events` were seen (acked in batches)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    seen = unacked = 0
    try:
        for method, properties, body in channel.consume(QUEUE, inactivity_timeout=0.001):
            if method is None:
                yield b"", None
                continue
            yield body, properties.content_type
            seen += counted(body, properties.content_type)
            unacked += 1
            if unacked >= ACK_EVERY or seen >= events:
                channel.basic_ack(method.delivery_tag, multiple=True)
                unacked = 0
            if seen >= events:
                return
    finally:
        connection.close()


def main(argv: list[str]) -> int:
    kind, url, events, path = argv[1], argv[2], int(argv[3]), argv[4]
    result = PEERS[kind](url, events)
    with open(path, "w") as out:
        json.dump(result, out)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
