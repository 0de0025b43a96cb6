"""The engine step of one 1000-event message, back to back and with the core idle in between.

`aldebaran bench` times the step alone over a million events back to back (its "engine step
alone"). A paced engine at 100,000 events/s gets one 1000-event message every 10 ms and idles
in between, while RabbitMQ and the publisher run: its step starts cold. This runs `Engine.begin`
(decode, record) and `Engine.finish` (close, apply) on the low-alert workload's messages, one
message per cycle, in alternating rounds: back to back, then with a pause before each message.
Prints the mean CPU ms per message of each part (the first 100 messages of a round not counted).

With a ttl (seconds), pipeline time advances by the pause per message, as in a paced run, so
books fall due and close in the steady state; each round then compares the books closed in the
message's step with the books closed while idle, as each falls due (`Engine.next_close_ms`, what
the worker does), and prints what those idle closes cost apart.

    .venv/bin/python deploy/testbed/cold_step.py [rounds, default 3] [pause ms, default 10] [ttl s]
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.bench.pure import fresh_engine
from aldebaran.bench.workload import build
from aldebaran.core.engine import Engine
from aldebaran.core.wal import WalMessage
from aldebaran.runtime_tuning import tune_gc
from aldebaran.settings import Settings

MESSAGES = 600
WARM_UP = 100
START_MS = 1_000_000


def _close_while_idle(engine: Engine, pause: float, stamp: int, now: datetime) -> float:
    """Sleep through `pause` before `stamp`, closing each book as it falls due: CPU s spent closing."""
    spent = 0.0
    woke = stamp - int(pause * 1000)
    while (due := engine.next_close_ms()) is not None and due < stamp:
        time.sleep(max(due - woke, 0) / 1000)
        woke = due
        started = time.thread_time()
        engine.close(due, now)
        spent += time.thread_time() - started
    time.sleep(max(stamp - woke, 0) / 1000)
    return spent


def one_round(settings: Settings, messages: list[WalMessage], pause: float, paced_ms: int,
              idle_closes: bool, warm_up: int = WARM_UP) -> tuple[float, float, float]:
    """A fresh engine over `messages`, one per cycle: mean CPU ms of begin, finish and idle closes."""
    engine = fresh_engine(settings)
    now = datetime.now(UTC)
    begin = finish = closing = 0.0
    for index, message in enumerate(messages):
        stamp = START_MS + index * paced_ms
        spent = 0.0
        if idle_closes:
            spent = _close_while_idle(engine, pause, stamp, now)
        elif pause:
            time.sleep(pause)
        started = time.thread_time()
        cycle = engine.begin([message], stamp)
        decoded = time.thread_time()
        engine.finish(cycle, now)
        if index >= warm_up:
            begin += decoded - started
            finish += time.thread_time() - decoded
            closing += spent
    counted = len(messages) - warm_up
    return begin / counted * 1e3, finish / counted * 1e3, closing / counted * 1e3


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    pause = (float(argv[1]) if len(argv) > 1 else 10.0) / 1000
    ttl = float(argv[2]) if len(argv) > 2 else 0.0
    settings = Settings(book_ttl_seconds=ttl) if ttl else Settings()
    # A ttl: pipeline time moves as the pauses do, and 2.5 ttls of messages (the last 60 % closing).
    paced_ms = max(int(pause * 1000), 1) if ttl else 1
    count = max(MESSAGES, int(ttl * 2.5 * 1000 / paced_ms)) if ttl else MESSAGES
    workload = build(count * 1000, batch=1000, over_share=0.01, orphans=0.0)
    messages = [WalMessage(body.content_type, body.data) for body in workload.bodies[:count]]
    warm_up = count - int(count * 0.6) if ttl else WARM_UP
    tune_gc()
    print(f"{count - warm_up} 1000-event msgpack messages a round, one per cycle; CPU ms per message")
    modes = [("closed in the step", pause, False), ("closed while idle", pause, True)] if ttl else \
        [("back to back", 0.0, False), (f"{pause * 1000:g} ms idle before each", pause, False)]
    for _ in range(rounds):
        for label, gap, idle_closes in modes:
            begin, finish, closing = one_round(settings, messages, gap, paced_ms, idle_closes, warm_up)
            extra = f"  (idle closes apart: {closing:.3f})" if idle_closes else ""
            print(f"  {label:24s} begin {begin:.3f}  finish {finish:.3f}  step {begin + finish:.3f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
