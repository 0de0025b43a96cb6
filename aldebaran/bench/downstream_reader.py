"""The alert-heavy bench's recipient on the `amqp` channel: a process of its own that drains the
downstream queue and reports each alert id the first time it lands.

The recipient is outside the system under test, but on this machine it shares the cores: read
in the bench's own event loop (aiormq, a coroutine per message) it cost ~35 µs of CPU per alert
and fell behind the channel, so the bench measured itself. Here pika consumes with automatic
acks and the process writes, every `FLUSH_SECONDS`, one JSON line to stdout:
`{"new": [[alert_id, monotonic seconds], ...], "copies": n}` (copies: repeats since the last
line). `time.monotonic` is the machine's clock, so the bench compares it with its own.

    python -m aldebaran.bench.downstream_reader AMQP_URL QUEUE
"""

from __future__ import annotations

import sys
import time
from typing import Any

import msgspec
import pika

FLUSH_SECONDS = 0.1
PREFETCH = 2000


def main(argv: list[str]) -> int:
    url, queue = argv
    seen: set[str] = set()
    new: list[tuple[str, float]] = []
    copies = 0
    encode = msgspec.json.encode

    def on_message(channel: Any, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
        nonlocal copies
        alert_id = properties.message_id or ""
        if alert_id in seen:
            copies += 1
        else:
            seen.add(alert_id)
            new.append((alert_id, time.monotonic()))

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.basic_qos(prefetch_count=PREFETCH)
    channel.basic_consume(queue, on_message, auto_ack=True)
    out = sys.stdout.buffer
    out.write(b'{"new": [], "copies": 0}\n')  # consuming: the bench may start the clock
    out.flush()
    try:
        while True:
            connection.process_data_events(time_limit=FLUSH_SECONDS)
            if new or copies:
                out.write(encode({"new": new, "copies": copies}) + b"\n")
                out.flush()
                new, copies = [], 0
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
    finally:
        if connection.is_open:
            connection.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
