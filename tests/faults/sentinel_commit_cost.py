"""What `WAIT` costs the engine's commit: `python -m tests.faults.sentinel_commit_cost`.

Starts a private master, one replica and three sentinels (`SentinelGroup`, free ports),
then times `EngineStore.commit` of one cycle (a 20 KB log record, 2 alerts) with
`redis_min_replicas_acked` 0 and 1, in interleaved blocks so both share the machine's
noise. Prints median / p90 / p99 per setting (docs/operations.md, Redis Sentinel).
Not a test: nothing asserts on a speed.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aldebaran.io.engine_store import EngineStore
from aldebaran.io.redis import Keys, Replicas, connect
from aldebaran.settings import Settings
from tests.faults.sentinel import SentinelGroup

BLOCKS, PER_BLOCK, RECORD_BYTES = 20, 100, 20_000


async def measure(url: str) -> dict[int, list[float]]:
    redis = await connect(Settings(redis_url=url, redis_key_prefix="commit-cost"))
    stores = {n: EngineStore(redis, Keys(f"commit-cost{n}"), "cost", 60_000, 600, Replicas(n, 2000)) for n in (0, 1)}
    samples: dict[int, list[float]] = {0: [], 1: []}
    record = os.urandom(RECORD_BYTES)
    try:
        for store in stores.values():
            assert await store.acquire()
        for _ in range(BLOCKS):
            for n, store in stores.items():
                for _ in range(PER_BLOCK):
                    ids = [f"a{uuid.uuid4().hex}", f"b{uuid.uuid4().hex}"]
                    started = time.perf_counter()
                    await store.commit(record, ids, [b"{}", b"{}"])
                    samples[n].append(time.perf_counter() - started)
                await redis.delete(store.keys.engine("wal"))
    finally:
        await redis.aclose()
    return samples


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sentinel-cost-") as root:
        group = SentinelGroup(Path(root)).start()
        try:
            samples = asyncio.run(measure(group.url))
        finally:
            group.close()
    for n, values in samples.items():
        values.sort()
        print(f"WAIT replicas={n}: median {statistics.median(values) * 1e6:.0f} µs, "
              f"p90 {values[int(len(values) * 0.9)] * 1e6:.0f} µs, p99 {values[int(len(values) * 0.99)] * 1e6:.0f} µs "
              f"over {len(values)} commits")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
