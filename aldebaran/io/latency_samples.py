"""Raw latency samples from worker processes to the bench, through files.

Prometheus buckets are too coarse for a p99 against a 5 ms target, so when
`latency_samples_dir` is set a worker appends (stage, latency_ms, weight) triples to
its own file there, once a second; the bench reads them all afterwards. Off by default.
"""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path

# publish -> book and -> alert confirmed; where a message's publish -> book went: -> delivered (the
# consumer's callback took it: the broker's time and any wait for the consumer's loop), -> its cycle's start.
STAGES = ("book", "alert", "delivered", "started")
BOOK, ALERT, DELIVERED, STARTED = range(len(STAGES))
_RECORD = struct.Struct("<Bdd")


class LatencySamples:
    """Buffers samples in memory; `flush` appends them to `<dir>/<pid>.lat`."""

    def __init__(self, directory: str) -> None:
        self.enabled = bool(directory)
        self._path = Path(directory) / f"{os.getpid()}.lat" if directory else None
        self._values: dict[int, array[float]] = {i: array("d") for i in range(len(STAGES))}

    def add(self, stage: int, latency_ms: float, weight: int = 1) -> None:
        values = self._values[stage]
        values.append(latency_ms)
        values.append(float(weight))

    def flush(self) -> None:
        if self._path is None:
            return
        chunks = []
        for stage, values in self._values.items():
            for i in range(0, len(values), 2):
                chunks.append(_RECORD.pack(stage, values[i], values[i + 1]))
            del values[:]
        if chunks:
            with open(self._path, "ab") as fh:
                fh.write(b"".join(chunks))


def read_samples(directory: str | Path) -> dict[str, list[tuple[float, float]]]:
    """Every sample written under `directory`, per stage name: (latency_ms, weight)."""
    result: dict[str, list[tuple[float, float]]] = {name: [] for name in STAGES}
    for path in Path(directory).glob("*.lat"):
        data = path.read_bytes()
        usable = len(data) - len(data) % _RECORD.size
        for stage, latency, weight in _RECORD.iter_unpack(data[:usable]):
            result[STAGES[stage]].append((latency, weight))
    return result


class SampleTail:
    """Reads the samples workers appended since the last call, so a running bench can see
    latency over time (each worker flushes once a second: a sample's time is when it was read)."""

    def __init__(self, directory: str | Path) -> None:
        self._directory = Path(directory)
        self._offsets: dict[Path, int] = {}

    def read_new(self, stage: str = "book") -> list[tuple[float, float]]:
        """(latency_ms, weight) of `stage` appended since the previous call."""
        wanted = STAGES.index(stage)
        found: list[tuple[float, float]] = []
        for path in self._directory.glob("*.lat"):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            usable = len(data) - len(data) % _RECORD.size
            self._offsets[path] = start + usable
            found += [(latency, weight) for kind, latency, weight in _RECORD.iter_unpack(data[:usable])
                      if kind == wanted]
        return found
