"""The engine's output path: each cycle's alerts, dead letters and handovers confirmed, then its
messages acked, in rounds, apart from the cycles.

A cycle hands its output over once its commit is in Redis and goes on to the next message: it
never waits for a broker confirm. One round is in flight at a time. It publishes the alerts of
every cycle handed over since the last round as one batch (CONTRACT §3), with their dead letters
and handovers, waits for all of their confirms, then acks every one of those cycles' messages
with one `multiple` ack. What cycles hand over meanwhile forms the next round: natural batching
on the output path, as on the input. The confirmed alerts' outbox entries are marked sent in Redis
beside the rounds (`SentMarks`: one call in flight, what is confirmed meanwhile marked together in
the next), so the next round's publish does not wait for that round trip; until an entry is marked,
a crash leaves it pending and its witness settles it (docs/engine.md), as it always could between
the confirm and the mark.

Held by the cycles instead (a cycle with alerts kept its place until it was acked, two places),
the cycle loop stood still 2.1 s of a 20 s paced run in 100-event messages while two alert
confirms were awaited, up to 17.6 ms at a time (docs/benchmarks.md, 2026-12-01).

Crash safety is the cycles' as before: a message is acked only after its cycle's record and
alerts are in Redis and every alert, dead letter and handover of that cycle and of every earlier
one is confirmed (rounds run in order, one at a time). A failed round ends the session: nothing
of it or after it is acked, and the broker redelivers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from aldebaran.core.batching import NaturalBatcher
from aldebaran.io.dead_letter import dead_letter
from aldebaran.io.handover import hand_over
from aldebaran.io.latency_samples import ALERT
from aldebaran.log import get_logger
from aldebaran.metrics import ALERTS_FIRED, BATCH_EVENTS, PROCESSING_LATENCY
from declare.topology import TRADE_DATA
from workers.engine_cycle import CycleOutput

if TYPE_CHECKING:
    from workers.engine_session import Session

log = get_logger("engine")


class OutputRounds:
    """The cycles' outputs awaiting confirmation and ack, and the one round in flight (at most
    `max_outputs` outputs a round)."""

    def __init__(self, session: Session, max_outputs: int, on_round: Callable[[], None]) -> None:
        self.session = session
        self.on_round = on_round  # after each round: the cycle loop may be waiting for room
        self.batcher: NaturalBatcher[CycleOutput] = NaturalBatcher(max_outputs)  # one round in flight
        self.messages = 0  # ingress messages of every output handed over and not yet acked
        self.marks = SentMarks(session, max_outputs)
        self._kick = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def put(self, output: CycleOutput) -> None:
        """A committed cycle's output: confirmed and acked in the next round (in order)."""
        self.batcher.add(output)
        self.messages += output.messages
        self._idle.clear()
        self._kick.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def drained(self, timeout: float) -> None:
        """Until every output handed over is acked and its alerts marked sent, the session failed,
        or `timeout` passed."""
        if self._task is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            await asyncio.wait([idle, self._task], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
        await self.marks.drained(max(0.0, deadline - asyncio.get_running_loop().time()))

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.marks.cancel()

    async def _run(self) -> None:
        while True:
            outputs = self.batcher.take()
            if not outputs:
                self._idle.set()
                self._kick.clear()
                await self._kick.wait()
                continue
            try:
                await self._round(outputs)
            except asyncio.CancelledError:  # the session's end, past its grace: unacked input comes back
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure ends the session; the broker redelivers
                self.session.fail(exc, "output")
                self._idle.set()
                return
            finally:
                self.messages -= sum(output.messages for output in outputs)
                self.batcher.done()
            self.on_round()

    async def _round(self, outputs: Sequence[CycleOutput]) -> None:
        session = self.session
        alerting = [output for output in outputs if output.alert_ids]
        entries = [output.entry for output in alerting if output.entry]
        bodies = [body for output in alerting for body in output.bodies]
        sends: list[Awaitable[None]] = [dead_letter(session.out, body, reason, TRADE_DATA)
                                        for output in outputs for body, reason, _ in output.rejects]
        if alerting:
            sends.append(session.publish(entries, [a for output in alerting for a in output.alert_ids], bodies))
        sends += [hand_over(session.out, output.handovers) for output in outputs if output.handovers]
        if sends:
            await asyncio.gather(*sends)
        for output in outputs:
            for _, reason, key in output.rejects:
                held = session.worker.throttle.allow(key)
                if held is not None:
                    log.warning("dead-lettered", reason=reason, held_back=held)
        last_tag = max(output.last_tag for output in outputs)
        if last_tag:
            await session.inbound.basic_ack(last_tag, multiple=True)
        if alerting:
            self.marks.put(entries, bodies)
            BATCH_EVENTS.labels(stage="alert").observe(len(bodies))
            for output in alerting:
                for kind in set(output.kinds):
                    ALERTS_FIRED.labels(kind=kind).inc(output.kinds.count(kind))
                self._alert_latency(output)
            log.debug("alerts published", count=len(bodies), first=alerting[0].alert_ids[:5])

    def _alert_latency(self, output: CycleOutput) -> None:
        if not output.oldest_published_ms:
            return
        latency = max(0.0, time.time() * 1000 - output.oldest_published_ms)
        PROCESSING_LATENCY.labels(stage="alert").observe(latency / 1000)
        samples = self.session.worker.samples
        if samples.enabled:
            for _ in output.alert_ids:
                samples.add(ALERT, latency)


class SentMarks:
    """Outbox entries whose alerts the broker confirmed, marked sent in Redis beside the rounds:
    one call in flight, the entries confirmed meanwhile marked together in the next. A failed
    mark ends the session, as a failed round does."""

    def __init__(self, session: Session, max_rounds: int) -> None:
        self.session = session
        self.batcher: NaturalBatcher[tuple[list[str], list[bytes]]] = NaturalBatcher(max_rounds)
        self._task: asyncio.Task[None] | None = None

    def put(self, entries: list[str], bodies: list[bytes]) -> None:
        self.batcher.add((entries, bodies))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while marks := self.batcher.take():
            try:
                await self.session.store.mark_sent([e for entries, _ in marks for e in entries],
                                                   [b for _, bodies in marks for b in bodies])
            except Exception as exc:  # noqa: BLE001 - Redis gone: the session ends; the witnesses settle these
                self.session.fail(exc, "output")
                return
            finally:
                self.batcher.done()

    async def drained(self, timeout: float) -> None:
        """Until every entry put is marked (or a mark failed), or `timeout` passed."""
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
