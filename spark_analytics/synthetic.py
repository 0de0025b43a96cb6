"""Synthetic traces in the recorder's format, for the 1M-event benchmark and tests.

`python -m spark_analytics.synthetic --events 1000000 --out /tmp/traces` writes a day
slice whose alerts are exactly right (so the audit must come back clean), in all wire
forms: JSON objects, text form, JSON batches and msgpack.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import random
from datetime import datetime, timezone
from pathlib import Path

import msgspec


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _text(ev: dict) -> bytes:
    lines = [f"id:{ev['id']}"]
    if "initial_order_id" in ev:
        lines.append(f"initial order id: {ev['initial_order_id']}")
    lines += [f"# shares: {ev['#shares']}", f"client: {ev['client']}", f"stock: {ev['stock']}"]
    return "\n".join(lines).encode()


def generate(out: str, events: int, start_ms: int, rate_per_s: float = 300.0, ttl_ms: int = 60_000,
             channels: tuple[str, ...] = ("ops",), seed: int = 7) -> dict[str, int]:
    """Write traces holding about `events` trade events; returns what was written."""
    rnd = random.Random(seed)
    records: list[tuple[int, dict]] = []
    t = float(start_ms)
    made = order = alerts = 0
    while made < events:
        order += 1
        oid = f"o{order}"
        limit = rnd.randint(50, 500)
        n = rnd.randint(1, 5)
        with_request = rnd.random() > 0.05
        t0 = t
        evs = []
        if with_request:
            evs.append({"id": oid, "#shares": limit, "client": "c", "stock": "AAPL"})
        evs += [{"id": f"{oid}-p{i}", "initial_order_id": oid, "#shares": rnd.randint(1, limit // 2 + 60),
                 "client": "c", "stock": "AAPL"} for i in range(n)]
        rnd.shuffle(evs)
        times = sorted(t0 + rnd.uniform(0, 20_000) for _ in evs)
        running, fired_at = 0, None
        request_seen = False
        for ev, ts in zip(evs, times):
            form = rnd.random()
            ts = int(ts)
            if form < 0.5:
                body, ctype = json.dumps(ev).encode(), "application/json"
            elif form < 0.75:
                body, ctype = _text(ev), "text/plain"
            elif form < 0.9:
                body, ctype = json.dumps([ev]).encode(), "application/json"
            else:
                body, ctype = msgspec.msgpack.encode(ev), "application/msgpack"
            records.append((ts, {"kind": "publish", "ts": ts, "exchange": "Aldebaran.Trade_Data",
                                 "content_type": ctype, "body_b64": _b64(body), "redelivered": False}))
            made += 1
            if "initial_order_id" in ev:
                running += ev["#shares"]
            else:
                request_seen = True
            if request_seen and running > limit and fired_at is None:
                fired_at = ts
        kind, at = None, None
        if with_request and fired_at is not None:
            kind, at = "over_purchase", fired_at + rnd.randint(1, 40)
        elif not with_request:
            kind, at = "purchase_without_request", int(times[0]) + ttl_ms + rnd.randint(5, 200)
        if kind:
            alerts += 1
            aid = f"{kind}:{oid}"
            body = json.dumps({"alert_id": aid, "kind": kind, "order_id": oid}).encode()
            records.append((at, {"kind": "publish", "ts": at, "exchange": "Aldebaran.Alert", "message_id": aid,
                                 "content_type": "application/json", "body_b64": _b64(body), "redelivered": False}))
            for ch in channels:
                d = at + rnd.randint(1, 30)
                records.append((d, {"kind": "deliver", "ts": d, "queue": f"Aldebaran.Channel.{ch}",
                                    "message_id": aid, "body_b64": _b64(body), "redelivered": False}))
        t += len(evs) * 1000.0 / rate_per_s
    end = int(max(ts for ts, _ in records)) + 1000
    beat = start_ms - 1000
    while beat <= end + 10_000:
        records.append((beat, {"kind": "heartbeat", "ts": beat, "interval": 10.0}))
        beat += 10_000
    records.sort(key=lambda r: r[0])
    root = Path(out)
    by_hour: dict[Path, list[str]] = {}
    for ts, rec in records:
        moment = datetime.fromtimestamp(ts / 1000, tz=timezone.utc)
        d = root / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"
        by_hour.setdefault(d, []).append(json.dumps(rec, separators=(",", ":")))
    for d, lines in by_hour.items():
        d.mkdir(parents=True, exist_ok=True)
        with gzip.open(d / "part-synthetic-00001.jsonl.gz", "wt", compresslevel=5) as fh:
            fh.write("\n".join(lines) + "\n")
    return {"events": made, "orders": order, "alerts": alerts, "records": len(records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--start", default="2026-11-21T00:00:00+00:00")
    args = parser.parse_args()
    start = int(datetime.fromisoformat(args.start).timestamp() * 1000)
    print(json.dumps(generate(args.out, args.events, start)))


if __name__ == "__main__":
    main()
