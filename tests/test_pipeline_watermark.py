"""Pipeline time in the per-order mode: stamps in flight, and the watermark in Redis."""

from __future__ import annotations

import asyncio
import time

from aldebaran.core.pipeline_clock import StampsInFlight
from aldebaran.io import redis as redis_io
from aldebaran.io.pipeline_watermark import WatermarkReader, WatermarkWriter, restart_stamp
from aldebaran.settings import Settings
from tests.support.waiting import eventually


def test_the_watermark_holds_back_at_the_oldest_stamp_not_yet_confirmed() -> None:
    flight = StampsInFlight()
    assert flight.watermark(1_000) == 1_000  # nothing in flight: everything stamped is routed
    flight.add(900)
    flight.add(950)
    flight.add(900)
    assert flight.watermark(1_000) == 899
    flight.settle(900)
    assert flight.watermark(1_000) == 899  # one event stamped 900 still unconfirmed
    flight.settle(900)
    assert flight.watermark(1_000) == 949
    flight.settle(950)
    assert flight.watermark(1_010) == 1_010 and len(flight) == 0


async def test_books_see_the_slowest_live_aggregator_and_never_go_back(settings: Settings) -> None:
    redis = await redis_io.connect(settings)
    key = f"{settings.redis_key_prefix}:pipeline-clock"
    try:
        fast, slow = WatermarkWriter(redis, key), WatermarkWriter(redis, key)
        reader = WatermarkReader(redis, key, stale_seconds=0.5)
        await reader.poll()
        assert reader.value is None  # no aggregator yet: books wait
        reached = reader.reached(2_000)
        await fast.write(5_000, 5_000)
        await slow.write(2_000, 2_100)
        await reader.poll()
        assert reader.value == 2_000 and reached.done()
        assert await restart_stamp(redis, key) == 5_000 + 100  # the newest stamp, plus one interval
        later = reader.reached(3_000)

        async def dropped_out() -> bool:  # the slow one stops writing (it died): after 0.5 s it drops out
            await fast.write(5_100, 5_100)
            await reader.poll()
            return later.done()

        await eventually(dropped_out, lambda: f"the silent writer to drop out (watermark {reader.value})",
                         timeout=5, pause=0.1)
        assert reader.value == 5_100
        await slow.write(1_000, 1_000)  # a laggard coming back never moves the watermark back
        await reader.poll()
        assert reader.value == 5_100
    finally:
        await redis.delete(key)
        await redis.aclose()


async def test_a_restarted_aggregator_goes_on_from_the_recorded_stamp(settings: Settings) -> None:
    """Its downtime adds nothing to pipeline time (it restarts from the newest stamp recorded)."""
    down_seconds = 3.0
    from aldebaran.apps import load_rules
    from workers.aggregator import Aggregator
    from workers.runtime import Lifecycle

    redis = await redis_io.connect(settings)
    key = f"{settings.redis_key_prefix}:pipeline-clock"
    try:
        first = Aggregator(settings, load_rules(settings))
        life = Lifecycle()
        running = asyncio.create_task(first.run(life))
        await asyncio.wait_for(life._ready.wait(), timeout=60)
        await eventually(lambda: restart_stamp(redis, key), "the first aggregator's record of its stamps")
        life.stopping.set()
        await asyncio.wait_for(running, timeout=60)
        assert first.clock is not None
        newest = first.clock.stamp(time.monotonic())
        await asyncio.sleep(down_seconds)  # by design: the aggregator is down this long
        second = Aggregator(settings, load_rules(settings))
        life = Lifecycle()
        running = asyncio.create_task(second.run(life))
        await asyncio.wait_for(life._ready.wait(), timeout=60)
        assert second.clock is not None
        resumed = second.clock.stamp(time.monotonic())
        life.stopping.set()
        await asyncio.wait_for(running, timeout=60)
        assert newest <= resumed < newest + 2_000  # its start-up, not its 3 s down
    finally:
        await redis.delete(key)
        await redis.aclose()
