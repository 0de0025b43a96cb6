"""What one `amqp`-channel message costs the broker: the floor under every alert it delivers.

The `amqp` channel emits one message per alert (CONTRACT §3): persistent, mandatory, confirmed,
written many to a socket write (`publish_many`, as the deliverer does, 128 per call, two
calls in flight). This publishes N such messages of an alert's size into a durable queue with
no consumer and prints RabbitMQ's CPU per message beside the publisher's, then the same with
one thing changed each time: with a consumer, transient, not mandatory, and into a version-2 classic queue
(RabbitMQ 3.10+, `x-queue-version: 2`; the recipient declares its queue, not us). Rows
alternate over `rounds` so a host's drift hits each alike.

    .venv/bin/python deploy/testbed/publish_floor.py [messages per row, default 60000] [rounds, default 2]
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import aiormq
from pamqp import commands as spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.bench.environment import CpuMeter, Place
from aldebaran.io.publish_many import publish_many
from aldebaran.settings import Settings

BODY = b"x" * 250  # an over_purchase alert's JSON is about this size
CHUNK = 128  # half the bench channel's send window, as a deliverer's chunk
ROWS = (  # label, delivery_mode, mandatory, queue version, consumed at once
    ("persistent, mandatory (the channel's)", 2, True, 1, False),
    ("the same, with a consumer (auto-ack, as the bench's recipient)", 2, True, 1, True),
    ("transient, mandatory", 1, True, 1, False),
    ("persistent, not mandatory", 2, False, 1, False),
    ("persistent, mandatory, classic queue v2", 2, True, 2, False),
)


async def row(url: str, messages: int, mode: int, mandatory: bool, version: int,
              consumed: bool) -> tuple[float, float, float]:
    """(broker µs, publisher µs, messages/s) per message for one way of publishing; with
    `consumed`, until a consumer in this process (counted as the publisher's) got them all."""
    connection = await aiormq.connect(url)
    reader = await aiormq.connect(url) if consumed else None
    meter = CpuMeter()  # this process and the local RabbitMQ
    try:
        channel = await connection.channel()
        await channel.confirm_delivery()
        queue = f"floor-{uuid.uuid4().hex[:8]}"
        await channel.queue_declare(queue, durable=True, arguments={"x-queue-version": version})
        received = 0
        everything = asyncio.get_running_loop().create_future()

        def on_message(_: object) -> None:
            nonlocal received
            received += 1
            if received == messages:
                everything.set_result(None)

        if reader is not None:
            consumer = await reader.channel()
            await consumer.basic_qos(prefetch_count=1000)
            await consumer.basic_consume(queue, on_message, no_ack=True)  # type: ignore[arg-type]
        wall0 = time.monotonic()
        meter.start([])
        waiting: list[asyncio.Future[list[BaseException | None]]] = []
        for start in range(0, messages, CHUNK):
            count = min(CHUNK, messages - start)
            properties = [spec.Basic.Properties(delivery_mode=mode, message_id=f"over_purchase:order-{start + i}",
                                                content_type="application/json") for i in range(count)]
            confirmations = await publish_many(channel, [BODY] * count, properties, routing_key=queue,
                                               mandatory=mandatory)
            waiting.append(asyncio.ensure_future(confirmations.wait()))
            if len(waiting) >= 2:
                await waiting.pop(0)
        for pending in waiting:
            outcomes = await pending
            if any(outcome is not None for outcome in outcomes):
                raise SystemExit(f"a publish was refused: {outcomes}")
        if reader is not None:
            await everything
        cores = meter.stop()
        wall = time.monotonic() - wall0
        if reader is not None:
            await reader.close()  # its consumer first: the broker would cancel it on the delete
        await channel.queue_delete(queue)
    finally:
        if reader is not None and not reader.is_closed:
            await reader.close()
        await connection.close()
    return cores["rabbitmq"] * wall / messages * 1e6, cores["bench"] * wall / messages * 1e6, messages / wall


async def main(messages: int, rounds: int) -> None:
    results: dict[str, list[tuple[float, float, float]]] = {row[0]: [] for row in ROWS}
    with Place(Settings()) as place:
        for _ in range(rounds):
            for label, mode, mandatory, version, consumed in ROWS:
                results[label].append(await row(place.amqp_url, messages, mode, mandatory, version, consumed))
    print(f"{messages:,} messages of {len(BODY)} bytes per row, {CHUNK} per write; each round's figure, in order")
    print("| publish | RabbitMQ µs/message | publisher µs/message | messages/s |")
    print("|---|---:|---:|---:|")
    for label, runs in results.items():
        cells = [" / ".join(f"{run[i]:,.{0 if i == 2 else 1}f}" for run in runs) for i in range(3)]
        print(f"| {label} | {cells[0]} | {cells[1]} | {cells[2]} |")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 60_000, int(sys.argv[2]) if len(sys.argv) > 2 else 2))
