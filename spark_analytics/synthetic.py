"""Synthetic traces in the recorder's format, for the audit's benchmarks and tests.

`python -m spark_analytics.synthetic --events 1000000 --out /tmp/traces` writes traces
whose alerts are exactly right (so the audit must come back clean). Two shapes:

- single-event messages (the default): JSON objects, the text form, one-element JSON
  batches and msgpack, each alert its own message;
- `--batch 1000`: trade data in JSON arrays of 1000 events and alerts in batches of up to
  `--alert-batch` (CONTRACT §3), as the fast engine publishes them; each channel gets each
  batch as one message, as the Fire Lookout hands it on (`workers/lookout.py`).

Records carry the firehose headers and the vhost as `aldebaran/io/trace_files.py` writes them, in
hourly part files of gzip members of 2000 records. It streams: memory stays flat at 10M+.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import heapq
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import msgspec

MEMBER_RECORDS = 2000  # the recorder's batch: one gzip member each
ALERT_LINGER_MS = 50   # an alert batch waits at most this long for more alerts

Event = dict[str, Any]  # one trade event as JSON
Order = dict[str, Any]  # one order's running state, shared by its events
Timed = tuple[float, Event, Order]  # when an event is due, the event, its order


@dataclass
class Shape:
    """What the traces look like."""

    batch: int = 1               # trade events per message (1: the four single-event wire forms)
    alert_batch: int = 1         # alerts per Aldebaran.Alert message
    rate_per_s: float = 300.0    # trade events per second of trace time
    ttl_ms: int = 60_000
    channels: tuple[str, ...] = ("ops",)
    vhost: str = "/"
    seed: int = 7
    alert_share: float | None = None  # orders that may alert (None: the alert-heavy default, ~70 %)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _text(ev: Event) -> bytes:
    lines = [f"id:{ev['id']}"]
    if "initial_order_id" in ev:
        lines.append(f"initial order id: {ev['initial_order_id']}")
    lines += [f"# shares: {ev['#shares']}", f"client: {ev['client']}", f"stock: {ev['stock']}"]
    return "\n".join(lines).encode()


def _single_body(rnd: random.Random, ev: Event) -> tuple[bytes, str]:
    form = rnd.random()
    if form < 0.5:
        return json.dumps(ev).encode(), "application/json"
    if form < 0.75:
        return _text(ev), "text/plain"
    if form < 0.9:
        return json.dumps([ev]).encode(), "application/json"
    return msgspec.msgpack.encode(ev), "application/msgpack"


@dataclass
class _Writer:
    """Hourly part files, one gzip member per MEMBER_RECORDS lines, like the recorder's."""

    root: Path
    shape: Shape
    records: int = 0
    last_ts: int = 0
    _open: dict[Path, IO[bytes]] = field(default_factory=dict)
    _lines: dict[Path, list[str]] = field(default_factory=dict)

    def record(self, kind: str, ts: int, name: str, body: bytes, ctype: str | None,
               message_id: str | None = None) -> None:
        exchange, queue = (name, None) if kind == "publish" else ("", name)
        headers = {"exchange_name": exchange, "routing_keys": [name],
                   "properties": {k: v for k, v in (("content_type", ctype), ("message_id", message_id)) if v},
                   "node": "rabbit@localhost", "vhost": self.shape.vhost, "connection": "127.0.0.1:40058 -> "
                   "127.0.0.1:5672", "channel": 1, "user": "guest"}
        if kind == "deliver":
            headers["redelivered"] = 0
        rec = {"kind": kind, "ts": ts, "exchange": exchange or None, "queue": queue, "routing_keys": [name],
               "redelivered": False, "content_type": ctype, "message_id": message_id, "node": "rabbit@localhost",
               "vhost": self.shape.vhost, "headers": headers, "body_b64": _b64(body), "recorder": "synthetic-1",
               "trace_redelivered": False}
        self.line(ts, json.dumps(rec, separators=(",", ":")))

    def line(self, ts: int, text: str) -> None:
        moment = datetime.fromtimestamp(ts / 1000, tz=UTC)
        d = self.root / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"
        lines = self._lines.setdefault(d, [])
        lines.append(text)
        self.records += 1
        self.last_ts = max(self.last_ts, ts)
        if len(lines) >= MEMBER_RECORDS:
            self._flush(d)

    def _flush(self, d: Path) -> None:
        lines = self._lines.pop(d, [])
        if not lines:
            return
        if d not in self._open:
            d.mkdir(parents=True, exist_ok=True)
            self._open[d] = open(d / "part-synthetic-1-00001.jsonl.gz", "ab")  # noqa: SIM115 - closed by close()
        self._open[d].write(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=5))

    def close(self) -> None:
        for d in list(self._lines):
            self._flush(d)
        for fh in self._open.values():
            fh.close()


