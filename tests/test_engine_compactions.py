"""The engine's compactions beside the cycles (`workers/engine_compactions.py`): one in flight at
a time, its picture taken when it starts, the engine told only once Redis stored it, and a failed
one ending the session.

Through a fake store whose compaction waits for the test: a real Redis cannot be made to hold one
reply back on cue. The same path runs against Redis in `tests/test_engine.py` (the engine's crash
tests compact every second) and `tests/test_engine_store.py` (a compaction and a commit retried
across each other).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from aldebaran.io.engine_store import Fenced
from tests.support.waiting import eventually, loop_turns
from workers.engine_compactions import Compactions

GUARD = 10.0  # seconds: a step that should happen at once fails the test here


class _Engine:
    """What a compaction asks of the engine: its picture, and the word it was stored."""

    def __init__(self) -> None:
        self.pictures = 0
        self.stored: list[int] = []

    def compaction(self) -> int:
        self.pictures += 1
        return self.pictures

    def compacted(self, compaction: int) -> None:
        self.stored.append(compaction)


class _Store:
    """Compactions asked for, in order; each is stored when the test resolves its reply."""

    def __init__(self) -> None:
        self.requests: list[int] = []
        self.replies: list[asyncio.Future[None]] = []
        self.sends: list[Any] = []  # the request coroutines handed out

    def compact(self, compaction: int) -> Any:
        self.requests.append(compaction)  # asked for at once: the picture is the request's
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.replies.append(reply)

        async def send() -> None:
            await reply
        self.sends.append(send())
        return self.sends[-1]


class _Session:
    def __init__(self) -> None:
        self.store = _Store()
        self.failures: list[tuple[BaseException, str]] = []
        self.witness = self.witness_queue = None

    def fail(self, exc: BaseException, part: str) -> None:
        self.failures.append((exc, part))


def _compactions(every: float = 1.0) -> tuple[Compactions, _Session, _Engine]:
    session = _Session()
    compactions = Compactions(session, every, now=0.0)  # type: ignore[arg-type]
    compactions._trim_witnesses = _no_witnesses  # type: ignore[method-assign]
    return compactions, session, _Engine()


async def _no_witnesses() -> None:
    return None


def test_one_compaction_is_in_flight_at_a_time_and_the_engine_hears_of_it_once_stored() -> None:
    async def scenario() -> None:
        compactions, session, engine = _compactions()
        compactions.maybe_start(engine, 0.5)  # not due
        assert session.store.requests == []
        compactions.maybe_start(engine, 1.0)
        assert session.store.requests == [1]  # the picture is taken in the caller's turn
        compactions.maybe_start(engine, 2.5)  # due again, the first still in flight: none
        await loop_turns()
        assert session.store.requests == [1] and engine.stored == []
        session.store.replies[0].set_result(None)
        await eventually(lambda: engine.stored, "the first compaction stored", GUARD, pause=0)
        assert engine.stored == [1] and compactions.done == 1
        compactions.maybe_start(engine, 2.6)  # 1.6 s since the last start
        assert session.store.requests == [1, 2] and session.failures == []
        compactions.cancel()  # before the second's task ran: its request is closed, never sent
        assert inspect.getcoroutinestate(session.store.sends[1]) == inspect.CORO_CLOSED

    asyncio.run(scenario())


def test_a_fenced_compaction_ends_the_session_and_the_engine_trims_nothing() -> None:
    async def scenario() -> None:
        compactions, session, engine = _compactions()
        compactions.maybe_start(engine, 1.0)
        session.store.replies[0].set_exception(Fenced("FENCED: not the engine owner"))
        await eventually(lambda: session.failures, "the session told of the failure", GUARD, pause=0)
        [(exc, part)] = session.failures
        assert isinstance(exc, Fenced) and part == "compaction" and engine.stored == []

    asyncio.run(scenario())
