"""The engine step alone, deterministic enough to compare revisions under cachegrind.

`Engine.cycle` of the configured rules (the defaults: trade_limits) over a low-alert
workload of 1000-event msgpack messages, one message a cycle, no broker, no Redis: what a
faster decoder or rule changes. Prints µs of CPU per event and what the step counted, so two
revisions can be checked to agree. Instructions do not depend on the host's noise: run it
under `valgrind --tool=cachegrind`, and once with `setup` (the workload alone) to subtract.

    .venv/bin/python deploy/testbed/engine_step.py [rounds, default 3] [orders, default 220000] [setup]
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.bench.pure import fresh_engine
from aldebaran.bench.workload import build
from aldebaran.core.wal import WalMessage
from aldebaran.runtime_tuning import tune_gc
from aldebaran.settings import Settings


def one_round(settings: Settings, messages: list[WalMessage], events: int) -> tuple[float, tuple[int, int, int]]:
    """A fresh engine over `messages`: µs of CPU per event, and (alerts, applied, duplicates)."""
    engine = fresh_engine(settings)
    now = datetime.now(UTC)
    alerts = applied = duplicate = 0
    started = time.process_time()
    for stamp, message in enumerate(messages, start=1_000_000):
        cycle = engine.cycle([message], stamp, now)
        alerts += len(cycle.alerts)
        applied += cycle.applied
        duplicate += cycle.duplicate
    return (time.process_time() - started) / events * 1e6, (alerts, applied, duplicate)


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    orders = int(argv[1]) if len(argv) > 1 else 220_000
    workload = build(orders, 1000, over_share=0.01)
    messages = [WalMessage(body.content_type, body.data) for body in workload.bodies]
    events = sum(body.events for body in workload.bodies)
    settings = Settings()
    tune_gc()
    print(f"{events:,} events in {len(messages)} messages")
    if argv[2:] == ["setup"]:
        return 0
    for _ in range(rounds):
        per_event, counts = one_round(settings, messages, events)
        print(f"{per_event:.3f} µs of CPU per event (alerts, applied, duplicates: {counts})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
