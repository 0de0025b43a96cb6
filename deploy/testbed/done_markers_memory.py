"""What one shard's done markers cost in memory, and a snapshot of them in time and bytes.

Feeds N orders (a request and a purchase each) through a `ShardBooks` in steps of 5,000,
closing books as their deadline passes, then measures the process's RSS growth per
marker and encodes one snapshot. No broker: the store alone (docs/sharding.md).

    .venv/bin/python deploy/testbed/done_markers_memory.py 2000000            # ids like o123
    .venv/bin/python deploy/testbed/done_markers_memory.py 2000000 --uuid     # 36-char ids
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
import uuid
from datetime import datetime, timezone

import psutil

from aldebaran.apps.trade_limits import TradeLimits
from aldebaran.core.shard_state import ShardBooks
from aldebaran.trades.events import Purchase, PurchaseRequest

STEP = 5_000  # orders per simulated second
TTL = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("orders", type=int)
    parser.add_argument("--uuid", action="store_true", help="36-character order ids instead of o<n>")
    args = parser.parse_args()
    now = datetime.now(timezone.utc)
    process = psutil.Process()
    shard = ShardBooks({"trade_limits": TradeLimits()}, default_ttl=TTL, done_retention=10**9)
    base = process.memory_info().rss
    clock = 0.0
    for start in range(0, args.orders, STEP):
        clock += 1.0
        events: list[PurchaseRequest | Purchase] = []
        for n in range(start, min(start + STEP, args.orders)):
            key = str(uuid.UUID(int=n)) if args.uuid else f"o{n}"
            events += [PurchaseRequest(key, 100, "Client", "AAPL"), Purchase(f"{key}-1", key, 60, "Client", "AAPL")]
        shard.offer_many("trade_limits", events, clock, now, [])
        shard.close_due(clock - TTL - 0.5, now)
        shard.take_delta()
    shard.close_due(clock + TTL + 1, now)
    shard.take_delta()
    gc.collect()
    held = process.memory_info().rss - base
    started = time.perf_counter()
    snapshot = shard.take_snapshot()
    took = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"markers {len(shard.done):,}: RSS +{held / 2**20:,.1f} MiB = {held / len(shard.done):,.0f} bytes each; "
          f"snapshot {len(snapshot) / 2**20:,.1f} MiB in {took * 1000:,.0f} ms; process peak {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
