"""The firehose recorder: keeps RabbitMQ's trace on and writes what the audit needs to disk.

The record format and the part files are `aldebaran/io/trace_files.py`, turning the
firehose on is `aldebaran/io/firehose.py`; this worker decides what to record and when.

Only the names the audit re-derives are bound (`publish.Aldebaran.Trade_Data`,
`publish.Aldebaran.Alert`, `deliver.Aldebaran.Channel.#`): tracing everything costs the
broker throughput. Records are JSON lines in gzip members, partitioned by UTC date and
hour, and a trace message is acked only after its batch is written and fsynced, so a
crash loses nothing the broker still holds.

RabbitMQ 3.10's firehose messages carry no timestamp, so `ts` is the recorder's receive
time (epoch milliseconds). When the recorder was not recording (a stop, a crash, a
backlog drained after a restart, the firehose found off) it writes a `gap` record; the
audit gives no verdict inside gaps instead of a false all-clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika.abc

from aldebaran.errors import UnavailableError
from aldebaran.io.amqp import connect
from aldebaran.io.firehose import TRACE_EXCHANGE, Firehose
from aldebaran.io.trace_files import STATE_DIR, PartWriter, now_ms, repair_torn_parts, trace_record
from aldebaran.log import get_logger
from aldebaran.ops.management import vhost_of
from aldebaran.settings import Settings
from workers.runtime import Lifecycle

log = get_logger("tracer")

QUEUE = "aldebaran.tracer"
BINDINGS = ("publish.Aldebaran.Trade_Data", "publish.Aldebaran.Alert", "deliver.Aldebaran.Channel.#")


class Tracer:
    """Records the firehose until stopped; see the module docstring for the file layout."""

    name = "tracer"

    def __init__(self, settings: Settings, *, heartbeat_seconds: float = 10.0,
                 check_seconds: float = 5.0, batch_max: int = 2000, linger_seconds: float = 0.5,
                 prefetch: int = 5000, bindings: tuple[str, ...] = BINDINGS) -> None:
        self.settings = settings
        self.root = Path(settings.traces_dir)
        self.recorder = f"{socket.gethostname()}-{os.getpid()}"
        self.writer = PartWriter(self.root, self.recorder)
        self.firehose = Firehose(settings.management_url, vhost_of(settings.broker_urls[0]))
        self.heartbeat_seconds = heartbeat_seconds
        self.check_seconds = check_seconds
        self.batch_max = batch_max
        self.linger_seconds = linger_seconds
        self.prefetch = prefetch
        self.bindings = bindings
        self._pending: list[tuple[dict[str, Any], aio_pika.abc.AbstractIncomingMessage]] = []
        self._extra: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._catching_up: int = 0
        self._gap_start: int | None = None
        self._on_at = time.monotonic()  # when a check last found the firehose on (or turned it on)
        self._on_at_ms: int | None = None
        self.recorded = 0

    # --- state: the last heartbeat survives restarts so the next start can mark the gap
    @property
    def _state_file(self) -> Path:
        return self.root / STATE_DIR / f"tracer-{quote(self.firehose.vhost, safe='')}.json"

    def _last_heartbeat(self) -> int | None:
        try:
            return int(json.loads(self._state_file.read_text())["last_heartbeat"])
        except (OSError, ValueError, KeyError):
            return None

    def _save_heartbeat(self, ts: int) -> None:
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"last_heartbeat": ts, "recorder": self.recorder}))
        tmp.replace(self._state_file)

    def _repair(self, last: int | None) -> None:
        """Cut torn tails a killed predecessor left: its last write happened after its last
        saved heartbeat (a write comes before the heartbeat it carries is saved)."""
        since_s = (last / 1000 if last is not None else time.time() - 3600) - 5
        try:
            repaired = repair_torn_parts(self.root, socket.gethostname(), os.getpid(), since_s)
        except OSError as exc:
            log.warning("cannot check part files for torn tails", error=str(exc))
            return
        for path, kept, cut in repaired:
            log.warning("torn tail truncated (a recorder died mid-write; its unacked records come back)",
                        path=str(path), kept_bytes=kept, cut_bytes=cut)

    def _beat(self, event: str | None = None) -> None:
        """A heartbeat record: periodic ones from the loop; `event` names the others."""
        beat = {"kind": "heartbeat", "ts": now_ms(), "interval": self.heartbeat_seconds,
                "recorder": self.recorder, "vhost": self.firehose.vhost}
        self._extra.append(beat if event is None else {**beat, "event": event})

    def _gap(self, start: int, end: int, reason: str) -> None:
        if end > start:
            log.warning("unrecorded window", start=start, end=end, reason=reason)
            self._extra.append({"kind": "gap", "ts": end, "start": start, "end": end, "reason": reason,
                                "recorder": self.recorder, "vhost": self.firehose.vhost})

    async def run(self, life: Lifecycle) -> None:
        started = now_ms()
        last = self._last_heartbeat()
        await asyncio.to_thread(self._repair, last)
        connection = await connect(self.settings, "tracer")
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            trace = await channel.get_exchange(TRACE_EXCHANGE, ensure=False)
            queue = await channel.declare_queue(QUEUE, durable=True)
            for key in self.bindings:
                await queue.bind(trace, routing_key=key)
            backlog = queue.declaration_result.message_count or 0
            if not await self._ensure_on():
                raise UnavailableError(f"cannot turn the firehose on for vhost {self.firehose.vhost!r} "
                                       "(management API and rabbitmqctl both failed)")
            # Until the backlog left by a stopped recorder is drained, receive times are
            # not event times: the gap runs from the last heartbeat to the catch-up.
            self._gap_start = last if last is not None else None
            self._catching_up = backlog
            if last is not None and backlog == 0:
                self._gap(last, started, "recorder not running")
                self._gap_start = None
            connection.reconnect_callbacks.add(self._on_reconnect)
            await queue.consume(self._on_message)
            self._beat("start")
            await self.flush()
            life.ready()
            log.info("recording", dir=str(self.root), bindings=list(self.bindings), backlog=backlog)
            await self._loop(life)
        finally:
            self._beat("stop")
            try:
                await self.flush()
            finally:
                await connection.close()
            log.info("stopped recording", recorded=self.recorded)

    async def _loop(self, life: Lifecycle) -> None:
        next_beat = time.monotonic() + self.heartbeat_seconds
        next_check = time.monotonic() + self.check_seconds
        # The check runs beside the loop: a slow management API must not hold back the
        # heartbeats, or the audit would see a silence where the recorder was recording.
        check: asyncio.Task[bool] | None = None
        try:
            while not life.stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(life.stopping.wait(), timeout=self.linger_seconds)
                now = time.monotonic()
                if now >= next_check and (check is None or check.done()):
                    next_check = now + self.check_seconds
                    check = asyncio.create_task(self._ensure_on())
                    check.add_done_callback(_log_failed_check)
                # A heartbeat says "recording": none while the firehose is not known to be on
                # (a check that hangs), so that such a stretch is a silence to the audit.
                if now >= next_beat and now - self._on_at <= 3 * self.check_seconds:
                    next_beat = now + self.heartbeat_seconds
                    self._beat()
                if self._catching_up == 0 and self._gap_start is not None:
                    self._gap(self._gap_start, now_ms(), "backlog drained after restart")
                    self._gap_start = None
                    # Saved with the gap: a recorder killed before its next regular heartbeat
                    # hands its successor this moment, not the start of the closed outage.
                    self._beat("caught up")
                await self.flush()
        finally:
            if check is not None:
                check.cancel()

    async def _ensure_on(self) -> bool:
        asked, asked_ms = time.monotonic(), now_ms()
        state = await self.firehose.is_on()
        if state:
            self._on_at, self._on_at_ms = asked, asked_ms
            return True
        # Off while we were consuming (a broker restart): nothing was traced from the last
        # check that found it on (before this process's first check, the last heartbeat)
        # until it is on again.
        last = None  # the API unreadable (`None`): not known to be off, no gap
        if state is False:
            last = self._on_at_ms if self._on_at_ms is not None else self._last_heartbeat()
        turned_at, turned_at_ms = time.monotonic(), now_ms()
        on = await self.firehose.turn_on()
        if on:
            self._on_at, self._on_at_ms = turned_at, turned_at_ms
        if last is not None:
            self._gap(last, now_ms(), "firehose was off")
        return on

    def _on_reconnect(self, *_: Any) -> None:
        last = self._last_heartbeat()
        if last is not None:
            self._gap_start = last if self._gap_start is None else self._gap_start
        log.warning("reconnected; marking the outage", since=last)

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        record = trace_record(message.routing_key or "", dict(message.headers or {}), message.body,
                              now_ms(), self.recorder, bool(message.redelivered))
        if self._catching_up:
            self._catching_up -= 1  # every message counted in the backlog, kept or not
        if record["kind"] == "publish" and not record["exchange"]:
            await message.ack()  # default-exchange publishes are not part of the audit
            return
        self._pending.append((record, message))
        if len(self._pending) >= self.batch_max:
            await self.flush()

    async def flush(self) -> None:
        """Write the batch, fsync, then ack it: acked means on disk."""
        async with self._lock:
            pending, self._pending = self._pending, []
            extra, self._extra = self._extra, []
            if not pending and not extra:
                return
            records = [r for r, _ in pending] + extra
            await asyncio.to_thread(self.writer.write, records)
            beats = [r["ts"] for r in extra if r["kind"] == "heartbeat"]
            # The saved heartbeat is where the next recorder's gap starts. While an outage is
            # still unmarked (backlog not drained yet), it must stay where the outage began:
            # a recorder killed again before writing its gap would otherwise hand its
            # successor a heartbeat from after the first outage, and that window would be
            # left unmarked (found by tests/faults/test_kill.py[tracer]).
            if beats and self._gap_start is None:
                self._save_heartbeat(max(beats))
            if pending:
                last = pending[-1][1]
                try:
                    await last.ack(multiple=True)
                except Exception as exc:  # noqa: BLE001 - channel gone: broker redelivers
                    log.warning("ack after flush failed; the broker will redeliver", error=str(exc))
                self.recorded += len(pending)


def _log_failed_check(task: asyncio.Task[bool]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("firehose check failed; retried at the next check", error=repr(task.exception()))


def build(settings: Settings, **options: Any) -> Tracer:
    """The recorder worker for `aldebaran run tracer` and `aldebaran up`."""
    return Tracer(settings, **options)
