"""What a delivery costs the consuming process: aiormq's task per message against consume_inline,
and consume_inline on frames read by `aldebaran.io.frame_reader` (as every worker reads them).

A queue of the machine's broker is filled with messages the size of a 100-event JSON batch,
then drained by a plain aiormq consumer (a coroutine callback, one task per message), by
`aldebaran.io.inline_consumer.consume_inline`, and by it on a connection reading through
`frame_reader`, in rounds whose order alternates; all ack every 100th message with `multiple`,
as the engine's cycles do. Prints the process's CPU µs per delivery of each round, on uvloop
(the engine's loop), and the medians.

    .venv/bin/python deploy/testbed/inline_delivery.py [messages, default 20000] [rounds, default 5]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiormq
import aiormq.abc
import aiormq.connection
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.io import frame_reader
from aldebaran.io.inline_consumer import consume_inline

URL = "amqp://guest:guest@127.0.0.1:5672/"
BODY = b"x" * 12_000  # a 100-event JSON batch's size
PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", headers={"published_ms": 1})


async def _fill(channel: aiormq.abc.AbstractChannel, queue: str, count: int) -> None:
    for _ in range(count):
        await channel.basic_publish(BODY, routing_key=queue, properties=PROPERTIES)


async def _drain(connection: aiormq.abc.AbstractConnection, count: int, inline: bool) -> float:
    """CPU µs per delivery of one drain of `count` messages."""
    channel = await connection.channel()
    queue = (await channel.queue_declare("", exclusive=True)).queue
    assert queue is not None
    await _fill(channel, queue, count)
    await channel.basic_qos(prefetch_count=2000)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    taken = 0
    acks: set[asyncio.Future[None]] = set()

    def take(message: aiormq.abc.DeliveredMessage) -> None:
        nonlocal taken
        taken += 1
        if taken % 100 == 0:
            ack = asyncio.ensure_future(channel.basic_ack(message.delivery_tag, multiple=True))
            acks.add(ack)
            ack.add_done_callback(acks.discard)
        if taken == count:
            done.set_result(None)

    async def take_in_a_task(message: aiormq.abc.DeliveredMessage) -> None:
        take(message)

    errors: list[BaseException] = []
    started = time.process_time()
    if inline:
        await consume_inline(channel, queue, take, errors.append)
    else:
        await channel.basic_consume(queue, take_in_a_task)
    await asyncio.wait_for(done, timeout=600)
    cost = (time.process_time() - started) / count * 1e6
    assert not errors, errors
    await channel.close()
    return cost


PLAIN_FRAMES = aiormq.connection.FrameReceiver.get_frame


async def _on_connection(count: int, inline: bool, lean_frames: bool) -> float:
    """One drain on a connection of its own, its frames read by aiormq or by `frame_reader`."""
    aiormq.connection.FrameReceiver.get_frame = PLAIN_FRAMES  # type: ignore[method-assign]
    if lean_frames:
        frame_reader.install()
    connection = await aiormq.connect(URL)
    try:
        return await _drain(connection, count, inline)
    finally:
        await connection.close()
        aiormq.connection.FrameReceiver.get_frame = PLAIN_FRAMES  # type: ignore[method-assign]


async def main(count: int, rounds: int) -> None:
    runs: list[tuple[str, Callable[[], object]]] = [
        ("task per message", lambda: _on_connection(count, False, False)),
        ("consume_inline", lambda: _on_connection(count, True, False)),
        ("consume_inline, frame_reader", lambda: _on_connection(count, True, True))]
    costs: dict[str, list[float]] = {label: [] for label, _ in runs}
    for n in range(rounds):
        for label, run in runs if n % 2 == 0 else runs[::-1]:
            costs[label].append(await run())  # type: ignore[misc]
    for label, values in costs.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{label}: {statistics.median(values):.1f} µs of CPU per delivery (median; rounds {shown})")


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000, int(sys.argv[2]) if len(sys.argv) > 2 else 5))
