"""Interpreter tuning of every long-running process: its event loop, its collector (the engine's idle collections).

The event loop is uvloop's wherever it is installed (a dependency on Linux): its sockets and
callbacks are C. The workers always ran on it; the trade publisher (`aldebaran publish`, the
bench's paced publisher) and the bench's floor consumer did not, and the paced publisher spent
~10 % more CPU on asyncio's own loop (docs/benchmarks.md, "2026-11-28 midday").

Python's cyclic GC scans every tracked object on each full collection; the engine
holds hundreds of thousands of books (dataclasses, sets, lists), so with the default
thresholds (700, 10, 10) collections become a large share of CPU (field notes; py-spy
shows it on the book lines). The books hold no reference cycles worth chasing quickly,
so collections are made rare rather than disabled. Every worker process is tuned so
(`workers.runtime.run_workers`), not the engine alone: with the default thresholds the lookout
and each channel deliverer, though their heaps are small (~80,000 objects), ran a full collection
every ~16,000 alerts, 35-49 ms of CPU each, and found ~1,200 objects of garbage in a whole
alert-heavy run: 1.4-2.1 s of CPU per run among the three (docs/benchmarks.md, "2026-12-07").
What a worker holds for long and drops in cycles is a lost connection's (its channels, consumers,
a per-order worker's books): a full collection follows each loss (`collect_after_loss`, called by
`aldebaran.io.amqp`), since at these thresholds one otherwise comes only after hundreds of
millions of allocations.

Rare is not free: each book's dict of counted events is tracked (it holds Structs), so a
young collection at 100,000 events/s takes ~2 ms, and when it lands inside a cycle the
message waiting on that cycle carries it. `collect_when_idle` runs the same collections
in the gaps between cycles, before the automatic threshold is reached; a busy engine
never idles and falls back to the automatic collector.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

GC_THRESHOLDS = (100_000, 50, 100)
IDLE_YOUNG = 10_000  # young objects the idle engine collects at (a tenth of the automatic threshold)


def tune_gc() -> None:
    """Rare young collections, very rare full ones; already-live objects frozen out of scans."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def collect_after_loss() -> None:
    """A full collection once a broker connection is lost: its objects (channels, consumers, a
    per-order worker's books held by a dead channel's consumers) are old and in reference cycles.
    Rare, and tens of ms at these heaps."""
    gc.collect()


def collect_when_idle() -> int | None:
    """The collection the automatic collector would run next, if enough young objects wait
    for it: the generation collected, or None. Call it only when nothing waits on the thread."""
    young, middle, old = gc.get_count()
    if young < IDLE_YOUNG:
        return None
    # What the automatic collector does at its threshold: the oldest generation whose count
    # (collections of the one below) would pass its threshold with this collection.
    generation = 0
    if middle + 1 > GC_THRESHOLDS[1]:
        generation = 2 if old + 1 > GC_THRESHOLDS[2] else 1
    gc.collect(generation)
    return generation


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop's event loop when uvloop is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)
