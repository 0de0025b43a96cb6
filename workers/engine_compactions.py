"""The engine's compactions, beside the cycles: one in flight at a time, never awaited by a cycle.

A compaction stores the done markers changed since the last one and trims the log records they
make redundant (`EngineStore.compact`, fenced). Awaited in the cycle loop, its round trip and
Redis's work on it stood the loop still every `compact_seconds` (docs/benchmarks.md,
2026-12-02). Now the loop takes the compaction's picture (the markers encoded at once, so
later cycles cannot change what is sent) and goes on while Redis stores it.

That is safe beside the commits: the trim counts records at the log's head, every one of
them committed before the picture was taken, while commits only append at its tail; a
retried commit and a retried compaction are told apart by operation keys of their own
(`last-op`, `compact-op`); and markers changed while a compaction is being stored stay to
be stored (`DoneMarkers.written`). A failed compaction (fenced, Redis gone) ends the session,
as it did in the loop. Right after each one, which proved this engine still the owner, the
alert witnesses whose alerts are all marked sent are trimmed.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from aldebaran.core.engine import Compaction, Engine
from aldebaran.io.alert_witness import read_witness_ids
from aldebaran.log import get_logger

if TYPE_CHECKING:
    from workers.engine_session import Session

log = get_logger("engine")


class Compactions:
    """Starts a compaction every `compact_seconds` unless one is still in flight."""

    def __init__(self, session: Session, every_seconds: float, now: float) -> None:
        self.session = session
        self.every_seconds = every_seconds
        self.last_start = now
        self.task: asyncio.Task[None] | None = None  # the compaction in flight
        self._request: Coroutine[Any, Any, None] | None = None  # what that task sends
        self.trimming: asyncio.Task[None] | None = None  # reading alert witnesses (one at a time)
        self.done = 0  # compactions stored this session (for tests and logs)

    def maybe_start(self, engine: Engine, now: float) -> None:
        """Take the compaction's picture and send it, when one is due and none is in flight."""
        if now - self.last_start < self.every_seconds or (self.task is not None and not self.task.done()):
            return
        self.last_start = now
        compaction = engine.compaction()
        request = self.session.store.compact(compaction)  # encoded now: the cycles go on changing the markers
        self._request = request
        self.task = asyncio.ensure_future(self._store(engine, compaction, request))

    async def _store(self, engine: Engine, compaction: Compaction, request: Coroutine[Any, Any, None]) -> None:
        try:
            await request
        except Exception as exc:  # noqa: BLE001 - fenced or Redis gone: the session ends, as in the loop
            self.session.fail(exc, "compaction")
            return
        engine.compacted(compaction)
        self.done += 1
        if self.trimming is None or self.trimming.done():
            self.trimming = asyncio.ensure_future(self._trim_witnesses())

    async def _trim_witnesses(self) -> None:
        """Drop the witnesses whose alerts are all marked sent, up to the first with one still
        in flight (confirmed, not yet marked): that one and the rest go back to the queue."""
        session = self.session
        try:
            witnesses = await read_witness_ids(session.witness, session.witness_queue)
            if not witnesses:
                return
            pending = await session.store.pending_among([a for witness in witnesses for a in witness.ids])
            keep = next((i for i, w in enumerate(witnesses) if pending & w.ids), len(witnesses))
            if keep:
                await session.witness.basic_ack(witnesses[keep - 1].tag, multiple=True)
            if keep < len(witnesses):
                await session.witness.basic_nack(witnesses[-1].tag, multiple=True, requeue=True)
        except Exception as exc:  # noqa: BLE001 - the next compaction tries again; unacked ones come back
            log.warning("trimming alert witnesses failed", error=repr(exc))

    def cancel(self) -> None:
        """The session ends: a compaction cut short is harmless (the next owner recovers from
        what Redis holds, and a retried one trims once); unacked witnesses go back to the queue."""
        for task in (self.task, self.trimming):
            if task is not None:
                task.cancel()
        if self._request is not None and inspect.getcoroutinestate(self._request) == inspect.CORO_CREATED:
            self._request.close()  # cancelled before its task ran: never sent, and not to be warned of
