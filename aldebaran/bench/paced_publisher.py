"""The paced run's publisher, in a process of its own: the offered load as steady as a real publisher's.

In the bench's event loop the publisher shared the bench's pauses (relabelling the next round
of bodies, scraping, reading samples): it fell behind, then caught up in a burst whose
messages queued in the engine and showed as latency the engine did not cause. Here it does
nothing but publish, stamping each message just before it goes out.

    python -m aldebaran.bench.paced_publisher BODIES_FILE RATE

BODIES_FILE holds msgpack `[[data, events, content_type], ...]` (`write_bodies`); the process
publishes them at RATE events/s and prints the number of events it published.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from aldebaran.io.publisher import Body, publish_bodies
from aldebaran.runtime_tuning import run
from aldebaran.settings import Settings


def write_bodies(path: Path, bodies: Sequence[Body]) -> None:
    path.write_bytes(msgspec.msgpack.encode([[b.data, b.events, b.content_type] for b in bodies]))


def read_bodies(path: Path) -> list[Body]:
    return [Body(data, events, content_type)
            for data, events, content_type in msgspec.msgpack.decode(path.read_bytes())]


def main(argv: list[str]) -> int:
    path, rate = Path(argv[0]), float(argv[1])
    report = run(publish_bodies(Settings(), read_bodies(path), rate=rate))
    print(report.events, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
