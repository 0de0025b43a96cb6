"""Interpreter tuning for the hot-path worker (the engine).

Python's cyclic GC scans every tracked object on each full collection; the engine
holds hundreds of thousands of books (dataclasses, sets, lists), so with the default
thresholds (700, 10, 10) collections become a large share of CPU (field notes; py-spy
shows it on the book lines). The books hold no reference cycles worth chasing quickly,
so collections are made rare rather than disabled.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (100_000, 50, 100)


def tune_gc() -> None:
    """Rare young collections, very rare full ones; already-live objects frozen out of scans."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
