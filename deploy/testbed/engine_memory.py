"""The engine's memory per open event: what `max_rss_mib` allows at a given rate and ttl.

An engine holds every book opened within the last `book_ttl_seconds` of pipeline time, so its
resident memory follows the drain rate × the ttl (docs/backpressure.md, "open books"). This
builds the low-alert workload, then runs it through `Engine.cycle` (1000-event msgpack
messages) with a ttl long enough that no book closes, and prints the growth of the resident
set per open event and per book, and how many open events `max_rss_mib` holds: the rate it
allows at the default ttl.

    .venv/bin/python deploy/testbed/engine_memory.py [orders, default 500000]
"""

from __future__ import annotations

import gc
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.bench.pure import fresh_engine
from aldebaran.bench.workload import build
from aldebaran.core.wal import WalMessage
from aldebaran.runtime_tuning import tune_gc
from aldebaran.settings import Settings

NEVER_CLOSES = 86400 * 7  # seconds of ttl, the longest allowed: no book of the run reaches it


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def main(orders: int) -> None:
    workload = build(orders, 1000, over_share=0.01)
    messages = [WalMessage(body.content_type, body.data) for body in workload.bodies]
    events = sum(body.events for body in workload.bodies)
    del workload
    gc.collect()
    settings = Settings()
    tune_gc()
    before = resident_mib()
    engine = fresh_engine(settings.model_copy(update={"book_ttl_seconds": NEVER_CLOSES}))
    now, stamp = datetime.now(UTC), 1_000_000_000
    for message in messages:
        stamp += 10  # 100,000 events/s of pipeline time
        engine.cycle([message], stamp, now)
    grown = resident_mib() - before
    per_event = grown * 2**20 / events
    held = settings.max_rss_mib * 2**20 / per_event
    print(f"{events:,} events in {engine.open_books:,} open books: +{grown:,.0f} MiB resident, "
          f"{per_event:.0f} B per open event, {grown * 2**20 / engine.open_books:,.0f} B per book")
    print(f"max_rss_mib {settings.max_rss_mib} holds {held / 1e6:.1f}M open events: "
          f"{held / settings.book_ttl_seconds:,.0f} events/s at book_ttl_seconds {settings.book_ttl_seconds:g}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500_000)
