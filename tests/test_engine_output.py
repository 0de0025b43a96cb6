"""The engine's output path (`workers/engine_output.py`): a cycle hands its output over and the next
cycle may start at once; outputs handed over while a round is confirmed go out together in the next
round; nothing is acked before its round, and every earlier one, is confirmed; cycles that raise
take the round and the compaction in flight down with the session.

Through fakes of the ingress channel and the publish: a real broker cannot be made to hold one
confirm back on cue. The same path runs against RabbitMQ and Redis in `tests/test_engine.py` and
the engine's fault and shutdown tests.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from aldebaran.core.wal import WalMessage
from aldebaran.settings import EngineSettings, Settings
from tests.support.waiting import eventually, loop_turns
from workers.engine_cycle import CycleOutput, Delivery
from workers.engine_session import Session

GUARD = 10.0  # seconds: a step that should happen at once fails the test here


class _Inbound:
    """The ingress channel as the output path uses it: acks, recorded."""

    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    async def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.acks.append((tag, multiple))


class _Bus:
    """Alert publishes, recorded; each waits for the test to confirm it (or refuse it)."""

    def __init__(self) -> None:
        self.published: list[tuple[list[str], list[str]]] = []  # (entries, alert ids)
        self.confirms: list[asyncio.Future[None]] = []
        self.marked: list[list[str]] = []

    async def publish(self, entries: list[str], alert_ids: list[str], _: list[bytes]) -> None:
        self.published.append((entries, alert_ids))
        confirm: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.confirms.append(confirm)
        await confirm

    async def mark_sent(self, entries: list[str], _: list[bytes]) -> None:
        self.marked.append(list(entries))


def _session(bus: _Bus | None = None, **engine: int) -> tuple[Session, _Bus]:
    """A session on fakes; `bus`: the publishes and marks it records (a plain `_Bus` if none)."""
    settings = Settings(engine=EngineSettings(**engine))
    bus = bus if bus is not None else _Bus()
    worker = SimpleNamespace(config=settings.engine, store=bus, settings=settings,
                             samples=SimpleNamespace(enabled=False), report=lambda: None)
    session = Session(worker, connection=None, ended=asyncio.Event(), life=None)  # type: ignore[arg-type]
    session.inbound = _Inbound()  # type: ignore[assignment]
    session.publish = bus.publish  # type: ignore[method-assign]
    return session, bus


def _output(tag: int, *alerts: str) -> CycleOutput:
    return CycleOutput(last_tag=tag, rejects=[], oldest_published_ms=0.0, handovers=[], alert_ids=list(alerts),
                       bodies=[b"{}"] * len(alerts), kinds=["over_purchase"] * len(alerts),
                       entry=f"entry-{tag}" if alerts else None, messages=1)


def _waiting_message(session: Session, tag: int) -> None:
    session.batcher.add(Delivery(tag, WalMessage("application/json", b"[]"), 0.0))


def _acks(session: Session) -> list[tuple[int, bool]]:
    return session.inbound.acks  # type: ignore[attr-defined, no-any-return]


def test_the_next_cycle_may_start_while_a_cycles_alerts_are_confirmed() -> None:
    async def scenario() -> None:
        session, bus = _session()
        session.rounds.put(_output(1, "a"))
        await eventually(lambda: bus.confirms, "the first round's publish", GUARD, pause=0)
        for tag in range(2, 12):  # one-message cycles, as a paced engine's: far from the default room
            session.rounds.put(_output(tag, "b"))
        _waiting_message(session, 12)
        assert session._may_start(), "cycles awaiting their confirms hold no cycle back"
        assert _acks(session) == []
        bus.confirms[0].set_result(None)
        await eventually(lambda: len(bus.confirms) == 2, "the second round's publish", GUARD, pause=0)
        assert _acks(session) == [(1, True)]
        session.rounds.cancel()

    asyncio.run(scenario())


def test_outputs_handed_over_during_a_round_go_out_together_in_the_next() -> None:
    def alert_batches() -> tuple[float, float]:
        labels = {"stage": "alert"}
        return (REGISTRY.get_sample_value("aldebaran_batch_events_count", labels) or 0.0,
                REGISTRY.get_sample_value("aldebaran_batch_events_sum", labels) or 0.0)

    async def scenario() -> None:
        session, bus = _session()
        rounds_before, alerts_before = alert_batches()
        session.rounds.put(_output(1, "a"))
        await eventually(lambda: bus.confirms, "the first round's publish", GUARD, pause=0)
        for output in (_output(2, "b"), _output(3), _output(4, "c", "d")):
            session.rounds.put(output)
        await loop_turns()
        assert bus.published == [(["entry-1"], ["a"])], "one round in flight at a time"
        assert _acks(session) == [], "nothing is acked before its round is confirmed"
        bus.confirms[0].set_result(None)
        await eventually(lambda: len(bus.confirms) == 2, "the second round's publish", GUARD, pause=0)
        assert bus.published[1] == (["entry-2", "entry-4"], ["b", "c", "d"]), "one batch for the round"
        assert _acks(session) == [(1, True)]
        bus.confirms[1].set_result(None)
        await session.rounds.drained(GUARD)
        assert _acks(session) == [(1, True), (4, True)], "one multiple-ack covers the round's cycles"
        assert bus.marked == [["entry-1"], ["entry-2", "entry-4"]]
        rounds_after, alerts_after = alert_batches()
        assert (rounds_after - rounds_before, alerts_after - alerts_before) == (2, 4), "alerts per round, observed"
        assert session.rounds.messages == 0
        session.rounds.cancel()

    asyncio.run(scenario())


class _SlowMarks(_Bus):
    """As `_Bus`, each mark waiting for the test to answer it (or fail it), as Redis would."""

    def __init__(self) -> None:
        super().__init__()
        self.mark_replies: list[asyncio.Future[None]] = []

    async def mark_sent(self, entries: list[str], bodies: list[bytes]) -> None:
        await super().mark_sent(entries, bodies)
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.mark_replies.append(reply)
        await reply


def _confirmed_alert_latencies() -> float:
    return REGISTRY.get_sample_value("aldebaran_processing_latency_seconds_count", {"stage": "alert"}) or 0.0


def test_the_next_round_goes_out_while_the_last_ones_alerts_are_marked_sent() -> None:
    """A mark Redis has not answered holds no round back; entries confirmed meanwhile are marked
    together in the next call; the alert latency is taken at the confirm, not at the mark; and
    `drained` waits for the marks."""

    async def scenario() -> None:
        bus = _SlowMarks()
        session, _ = _session(bus)
        latencies = _confirmed_alert_latencies()
        first = _output(1, "a")
        first.oldest_published_ms = time.time() * 1000
        session.rounds.put(first)
        await eventually(lambda: bus.confirms, "the first round's publish", GUARD, pause=0)
        bus.confirms[0].set_result(None)
        await eventually(lambda: bus.mark_replies, "the first round's mark", GUARD, pause=0)
        assert _confirmed_alert_latencies() == latencies + 1, "sampled at the confirm"
        for tag in (2, 3):
            session.rounds.put(_output(tag, f"alert-{tag}"))
            await eventually(lambda tag=tag: len(bus.confirms) == tag, f"round {tag}'s publish", GUARD, pause=0)
            bus.confirms[-1].set_result(None)
            await eventually(lambda tag=tag: _acks(session)[-1] == (tag, True), f"round {tag}'s ack", GUARD, pause=0)
        assert bus.marked == [["entry-1"]], "one mark in flight at a time"
        drained = asyncio.ensure_future(session.rounds.drained(GUARD))
        await loop_turns()
        assert not drained.done(), "drained waits for the marks"
        bus.mark_replies[0].set_result(None)
        await eventually(lambda: len(bus.mark_replies) == 2, "the next mark", GUARD, pause=0)
        assert bus.marked == [["entry-1"], ["entry-2", "entry-3"]], "marked together in the next call"
        bus.mark_replies[1].set_result(None)
        await asyncio.wait_for(drained, GUARD)
        assert not session.ended.is_set()
        session.rounds.cancel()

    asyncio.run(scenario())


def test_a_failed_mark_ends_the_session() -> None:
    async def scenario() -> None:
        bus = _SlowMarks()
        session, _ = _session(bus)
        session.rounds.put(_output(1, "a"))
        await eventually(lambda: bus.confirms, "the round's publish", GUARD, pause=0)
        bus.confirms[0].set_result(None)
        await eventually(lambda: bus.mark_replies, "the round's mark", GUARD, pause=0)
        bus.mark_replies[0].set_exception(ConnectionError("Redis went away"))
        await session.rounds.drained(GUARD)
        assert session.ended.is_set() and isinstance(session.failed, ConnectionError)
        assert _acks(session) == [(1, True)], "confirmed before the mark: acked"

    asyncio.run(scenario())


def test_past_max_cycles_in_flight_full_cycles_of_messages_the_next_cycle_waits_and_is_woken() -> None:
    """In a drain the prefetch window keeps room for a full next cycle: fuller cycles, fewer batches."""

    async def scenario() -> None:
        session, bus = _session(max_cycles_in_flight=1, max_cycle_messages=2)
        session.rounds.put(_output(1, "a"))
        await eventually(lambda: bus.confirms, "the first round's publish", GUARD, pause=0)
        session.rounds.put(_output(2))
        _waiting_message(session, 3)
        assert not session._may_start(), "a full cycle's worth awaits the output path: the next one waits"
        woken = asyncio.ensure_future(session.wakeup.wait(GUARD))
        await loop_turns()
        assert not woken.done()
        bus.confirms[0].set_result(None)
        await asyncio.wait_for(woken, GUARD / 2)  # the round woke the loop, well before the wait's bound
        assert session._may_start()
        await session.rounds.drained(GUARD)
        assert _acks(session) == [(1, True), (2, True)]
        session.rounds.cancel()

    asyncio.run(scenario())


def test_a_failed_round_ends_the_session_and_nothing_after_it_is_acked() -> None:
    async def scenario() -> None:
        session, bus = _session()
        session.rounds.put(_output(1, "a"))
        await eventually(lambda: bus.confirms, "the first round's publish", GUARD, pause=0)
        session.rounds.put(_output(2))
        bus.confirms[0].set_exception(ConnectionError("the broker went away"))
        await session.rounds.drained(GUARD)
        assert session.ended.is_set() and isinstance(session.failed, ConnectionError)
        session.rounds.put(_output(3))
        await loop_turns()
        assert _acks(session) == [] and bus.marked == []

    asyncio.run(scenario())


def test_cycles_that_raise_stop_the_round_and_the_compaction_in_flight() -> None:
    async def scenario() -> None:
        session, bus = _session()
        session.inbound.is_closed = True  # type: ignore[misc]
        session.rounds.put(_output(1, "a"))
        await eventually(lambda: bus.confirms, "the round's publish", GUARD, pause=0)
        storing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.compactions.task = asyncio.ensure_future(storing)  # a compaction Redis has not answered

        async def cycles(engine: object) -> None:
            raise RuntimeError("a cycle broke")

        session._cycles = cycles  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="a cycle broke"):
            await session._serve(None, [])  # type: ignore[arg-type]
        await loop_turns()
        assert session.rounds._task is not None and session.rounds._task.cancelled()
        assert storing.cancelled(), "the compaction must not outlive the session"
        assert _acks(session) == [], "a round cut short acks nothing"

    asyncio.run(scenario())
