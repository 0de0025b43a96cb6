"""`aldebaran publish FILE`: send JSON lines (or `-` for stdin) to the trade ingress.

Readable events are batched (JSON arrays, or msgpack) to spare the broker; a line that
is not a valid event is sent on its own, as it is, so the pipeline dead-letters it with
its reason — the publisher is not the judge.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterable, Iterator
from typing import IO

from aldebaran.io.publisher import Body, publish_bodies
from aldebaran.runtime_tuning import run
from aldebaran.settings import Settings
from aldebaran.trades.codec import MSGPACK, decode_message, encode_json, encode_msgpack
from aldebaran.trades.events import TradeEvent

DEFAULT_BATCH = 100


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("publish", help="publish JSON lines of trade events")
    # Opened by argparse: a file that cannot be read is a one-line usage error, not a traceback.
    # Bytes that are not UTF-8 survive the reading (surrogateescape) and are sent as they came.
    parser.add_argument("file", type=argparse.FileType("r", encoding="utf-8", errors="surrogateescape"),
                        help="a file of JSON lines (objects or arrays), or - for stdin")
    parser.add_argument("--rate", type=float, default=0.0, help="events per second (0 = as fast as possible)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="events per AMQP message")
    parser.add_argument("--format", choices=["json", "msgpack"], default="json")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=handle)


def batches(events: Iterable[TradeEvent], size: int, fmt: str = "json") -> Iterator[Body]:
    """Group events into message bodies of `size` events (1 = one JSON object each)."""
    chunk: list[TradeEvent] = []
    for event in events:
        chunk.append(event)
        if len(chunk) >= size:
            yield _body(chunk, fmt)
            chunk = []
    if chunk:
        yield _body(chunk, fmt)


def _body(chunk: list[TradeEvent], fmt: str) -> Body:
    if fmt == "msgpack":
        return Body(encode_msgpack(chunk), len(chunk), MSGPACK)
    if len(chunk) == 1:
        import msgspec

        return Body(msgspec.json.encode(chunk[0].to_wire()), 1)
    return Body(encode_json(chunk), len(chunk))


def read_lines(stream: IO[str], size: int, fmt: str) -> Iterator[Body]:
    """Bodies from JSON lines; unreadable lines pass through unchanged, one per message (bytes
    that were not UTF-8 too, when `stream` reads with `errors="surrogateescape"`)."""
    good: list[TradeEvent] = []
    for line in stream:
        if not line.strip():
            continue
        raw = line.rstrip("\n").encode("utf-8", "surrogateescape")
        decoded = decode_message(raw)
        if decoded.rejects:
            yield Body(raw, 1)
            continue
        good.extend(decoded.events)
        while len(good) >= size:
            yield _body(good[:size], fmt)
            good = good[size:]
    if good:
        yield from batches(good, size, fmt)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    stream = args.file
    if stream is sys.stdin and isinstance(stream, io.TextIOWrapper):
        stream.reconfigure(errors="surrogateescape")
    with stream, Progress(console=console, disable=args.quiet, transient=True) as progress:
        task = progress.add_task("publishing events", total=None)
        report = run(publish_bodies(
            settings, read_lines(stream, max(1, args.batch), args.format), rate=args.rate,
            progress=lambda n: progress.advance(task, n)))
    console.print(f"published {report.events} events in {report.messages} messages, "
                  f"{report.elapsed:.2f} s, {report.rate:,.0f} events/s, {report.nacks} nacks retried")
    return 0
