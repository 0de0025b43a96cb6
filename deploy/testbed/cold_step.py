"""The engine step of one 1000-event message, back to back and with the core idle in between.

`aldebaran bench` times the step alone over a million events back to back (its "engine step
alone"). A paced engine at 100,000 events/s gets one 1000-event message every 10 ms and idles
in between, while RabbitMQ and the publisher run: its step starts cold. This runs `Engine.begin`
(decode, record) and `Engine.finish` (close, apply) on the low-alert workload's messages, one
message per cycle, in alternating rounds: back to back, then with a pause before each message.
Prints the mean CPU ms per message of each part (the first 100 messages of a round not counted).

    .venv/bin/python deploy/testbed/cold_step.py [rounds, default 3] [pause ms, default 10]
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

MESSAGES = 600
WARM_UP = 100


def one_round(settings: Settings, messages: list[WalMessage], pause: float) -> tuple[float, float]:
    """A fresh engine over `messages`, one per cycle: mean CPU ms of begin and of finish."""
    engine = fresh_engine(settings)
    now = datetime.now(UTC)
    begin = finish = 0.0
    for index, message in enumerate(messages):
        if pause:
            time.sleep(pause)
        started = time.thread_time()
        cycle = engine.begin([message], 1_000_000 + index)
        decoded = time.thread_time()
        engine.finish(cycle, now)
        if index >= WARM_UP:
            begin += decoded - started
            finish += time.thread_time() - decoded
    counted = len(messages) - WARM_UP
    return begin / counted * 1e3, finish / counted * 1e3


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    pause = (float(argv[1]) if len(argv) > 1 else 10.0) / 1000
    settings = Settings()
    workload = build(500_000, batch=1000, over_share=0.01, orphans=0.0)
    messages = [WalMessage(body.content_type, body.data) for body in workload.bodies[:MESSAGES]]
    tune_gc()
    print(f"{len(messages) - WARM_UP} 1000-event msgpack messages a round, one per cycle; CPU ms per message")
    for _ in range(rounds):
        for label, gap in (("back to back", 0.0), (f"{pause * 1000:g} ms idle before each", pause)):
            begin, finish = one_round(settings, messages, gap)
            print(f"  {label:24s} begin {begin:.3f}  finish {finish:.3f}  step {begin + finish:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
