"""What one delivered alert costs a channel deliverer: its queue prefilled, then drained.

Fills `Aldebaran.Channel.pull` (a queue-api channel) and `Aldebaran.Channel.bus` (an amqp
channel, at most once, 256 in flight: the alert-heavy bench's two channels) with N alerts in
batch messages of 100, as the lookout hands them over, then starts both deliverers and times
them until the pull queue and the `downstream` queue hold N alerts each. Prints alerts/s and
CPU µs per alert of each deliverer, RabbitMQ and Redis (the deliverers run at once, so the
broker's and Redis's share is for both). With `lookout`, the batches go to `Aldebaran.Alert`
once, as the engine publishes them, and the lookout fans them out to both channel queues: its
CPU is counted too.

    .venv/bin/python deploy/testbed/channel_drain.py 100000 [amqp max_in_flight, default 256 as in the bench] [lookout]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiormq
import msgspec
import psutil
from pamqp import commands as spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.bench.delivery import CONFIG, DOWNSTREAM, PULL_QUEUE
from aldebaran.bench.environment import Place, stop_process
from aldebaran.io.alert_bus import batch_body
from aldebaran.io.redis import Keys, sync_client
from aldebaran.settings import Settings
from declare.declarer import declare_async
from declare.topology import ALERT, channel_queue

PER_MESSAGE = 100


def alert(i: int) -> bytes:
    return msgspec.json.encode({
        "alert_id": f"over_purchase:order-{i}", "kind": "over_purchase", "order_id": f"order-{i}",
        "client": f"client-{i % 997}", "stock": "ACME", "requested": 100, "purchased": 150,
        "detected_at": "2026-11-25T09:00:00.000Z"})


async def fill(place: Place, alerts: int, through_lookout: bool) -> None:
    from aio_pika import connect

    declarer = await connect(place.amqp_url)
    await declare_async(await declarer.channel(), place.settings())
    await declarer.close()
    connection = await aiormq.connect(place.amqp_url)
    channel = await connection.channel()
    await channel.queue_declare(DOWNSTREAM, durable=True)
    await channel.confirm_delivery()
    sends = []
    for start in range(0, alerts, PER_MESSAGE):
        body = batch_body([alert(i) for i in range(start, min(alerts, start + PER_MESSAGE))])
        routes = [(ALERT, ALERT)] if through_lookout else [("", channel_queue(name)) for name in ("pull", "bus")]
        for exchange, routing_key in routes:
            sends.append(channel.basic_publish(body, exchange=exchange, routing_key=routing_key,
                                               properties=spec.Basic.Properties(
                                                   delivery_mode=2, message_id=f"batch:{start}",
                                                   content_type="application/json")))
    await asyncio.gather(*sends)
    await connection.close()


async def landed(place: Place, settings: Settings) -> tuple[int, int]:
    connection = await aiormq.connect(place.amqp_url)
    try:
        channel = await connection.channel()
        bus = (await channel.queue_declare(DOWNSTREAM, durable=True, passive=True)).message_count
    finally:
        await connection.close()
    redis = sync_client(settings.redis_url, timeout=10)
    pull = redis.llen(f"{Keys(place.prefix).pull_queue(PULL_QUEUE)}:ready")
    redis.close()
    return bus, pull


async def main(alerts: int, in_flight: int, through_lookout: bool) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        config = Path(workdir) / "channels.toml"
        config.write_text(CONFIG.replace("max_in_flight = 256", f"max_in_flight = {in_flight}"))
        os.environ["ALDEBARAN_CONFIG"] = str(config)  # the channel queues are declared from it
        await _run(Settings(), config, alerts, through_lookout)


async def _run(base: Settings, config: Path, alerts: int, through_lookout: bool) -> None:
    with Place(base) as place:
        await fill(place, alerts, through_lookout)
        env = place.env(ALDEBARAN_CONFIG=str(config), ALDEBARAN_LOG_LEVEL="warning")
        workers = [("channel", "pull"), ("channel", "bus"), *([("lookout",)] if through_lookout else [])]
        processes = [await asyncio.create_subprocess_exec(sys.executable, "-m", "aldebaran.cli", "run", *worker,
                                                          env=env) for worker in workers]
        try:
            done, cpu, counted = await _measure(place, processes, [worker[-1] for worker in workers], alerts)
        finally:
            await asyncio.gather(*(stop_process(p) for p in processes))
    print(f"{alerts:,} alerts, batches of {PER_MESSAGE}; timed from the first landed alert ({counted:,} after it); "
          f"load {os.getloadavg()[0]:.1f}")
    for name, seconds in sorted(done.items()):
        print(f"  {name}: all landed {seconds:.2f} s after the first ({counted / seconds:,.0f} alerts/s)")
    for label, seconds in sorted(cpu.items()):
        print(f"  {label}: {seconds / counted * 1e6:.1f} µs CPU per alert")


async def _measure(place: Place, processes: list[asyncio.subprocess.Process], names: list[str],
                   alerts: int) -> tuple[dict[str, float], dict[str, float], int]:
    """Seconds until each sink held every alert, CPU seconds per process, alerts counted: all
    from the first alert to land (start-up is not timed)."""
    while sum(await landed(place, place.settings())) == 0:
        await asyncio.sleep(0.01)
    pids = {psutil.Process(p.pid): name for p, name in zip(processes, names, strict=True)}
    for p in psutil.process_iter(["name", "cmdline"]):  # the servers, not a passing rabbitmqctl (a beam too)
        name, command = p.info["name"] or "", " ".join(p.info["cmdline"] or [])
        if name.startswith(("beam", "redis-s")) and "rabbitmqctl" not in command:
            pids[p] = name.split(".")[0]
    before = {p: sum(p.cpu_times()[:2]) for p in pids}
    started = time.monotonic()
    bus0, pull0 = await landed(place, place.settings())
    done: dict[str, float] = {}
    while len(done) < 2 and time.monotonic() - started < 600:
        bus, pull = await landed(place, place.settings())
        for name, count in (("bus", bus), ("pull", pull)):
            if count >= alerts and name not in done:
                done[name] = time.monotonic() - started
        await asyncio.sleep(0.05)
    cpu: dict[str, float] = {}
    for process, name in pids.items():
        cpu[name] = cpu.get(name, 0.0) + sum(process.cpu_times()[:2]) - before[process]
    return done, cpu, alerts - min(bus0, pull0)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000, int(sys.argv[2]) if len(sys.argv) > 2 else 256,
                     sys.argv[3:4] == ["lookout"]))