def _orders(rnd: random.Random, events: int, start_ms: int, shape: Shape) -> Iterator[Timed]:
    """(time, event, order) for about `events` trade events, in time order; `order` is shared
    state: limit, whether it has a request, events left, running sum."""
    pending: list[tuple[float, int, Event, Order]] = []
    t, made, n_order, seq = float(start_ms), 0, 0, 0
    while made < events:
        n_order += 1
        oid = f"o{n_order}"
        limit, n = rnd.randint(50, 500), rnd.randint(1, 5)
        share = shape.alert_share
        order = {"id": oid, "limit": limit, "request": rnd.random() > (0.05 if share is None else share / 4),
                 "left": 0, "sum": 0, "seen": False, "fired": False, "first": None}
        most = limit // 2 + 60
        if share is not None and rnd.random() >= share:
            most = max(1, limit // n)  # its purchases stay within the request
        evs = [{"id": oid, "#shares": limit, "client": "c", "stock": "AAPL"}] if order["request"] else []
        evs += [{"id": f"{oid}-p{i}", "initial_order_id": oid, "#shares": rnd.randint(1, most),
                 "client": "c", "stock": "AAPL"} for i in range(n)]
        rnd.shuffle(evs)
        order["left"] = len(evs)
        for ev, ts in zip(evs, sorted(t + rnd.uniform(0, 20_000) for _ in evs), strict=True):
            seq += 1
            heapq.heappush(pending, (ts, seq, ev, order))
        made += len(evs)
        while pending and pending[0][0] <= t:
            ts, _, ev, o = heapq.heappop(pending)
            yield ts, ev, o
        t += len(evs) * 1000.0 / shape.rate_per_s
    while pending:
        ts, _, ev, o = heapq.heappop(pending)
        yield ts, ev, o


def _judge(order: Order, ev: Event, published: int, rnd: random.Random, shape: Shape) -> tuple[int, str] | None:
    """CONTRACT §1 for one event as published at `published`: the alert it causes, if any."""
    if order["first"] is None:
        order["first"] = published
        if not order["request"]:
            return published + shape.ttl_ms + rnd.randint(5, 200), "purchase_without_request"
    if "initial_order_id" in ev:
        order["sum"] += ev["#shares"]
    else:
        order["seen"] = True
    if order["seen"] and order["sum"] > order["limit"] and not order["fired"]:
        order["fired"] = True
        return published + rnd.randint(1, 40), "over_purchase"
    return None


class _Alerts:
    """Alert publishes (single or batched) and their channel deliveries, in time order."""

    def __init__(self, out: _Writer, rnd: random.Random, shape: Shape) -> None:
        self.out, self.rnd, self.shape = out, rnd, shape
        self.heap: list[tuple[int, str, str]] = []
        self.count = self.batches = self.fanouts = 0

    def add(self, at: int, kind: str, oid: str) -> None:
        heapq.heappush(self.heap, (at, kind, oid))
        self.count += 1

    def emit_until(self, now: float) -> None:
        ready = []
        while self.heap and self.heap[0][0] <= now:
            ready.append(heapq.heappop(self.heap))
        group: list[tuple[int, str, str]] = []
        for alert in ready:  # a batch closes when full or ALERT_LINGER_MS after its first alert
            if group and (len(group) >= self.shape.alert_batch or alert[0] - group[0][0] > ALERT_LINGER_MS):
                self._publish(group)
                group = []
            group.append(alert)
        if group:
            self._publish(group)

    def _publish(self, group: list[tuple[int, str, str]]) -> None:
        at = group[-1][0]
        bodies = [{"alert_id": f"{kind}:{oid}", "kind": kind, "order_id": oid} for _, kind, oid in group]
        if self.shape.alert_batch == 1:
            self.out.record("publish", at, "Aldebaran.Alert", json.dumps(bodies[0]).encode(), "application/json",
                            bodies[0]["alert_id"])
        else:
            self.batches += 1
            self.out.record("publish", at, "Aldebaran.Alert", json.dumps(bodies).encode(), "application/json",
                            f"batch:synthetic-{self.batches}")
        for ch in self.shape.channels:
            # One delay drawn per alert either way: the events and alerts stay the seed's.
            delays = [self.rnd.randint(1, 30) for _ in bodies]
            if self.shape.alert_batch == 1:  # each alert its own message
                for body, delay in zip(bodies, delays, strict=True):
                    self._deliver(at + delay, ch, body, body["alert_id"])
            else:  # the lookout hands each channel the batch it took as one message, a lone alert as itself
                self.fanouts += 1
                lone = len(bodies) == 1
                self._deliver(at + max(delays), ch, bodies[0] if lone else bodies,
                              bodies[0]["alert_id"] if lone else f"batch:lookout-{self.fanouts}")

    def _deliver(self, at: int, channel: str, body: Any, message_id: str) -> None:
        self.out.record("deliver", at, f"Aldebaran.Channel.{channel}", json.dumps(body).encode(),
                        "application/json", message_id)


def _publish_trades(out: _Writer, alerts: _Alerts, rnd: random.Random, group: list[Timed],
                    shape: Shape) -> None:
    """One trade message for `group` (published when its last event is due), then its alerts."""
    at = int(group[-1][0])
    if shape.batch == 1:
        body, ctype = _single_body(rnd, group[0][1])
    else:
        body, ctype = json.dumps([ev for _, ev, _ in group]).encode(), "application/json"
    alerts.emit_until(at)
    out.record("publish", at, "Aldebaran.Trade_Data", body, ctype)
    for _, ev, order in group:
        if (fired := _judge(order, ev, at, rnd, shape)) is not None:
            alerts.add(fired[0], fired[1], order["id"])


def generate(out: str, events: int, start_ms: int, rate_per_s: float = 300.0, ttl_ms: int = 60_000,
             channels: tuple[str, ...] = ("ops",), seed: int = 7, shape: Shape | None = None) -> dict[str, int]:
    """Write traces holding about `events` trade events; returns what was written."""
    shape = shape or Shape(rate_per_s=rate_per_s, ttl_ms=ttl_ms, channels=channels, seed=seed)
    rnd = random.Random(shape.seed)
    writer = _Writer(Path(out), shape)
    alerts = _Alerts(writer, rnd, shape)
    group: list[Timed] = []
    made = messages = 0
    for item in _orders(rnd, events, start_ms, shape):
        group.append(item)
        made += 1
        if len(group) >= shape.batch:
            _publish_trades(writer, alerts, rnd, group, shape)
            messages, group = messages + 1, []
    if group:
        _publish_trades(writer, alerts, rnd, group, shape)
        messages += 1
    alerts.emit_until(float("inf"))
    _heartbeats(writer, start_ms - 1000, writer.last_ts + 10_000)
    writer.close()
    return {"events": made, "messages": messages, "alerts": alerts.count, "records": writer.records}


def _heartbeats(writer: _Writer, start: int, end: int) -> None:
    for beat in range(start, end + 1, 10_000):
        writer.line(beat, json.dumps({"kind": "heartbeat", "ts": beat, "interval": 10.0, "vhost": writer.shape.vhost,
                                      "recorder": "synthetic-1"}, separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--start", default="2026-11-21T00:00:00+00:00")
    parser.add_argument("--batch", type=int, default=1, help="trade events per message (default 1)")
    parser.add_argument("--alert-batch", type=int, default=None,
                        help="alerts per message (default 1, 100 with --batch)")
    parser.add_argument("--rate", type=float, default=300.0, help="trade events per second of trace time")
    parser.add_argument("--vhost", default="/", help="the deployment the records belong to")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--alert-share", type=float, default=None,
                        help="share of orders that may alert (default: alert-heavy, about 1 alert per 7 events)")
    args = parser.parse_args()
    start = int(datetime.fromisoformat(args.start).timestamp() * 1000)
    alert_batch = args.alert_batch or (100 if args.batch > 1 else 1)
    shape = Shape(batch=args.batch, alert_batch=alert_batch, rate_per_s=args.rate, vhost=args.vhost, seed=args.seed,
                  alert_share=args.alert_share)
    print(json.dumps(generate(args.out, args.events, start, shape=shape)))


if __name__ == "__main__":
    main()
