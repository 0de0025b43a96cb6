"""The broker's own latency floor under the paced load, in a process of its own.

A consumer on the engine's AMQP client (aiormq) and prefetch that only takes each ingress
message and acks it, recording publish -> delivered from the publisher's stamp: what any
consumer of this broker pays before it does any work. The paced table shows it beside the
engine, so the engine's share of a latency is read off one run.

    python -m aldebaran.bench.paced_floor SAMPLES_DIR MESSAGES

It prints "consuming" once it consumes; after MESSAGES messages it flushes its samples to
SAMPLES_DIR (stage "book"), prints "taken" and stays until it is stopped: the bench meters
its CPU, which an exited process no longer has.
"""

from __future__ import annotations

import asyncio
import sys
import time

import aiormq
import aiormq.abc

from aldebaran.io.latency_samples import BOOK, LatencySamples
from aldebaran.io.publisher import published_ms
from aldebaran.runtime_tuning import run
from aldebaran.settings import Settings
from declare.topology import TRADE_DATA


async def consume(settings: Settings, samples: LatencySamples, messages: int) -> None:
    connection = await aiormq.connect(settings.amqp_url)
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=settings.engine.prefetch)
    done = asyncio.get_running_loop().create_future()
    seen = 0

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        nonlocal seen
        stamp = published_ms(message.header.properties.headers)
        if stamp:
            samples.add(BOOK, max(0.0, time.time() * 1000 - stamp))
        await channel.basic_ack(message.delivery_tag)  # type: ignore[arg-type]
        seen += 1
        if seen >= messages and not done.done():
            done.set_result(None)

    await channel.basic_consume(TRADE_DATA, on_message)
    print("consuming", flush=True)
    while not done.done():
        await asyncio.wait([done], timeout=1.0)
        samples.flush()
    samples.flush()
    print("taken", flush=True)
    await asyncio.Event().wait()  # until SIGTERM


def main(argv: list[str]) -> int:
    directory, messages = argv[0], int(argv[1])
    run(consume(Settings(), LatencySamples(directory), messages))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
