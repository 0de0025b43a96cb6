"""A hypothesis state machine drives the Redis pull queue against a plain-Python model.

Time is the queue's injected clock (milliseconds), so visibility windows expire exactly
when the model says. Checked after every step: no message is lost (each live message is
in exactly one place: ready, checked out, dead), FIFO order with rescued messages at the
end, and no message is handed to a second receiver inside its visibility window.
"""

from __future__ import annotations

import asyncio
import itertools

import hypothesis.strategies as st
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from aldebaran.api.pullqueue import PullQueue
from aldebaran.io.redis import Keys
from tests.support import services

LIFETIME_MS = 10_000
MAX_RECEIVES = 3
_names = itertools.count()


class PullQueueMachine(RuleBasedStateMachine):
    keys = Bundle("keys")

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.now = 1_700_000_000_000
        self.loop = asyncio.new_event_loop()
        self.redis = aioredis.Redis.from_url(services.REDIS_URL)
        self.queue = PullQueue(self.redis, Keys(prefix), f"model-{next(_names)}",
                               checkout_lifetime_seconds=LIFETIME_MS / 1000, max_receive_count=MAX_RECEIVES,
                               clock=lambda: self.now)
        self.texts: dict[str, str] = {}          # live messages
        self.ready: list[str] = []
        self.checked: dict[str, int] = {}        # key -> visibility deadline
        self.dead: list[str] = []
        self.retries: dict[str, int] = {}
        self.visible_again_at: dict[str, int] = {}  # last hand-out's deadline, never forgotten
        self.first_key: dict[str, str] = {}  # dedup id -> the key its first send created

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.redis.aclose())
        self.loop.close()

    def _rescue(self) -> None:
        for _, key in sorted((d, k) for k, d in self.checked.items() if d <= self.now):
            del self.checked[key]
            self.retries[key] += 1
            (self.dead if self.retries[key] >= MAX_RECEIVES else self.ready).append(key)

    @rule(target=keys, text=st.text(min_size=1, max_size=12))
    def send(self, text: str) -> str:
        key, created = self.run(self.queue.send(text))
        assert created and key not in self.retries
        self.texts[key], self.retries[key] = text, 0
        self.ready.append(key)
        return key

    @rule(count=st.integers(1, 4))
    def receive(self, count: int) -> None:
        got = self.run(self.queue.receive(count))
        self._rescue()
        expected, self.ready = self.ready[:count], self.ready[count:]
        assert [m.key for m in got] == expected
        for message in got:
            assert self.visible_again_at.get(message.key, 0) <= self.now, "handed out inside its window"
            assert message.message == self.texts[message.key]
            assert message.retry_count == self.retries[message.key]
            self.checked[message.key] = self.visible_again_at[message.key] = self.now + LIFETIME_MS

    @rule(key=keys)
    def delete(self, key: str) -> None:
        assert self.run(self.queue.delete(key)) == (key in self.texts)
        self.texts.pop(key, None)
        self.checked.pop(key, None)
        for place in (self.ready, self.dead):
            if key in place:
                place.remove(key)

    @rule(ms=st.integers(0, 2 * LIFETIME_MS))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def rescue(self) -> None:
        self.run(self.queue.rescue())
        self._rescue()

    @rule(text=st.text(min_size=1, max_size=5), dedup=st.sampled_from(["a", "b"]))
    def send_with_dedup_id(self, text: str, dedup: str) -> None:
        key, created = self.run(self.queue.send(text, dedup_id=dedup))
        if created:
            self.texts[key], self.retries[key] = text, 0
            self.ready.append(key)
            self.first_key[dedup] = key
        else:
            assert key == self.first_key[dedup]  # the first send's key, live or already deleted

    @rule(batch=st.lists(st.tuples(st.text(min_size=1, max_size=5), st.sampled_from([None, "a", "b", "c"])),
                         min_size=1, max_size=6))
    def send_many(self, batch: list[tuple[str, str | None]]) -> None:
        """One call, each message as `send` would have it: a known or repeated dedup id enqueues nothing."""
        replies = self.run(self.queue.send_many(batch))
        assert len(replies) == len(batch)
        for (text, dedup), (key, created) in zip(batch, replies, strict=True):
            if dedup is not None and dedup in self.first_key:
                assert (key, created) == (self.first_key[dedup], False)
                continue
            assert created and key not in self.retries
            self.texts[key], self.retries[key] = text, 0
            self.ready.append(key)
            if dedup is not None:
                self.first_key[dedup] = key

    @invariant()
    def nothing_lost_nothing_doubled(self) -> None:
        places = self.run(self.queue.snapshot())
        assert places["ready"] == self.ready
        assert places["checkouts"] == [k for _, k in sorted((d, k) for k, d in self.checked.items())]
        assert places["dead"] == self.dead
        everywhere = places["ready"] + places["checkouts"] + places["dead"]
        assert sorted(everywhere) == sorted(self.texts)  # each live message exactly once
        stats = self.run(self.queue.stats())
        assert (stats.queue_length, stats.checkouts_count, stats.dead_letter_count) == (
            len(self.ready), len(self.checked), len(self.dead))


def test_pull_queue_against_its_model(redis_prefix: str) -> None:
    run_state_machine_as_test(
        lambda: PullQueueMachine(redis_prefix),
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]))
