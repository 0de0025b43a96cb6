"""A cycle's place among `max_cycles_in_flight`: held until acked when it has outputs to confirm,
not held at all when it has none (its ack still waits for the earlier cycles')."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aldebaran.core.wal import WalMessage
from aldebaran.settings import Settings
from tests.support.waiting import eventually, loop_turns
from workers.engine_cycle import CycleOutput, Delivery
from workers.engine_session import Session

GUARD = 10.0  # seconds: a step that should happen at once fails the test here


class _Inbound:
    """The ingress channel as `_confirm_and_ack` uses it: acks, recorded."""

    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    async def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.acks.append((tag, multiple))


def _session() -> Session:
    settings = Settings()
    worker = SimpleNamespace(config=settings.engine, store=None, settings=settings)
    session = Session(worker, connection=None, ended=asyncio.Event(), life=None)  # type: ignore[arg-type]
    session.inbound = _Inbound()  # type: ignore[assignment]
    return session


def _delivery(tag: int) -> Delivery:
    return Delivery(tag, WalMessage("application/json", b"[]"), 0.0)


def test_a_cycle_with_nothing_to_confirm_frees_its_place_while_an_earlier_cycle_is_unacked() -> None:
    """With every place taken, a message waits for a cycle; a cycle with nothing to confirm
    lets it start at once, though its own ack waits for the earlier cycles'."""

    async def scenario() -> None:
        session = _session()
        batcher, slots = session.batcher, session.config.max_cycles_in_flight
        for tag in range(1, slots + 1):  # every slot taken, one message per cycle
            batcher.add(_delivery(tag))
            assert batcher.take()
        earlier: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # the earlier cycles' acks
        batcher.add(_delivery(slots + 1))
        assert not batcher.ready, "with every slot taken, the next message waits"
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        last = CycleOutput(last_tag=slots, rejects=[], oldest_published_ms=0.0, handovers=[])
        task = asyncio.ensure_future(session._confirm_and_ack(last, earlier, mine))
        await eventually(lambda: batcher.ready, "the waiting message may start a cycle", GUARD, pause=0)
        assert batcher.in_flight == slots - 1
        assert session.inbound.acks == [], "nothing is acked before the earlier cycles are"  # type: ignore[attr-defined]
        assert not mine.done()
        earlier.set_result(None)
        await asyncio.wait_for(task, GUARD)
        assert session.inbound.acks == [(slots, True)]  # type: ignore[attr-defined]
        assert mine.done() and mine.exception() is None
        assert batcher.in_flight == slots - 1, "the slot is freed once, not again when the ack is done"

    asyncio.run(scenario())


def test_a_cycle_with_alerts_keeps_its_place_until_it_is_acked() -> None:
    """Under load, what arrives while a cycle's alerts are confirmed and acked forms the next,
    fuller cycle: one alert batch instead of several."""

    async def scenario() -> None:
        session = _session()
        batcher = session.batcher
        batcher.add(_delivery(1))
        assert batcher.take()
        published: list[list[str]] = []

        async def confirmed(_: list[str], alert_ids: list[str], __: list[bytes]) -> None:
            published.append(alert_ids)

        async def mark_sent(*_: object) -> None:
            return None

        session._publish = confirmed  # type: ignore[method-assign,assignment]
        session.store = SimpleNamespace(mark_sent=mark_sent)  # type: ignore[assignment]
        earlier: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        output = CycleOutput(last_tag=1, rejects=[], oldest_published_ms=0.0, handovers=[],
                             alert_ids=["a"], bodies=[b"{}"], kinds=["over_purchase"])
        task = asyncio.ensure_future(session._confirm_and_ack(output, earlier, mine))
        await eventually(lambda: published == [["a"]], "the cycle's alerts are published", GUARD, pause=0)
        await loop_turns()
        assert batcher.in_flight == 1, "confirmed but not acked: the cycle keeps its place"
        earlier.set_result(None)
        await asyncio.wait_for(task, GUARD)
        assert session.inbound.acks == [(1, True)]  # type: ignore[attr-defined]
        assert batcher.in_flight == 0

    asyncio.run(scenario())


def test_a_cycle_whose_outputs_fail_frees_its_slot_and_ends_the_session() -> None:
    async def scenario() -> None:
        session = _session()
        batcher = session.batcher
        batcher.add(_delivery(1))
        assert batcher.take()

        async def refused(*_: object) -> None:
            raise ConnectionError("the broker went away")

        session._publish = refused  # type: ignore[method-assign,assignment]
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        output = CycleOutput(last_tag=1, rejects=[], oldest_published_ms=0.0, handovers=[],
                             alert_ids=["a"], bodies=[b"{}"], kinds=["over_purchase"])
        await asyncio.wait_for(session._confirm_and_ack(output, None, mine), GUARD)
        assert batcher.in_flight == 0
        assert session.ended.is_set() and isinstance(session.failed, ConnectionError)
        assert session.inbound.acks == []  # type: ignore[attr-defined]
        assert isinstance(mine.exception(), ConnectionError)

    asyncio.run(scenario())
