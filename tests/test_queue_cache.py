"""The aggregator's declare cache: one declaration per queue, callers in arrival order (pure)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from aldebaran.core.queue_cache import QueueCache


def test_a_caller_arriving_as_the_declaration_ends_does_not_overtake_one_that_waited() -> None:
    """The per-order aggregator's race: a newcomer found the queue fresh while an earlier
    caller was still being woken, and its event reached the book first."""

    async def scenario() -> tuple[list[str], list[str]]:
        cache = QueueCache(100, lifetime_seconds=60)
        gate = asyncio.Event()
        declared: list[str] = []
        returned: list[str] = []

        async def declare(name: str) -> None:
            declared.append(name)
            await gate.wait()

        async def caller(label: str) -> None:
            await cache.ensure("book-conf", declare)
            returned.append(label)

        first = asyncio.create_task(caller("first"))
        await asyncio.sleep(0)  # declaring
        waiting = asyncio.create_task(caller("waiting"))
        await asyncio.sleep(0)  # waiting for that declaration
        gate.set()  # the declaration ends ...
        late = asyncio.create_task(caller("late"))  # ... and a newcomer is scheduled before the waiter wakes
        await asyncio.gather(first, waiting, late)
        return declared, returned

    declared, returned = asyncio.run(scenario())
    assert declared == ["book-conf"]
    assert returned == ["first", "waiting", "late"]


def test_a_failed_declaration_is_tried_again_by_the_next_caller() -> None:
    async def scenario() -> tuple[int, list[object]]:
        cache = QueueCache(100, lifetime_seconds=60)
        calls = 0

        async def declare(name: str) -> None:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0)
            if calls == 1:
                raise ConnectionError("channel closed")

        results = await asyncio.gather(cache.ensure("q", declare), cache.ensure("q", declare),
                                       cache.ensure("q", declare), return_exceptions=True)
        return calls, results

    calls, results = asyncio.run(scenario())
    assert calls == 2
    assert isinstance(results[0], ConnectionError) and results[1:] == [True, False]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(0, 4))
def test_callers_of_one_name_return_in_call_order_and_share_one_declaration(calls, declare_turns) -> None:
    """Callers start at random loop turns (`gap` turns after the previous one); a declaration
    takes `declare_turns` turns."""

    async def scenario() -> tuple[dict[str, int], list[tuple[str, int]]]:
        cache = QueueCache(100, lifetime_seconds=3600)
        declared: dict[str, int] = {}
        returned: list[tuple[str, int]] = []

        async def declare(name: str) -> None:
            declared[name] = declared.get(name, 0) + 1
            for _ in range(declare_turns):
                await asyncio.sleep(0)

        async def caller(name: str, index: int) -> None:
            await cache.ensure(name, declare)
            returned.append((name, index))

        tasks = []
        for index, (name, gap) in enumerate(calls):
            for _ in range(gap):
                await asyncio.sleep(0)
            tasks.append(asyncio.create_task(caller(name, index)))
        await asyncio.gather(*tasks)
        return declared, returned

    declared, returned = asyncio.run(scenario())
    names = {name for name, _ in calls}
    assert declared == dict.fromkeys(names, 1)
    for name in names:
        assert [i for n, i in returned if n == name] == [i for i, (n, _) in enumerate(calls) if n == name]
