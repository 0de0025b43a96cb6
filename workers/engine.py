"""The engine: one process consumes the ingress, holds every book, and alerts through a batched bus.

A session (one broker connection, `workers/engine_session.py`) runs:
1. ownership: the Redis lease (`EngineStore.acquire`); a second engine waits as standby;
2. recovery: the done markers and the write-ahead log replayed into a fresh `Engine`,
   then every alert still pending in the outbox published again;
3. cycles (`aldebaran.core.engine`): the messages consumed since the last cycle, in one
   step, then ONE Redis call (lease, log record, alert dedup), then the alert batch and
   dead letters published on a confirm channel, then ONE multiple-ack of the cycle's
   messages once all of that is confirmed. Cycles batch naturally: they run back to back,
   so what arrives during one cycle's round trips forms the next.

An acked event is in the log; an alert is in the outbox before its events are acked and
confirmed on the bus before they are. A crash anywhere loses nothing: the broker
redelivers what was not acked and the next owner rebuilds the books (docs/engine.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import aio_pika.abc
from redis.exceptions import RedisError

from aldebaran.apps import load_rules
from aldebaran.core.engine import Cycle, Engine, RuleReject
from aldebaran.core.partitions import Partitioning
from aldebaran.core.rule import Alert, Rule
from aldebaran.io import amqp
from aldebaran.io import redis as redis_io
from aldebaran.io.alert_bus import AlertsRefused
from aldebaran.io.engine_store import EngineStore, Fenced, Outbox
from aldebaran.io.latency_samples import LatencySamples
from aldebaran.io.redis import Keys
from aldebaran.log import Throttle, get_logger
from aldebaran.metrics import (
    BOOK_EVENTS,
    BOOKS_OPEN,
    CONFLICTING_DUPLICATES,
    DONE_MARKERS,
    DONE_MARKERS_FORGOTTEN,
    EVENTS_CONSUMED,
    EVENTS_HANDED_OVER,
    RULE_ERRORS,
)
from aldebaran.settings import Settings
from workers.engine_cycle import alert_payloads
from workers.engine_session import Session
from workers.runtime import Lifecycle

log = get_logger("engine")
RECORD_CHUNK = 1000  # replayed alerts recorded per Redis call at recovery
CONFLICTS_REMEMBERED = 10_000  # event ids whose conflict was logged (later ones are only counted)


class EngineWorker:
    """The engine process: its Redis state, its books across sessions, its metrics and logs."""

    name = "engine"

    def __init__(self, settings: Settings, rules: Sequence[Rule[Any]]) -> None:
        self.settings = settings
        self.config = settings.engine
        self.rules = list(rules)
        self.keys = Keys(settings.redis_key_prefix)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.samples = LatencySamples(settings.engine.latency_samples_dir)
        self.engine: Engine | None = None
        self._late_logged = 0
        self.throttle = Throttle()
        self._conflicts_logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()  # bounded

    @property
    def partition(self) -> int | None:
        """The partition of the books this engine owns; None when one engine owns them all."""
        return self.config.partition if self.config.partitions > 1 else None

    def new_engine(self) -> Engine:
        partitioning = (Partitioning(self.rules, self.config.partition, self.config.partitions)
                        if self.partition is not None else None)
        return Engine(self.rules, self.settings.book_ttl_seconds, self.config.done_retention_seconds,
                      self.config.done_max_markers, self.settings.max_message_bytes, partitioning)

    async def run(self, life: Lifecycle) -> None:
        redis = await redis_io.connect(self.settings)
        lease_ms = int(self.config.lease_seconds * 1000)
        self.store = EngineStore(redis, self.keys, self.token, lease_ms, self.settings.alert_dedup_ttl_seconds,
                                 redis_io.Replicas.of(self.settings), self.partition)

        async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
            try:
                await Session(self, connection, ended, life).run()
            except (RedisError, Fenced) as exc:  # the broker session restarts; Redis may be back by then
                # Not repr(): redis-py's hides the message (`server:NotReplicated`).
                raise ConnectionError(f"engine state unavailable: {type(exc).__name__}: {exc}") from exc
            except AlertsRefused as exc:  # recovery's publish of pending alerts nacked: the next session tries again
                raise ConnectionError(f"pending alerts not confirmed: {exc}") from exc

        try:
            await amqp.run_sessions(self.settings, self.name, life.stopping, session)
        finally:
            self.samples.flush()
            with contextlib.suppress(Exception):  # Redis gone: the lease expires by itself
                await self.store.release()
            await redis.aclose()

    async def recover(self) -> tuple[Engine, Outbox]:
        """A fresh engine with the committed books replayed, and the alerts still pending (as
        loaded, with those the replay recorded): the session settles or publishes exactly these."""
        started = time.perf_counter()
        done, records, outbox = await self.store.load()
        await self.store.sync_replicas()  # what was loaded is on the replicas before anything is re-published
        engine = self.new_engine()
        now = datetime.now(UTC)
        if done is not None:
            engine.restore_done(done)
        replayed: list[Alert] = []
        for record in records:
            replayed += engine.replay(record, now)
        outbox.entries.update(await self._record_replayed(replayed))
        log.info("engine owns the books", apps=[rule.name for rule in self.rules], partition=self.partition,
                 partitions=self.config.partitions, books=engine.open_books,
                 done_markers=engine.done_markers, log_records=len(records), pending_alerts=len(outbox.alerts),
                 load_ms=round((time.perf_counter() - started) * 1000, 1))
        return engine, outbox

    async def _record_replayed(self, alerts: list[Alert]) -> dict[str, list[tuple[str, bytes]]]:
        """The replayed cycles' alerts that were never recorded (a crash after a cycle's record
        and before its alerts): recorded now, by outbox entry. The others answer "not new"."""
        ids, bodies = alert_payloads(alerts)
        entries: dict[str, list[tuple[str, bytes]]] = {}
        for start in range(0, len(ids), RECORD_CHUNK):
            part = slice(start, start + RECORD_CHUNK)
            committed = await self.store.commit(None, ids[part], bodies[part])
            if committed.entry is not None:
                pairs = zip(ids[part], bodies[part], strict=True)
                entries[committed.entry] = [pair for pair, new in zip(pairs, committed.fresh, strict=True) if new]
        if entries:
            log.warning("alerts of logged cycles were not recorded before the crash: recorded now",
                        count=sum(len(alerts) for alerts in entries.values()))
        return entries

    def count(self, cycle: Cycle) -> None:
        """Metrics once per cycle, never per event."""
        for kind, number in cycle.kinds.items():
            EVENTS_CONSUMED.labels(type=kind).inc(number)
        for outcome, number in (("applied", cycle.applied), ("duplicate", cycle.duplicate), ("late", cycle.late)):
            if number:
                BOOK_EVENTS.labels(outcome=outcome).inc(number)
        if cycle.handed_over:
            EVENTS_HANDED_OVER.inc(cycle.handed_over)
        self._late_logged += cycle.late

    def troubles(self, cycle: Cycle) -> None:
        """Conflicting repeats and rule errors: each counted, each kind logged once with a count."""
        if cycle.conflicts:
            CONFLICTING_DUPLICATES.inc(len(cycle.conflicts))
            for app, key, event_id in cycle.conflicts:
                # By book and id: a rule may give every book's opening event one id (trade_limits:
                # "" for the request), and one order's conflict must not silence every other's.
                if (app, key, event_id) in self._conflicts_logged:
                    continue  # said once already: later conflicts of this event are only counted
                self._conflicts_logged[(app, key, event_id)] = None
                if len(self._conflicts_logged) > CONFLICTS_REMEMBERED:
                    self._conflicts_logged.popitem(last=False)
                held = self.throttle.allow("conflicting duplicate")
                if held is not None:
                    log.warning("conflicting duplicate: same event id, other content; the first copy counts",
                                app=app, order_id=key[:200], event_id=event_id[:200] or "(the book's opening event)",
                                other_ids_not_logged=held)
        for _, reject in cycle.rejects:
            if isinstance(reject, RuleReject):
                RULE_ERRORS.labels(app=reject.app).inc(reject.failures)
        for failure in cycle.close_failures:
            RULE_ERRORS.labels(app=failure.app).inc()
            held = self.throttle.allow(f"close:{failure.app}:{failure.error[:80]}")
            if held is not None:
                log.error("application failed closing a book; the book is dropped", app=failure.app,
                          key=(failure.key or "")[:200], error=failure.error[:500], similar_not_logged=held)

    def report(self) -> None:
        engine = self.engine
        if engine is not None:
            BOOKS_OPEN.set(engine.open_books)
            DONE_MARKERS.set(engine.done_markers)
            forgotten = engine.take_forgotten()
            if forgotten:
                DONE_MARKERS_FORGOTTEN.inc(forgotten)
                log.warning("done markers forgotten before their retention: done_max_markers reached",
                            count=forgotten)
        if self._late_logged:
            log.info("late events: their book already closed", count=self._late_logged)
            self._late_logged = 0
        self.samples.flush()


def build(settings: Settings, **_: Any) -> EngineWorker:
    return EngineWorker(settings, load_rules(settings))
