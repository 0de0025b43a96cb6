"""The engine's pure step, alone: CPU µs per event of `Engine.cycle` with no broker, no Redis.

What the drains measure is the whole process (AMQP frames, the commit, the acks); this is
the part a faster decoder or rule would change, and the issue's "pure per-event Python
cost". The cycles take the workload's bodies as the drains deliver them (8 messages a cycle
for 100-event bodies, 1 for 1000-event ones), with the engine's GC tuning.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from aldebaran.apps import load_rules
from aldebaran.core.engine import Engine
from aldebaran.core.rule import Rule
from aldebaran.core.wal import WalMessage
from aldebaran.io.publisher import Body
from aldebaran.runtime_tuning import tune_gc
from aldebaran.settings import Settings


def fresh_engine(settings: Settings, rules: Sequence[Rule[Any]] | None = None) -> Engine:
    """An empty engine as the worker builds one from `settings` (one that owns every book), with
    the configured rules or `rules` (a prototype measured against them)."""
    config = settings.engine
    return Engine(load_rules(settings) if rules is None else rules, settings.book_ttl_seconds,
                  config.done_retention_seconds, config.done_max_markers, settings.max_message_bytes)


def cycle_us_per_event(settings: Settings, bodies: Sequence[Body], per_cycle: int, rounds: int = 3) -> float:
    """The lowest of `rounds` runs (a fresh engine each) over `bodies`: µs of CPU per event."""
    tune_gc()
    messages = [WalMessage(body.content_type, body.data) for body in bodies]
    events = sum(body.events for body in bodies)
    now = datetime.now(UTC)
    best = float("inf")
    for _ in range(rounds):
        engine = fresh_engine(settings)
        started = time.process_time()
        for stamp, start in enumerate(range(0, len(messages), per_cycle), start=1_000_000):
            engine.cycle(messages[start:start + per_cycle], stamp, now)
        best = min(best, (time.process_time() - started) / events * 1e6)
    return best
