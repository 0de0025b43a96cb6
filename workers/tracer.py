"""The firehose recorder: keeps RabbitMQ's trace on and writes what the audit needs to disk.

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
import base64
import contextlib
import gzip
import json
import os
import socket
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import aio_pika.abc
import httpx

from aldebaran.errors import UnavailableError
from aldebaran.io.amqp import connect
from aldebaran.log import get_logger
from aldebaran.settings import Settings
from workers.runtime import Lifecycle

log = get_logger("tracer")

TRACE_EXCHANGE = "amq.rabbitmq.trace"
QUEUE = "aldebaran.tracer"
BINDINGS = ("publish.Aldebaran.Trade_Data", "publish.Aldebaran.Alert", "deliver.Aldebaran.Channel.#")
STATE_DIR = "_state"


def now_ms() -> int:
    return int(time.time() * 1000)


def partition_dir(root: Path, ts_ms: int) -> Path:
    """`root/date=YYYY-MM-DD/hour=HH`: the audit prunes whole hours by path."""
    moment = datetime.fromtimestamp(ts_ms / 1000, tz=UTC)
    return root / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"


def _plain(value: Any) -> Any:
    """Firehose headers hold bytes, datetimes and nested tables; make them JSON."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def trace_record(routing_key: str, headers: dict[str, Any], body: bytes, ts_ms: int,
                 recorder: str, trace_redelivered: bool = False) -> dict[str, Any]:
    """One firehose message as one JSON-able record (the wire format the audit reads)."""
    plain = _plain(headers or {})
    kind, _, name = routing_key.partition(".")
    props = plain.get("properties") or {}
    return {
        "kind": kind,  # publish | deliver
        "ts": ts_ms,
        "exchange": plain.get("exchange_name", name if kind == "publish" else None),
        "queue": name if kind == "deliver" else None,
        "routing_keys": plain.get("routing_keys") or [],
        "redelivered": bool(plain.get("redelivered", 0)),
        "content_type": props.get("content_type"),
        "message_id": props.get("message_id"),
        "node": plain.get("node"), "vhost": plain.get("vhost"),  # the deployment: audited on its own
        "headers": plain,
        "body_b64": base64.b64encode(body).decode("ascii"),
        "recorder": recorder,
        "trace_redelivered": trace_redelivered,  # written before, not acked before a crash
    }


@dataclass
class PartWriter:
    """Appends gzip members to hourly part files; one member per flushed batch."""

    root: Path
    recorder: str
    max_part_bytes: int = 256 * 1024 * 1024
    _counter: int = 0
    _current: dict[Path, Path] = field(default_factory=dict)

    def write(self, records: list[dict[str, Any]]) -> None:
        groups: dict[Path, list[str]] = {}
        for record in records:
            ts = record.get("ts") or record.get("end") or now_ms()
            groups.setdefault(partition_dir(self.root, ts), []).append(
                json.dumps(record, separators=(",", ":"), default=str))
        for directory, lines in groups.items():
            path = self._part(directory)
            member = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=5)
            with open(path, "ab") as fh:
                fh.write(member)
                fh.flush()
                os.fsync(fh.fileno())

    def _part(self, directory: Path) -> Path:
        path = self._current.get(directory)
        if path is None or (path.exists() and path.stat().st_size >= self.max_part_bytes):
            directory.mkdir(parents=True, exist_ok=True)
            self._counter += 1
            path = directory / f"part-{self.recorder}-{self._counter:05d}.jsonl.gz"
            self._current[directory] = path
        return path


def complete_length(path: Path, chunk: int = 1 << 20) -> int:
    """How many leading bytes of a part file are whole gzip members.

    A recorder killed in the middle of `write` leaves a torn last member (the kernel
    stops a large write at a page boundary on SIGKILL); everything after the last whole
    member is that tail. Streams the file one chunk at a time (nothing inflated is kept).
    """
    good = 0      # end offset of the last whole member
    offset = 0    # offset of the first byte of `pending`
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    with open(path, "rb") as fh:
        while True:
            if not pending:
                pending = fh.read(chunk)
                if not pending:
                    return good
            try:
                inflater.decompress(pending)
            except zlib.error:
                return good
            if inflater.eof:
                offset += len(pending) - len(inflater.unused_data)
                good = offset
                pending = inflater.unused_data
                inflater = zlib.decompressobj(wbits=31)
            else:
                offset += len(pending)
                pending = b""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def repair_torn_parts(root: Path, hostname: str, own_pid: int, since_s: float) -> list[tuple[Path, int, int]]:
    """Truncate the torn tail of part files left by dead recorders of this host.

    Only files named for a recorder of `hostname` whose process is gone (or is this very
    pid, reused: a container's PID 1) and modified since `since_s` are touched: a live
    recorder, here or on another host, may be in the middle of a write. The torn records
    were never acked (acks follow the fsync), so the broker delivers them again and this
    recorder writes them anew; the torn bytes are kept under `_state/torn/` for forensics.
    Without this, the next gzip member appended to such a file (the same recorder name
    after a PID reuse) would be unreadable, and so would every reader's view of the file.
    Returns (path, bytes kept, bytes cut) per repaired file.
    """
    repaired = []
    for path in sorted(root.glob("date=*/hour=*/part-*.jsonl.gz")):
        stem = path.name[len("part-"):-len(".jsonl.gz")]
        recorder, _, _counter = stem.rpartition("-")
        host, _, pid_text = recorder.rpartition("-")
        if host != hostname or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        try:
            stat = path.stat()
        except OSError:
            continue
        if stat.st_mtime < since_s or (pid != own_pid and _pid_alive(pid)):
            continue
        good = complete_length(path)
        if good >= stat.st_size:
            continue
        torn_dir = root / STATE_DIR / "torn"
        torn_dir.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b") as fh:
            fh.seek(good)
            (torn_dir / f"{path.parent.parent.name}-{path.parent.name}-{path.name}.{good}").write_bytes(fh.read())
            fh.truncate(good)
            fh.flush()
            os.fsync(fh.fileno())
        repaired.append((path, good, stat.st_size - good))
    return repaired


class Firehose:
    """Turns the firehose on for one vhost: management API first, `rabbitmqctl` as fallback.

    The HTTP API works from any host with the management URL; `rabbitmqctl trace_on`
    only where the CLI can reach the node (same host, same Erlang cookie).
    """

    def __init__(self, management_url: str, vhost: str) -> None:
        parts = urlsplit(management_url)
        self.base = urlunsplit((parts.scheme, f"{parts.hostname}:{parts.port or 15672}",
                                parts.path.rstrip("/"), "", ""))
        self.auth = (unquote(parts.username or "guest"), unquote(parts.password or "guest"))
        self.vhost = vhost

    async def is_on(self) -> bool | None:
        try:
            async with httpx.AsyncClient(base_url=self.base, auth=self.auth, timeout=10) as http:
                response = await http.get(f"/api/vhosts/{quote(self.vhost, safe='')}")
                response.raise_for_status()
                return bool(response.json().get("tracing"))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("cannot read the firehose state", vhost=self.vhost, error=str(exc))
            return None

    async def turn_on(self) -> bool:
        try:
            async with httpx.AsyncClient(base_url=self.base, auth=self.auth, timeout=10) as http:
                url = f"/api/vhosts/{quote(self.vhost, safe='')}"
                current = (await http.get(url)).json()
                body = {"tracing": True, "description": current.get("description", ""),
                        "tags": ",".join(current.get("tags") or [])}
                (await http.put(url, json=body)).raise_for_status()
                log.info("firehose turned on", vhost=self.vhost, via="management API")
                return True
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("management API could not turn the firehose on", vhost=self.vhost, error=str(exc))
        proc = await asyncio.create_subprocess_exec(
            "rabbitmqctl", "trace_on", "-p", self.vhost,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        if proc.returncode == 0:
            log.info("firehose turned on", vhost=self.vhost, via="rabbitmqctl")
            return True
        log.error("cannot turn the firehose on", vhost=self.vhost, output=out.decode(errors="replace")[-300:])
        return False


def vhost_of(amqp_url: str) -> str:
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


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
            self._extra.append({"kind": "heartbeat", "ts": now_ms(), "interval": self.heartbeat_seconds,
                                "recorder": self.recorder, "vhost": self.firehose.vhost, "event": "start"})
            await self.flush()
            life.ready()
            log.info("recording", dir=str(self.root), bindings=list(self.bindings), backlog=backlog)
            await self._loop(life)
        finally:
            self._extra.append({"kind": "heartbeat", "ts": now_ms(), "interval": self.heartbeat_seconds,
                                "recorder": self.recorder, "vhost": self.firehose.vhost, "event": "stop"})
            try:
                await self.flush()
            finally:
                await connection.close()
            log.info("stopped recording", recorded=self.recorded)

    async def _loop(self, life: Lifecycle) -> None:
        next_beat = time.monotonic() + self.heartbeat_seconds
        next_check = time.monotonic() + self.check_seconds
        while not life.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(life.stopping.wait(), timeout=self.linger_seconds)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + self.check_seconds
                await self._ensure_on()
            if now >= next_beat:
                next_beat = now + self.heartbeat_seconds
                self._extra.append({"kind": "heartbeat", "ts": now_ms(), "interval": self.heartbeat_seconds,
                                    "recorder": self.recorder, "vhost": self.firehose.vhost})
            if self._catching_up == 0 and self._gap_start is not None:
                self._gap(self._gap_start, now_ms(), "backlog drained after restart")
                self._gap_start = None
                # Saved with the gap: a recorder killed before its next regular heartbeat
                # hands its successor this moment, not the start of the closed outage.
                self._extra.append({"kind": "heartbeat", "ts": now_ms(), "interval": self.heartbeat_seconds,
                                    "recorder": self.recorder, "vhost": self.firehose.vhost, "event": "caught up"})
            await self.flush()

    async def _ensure_on(self) -> bool:
        state = await self.firehose.is_on()
        if state:
            return True
        if state is False:
            # Off while we were consuming: a broker restart. Nothing was traced since.
            last = self._last_heartbeat()
            if last is not None:
                self._gap(last, now_ms(), "firehose was off")
        return await self.firehose.turn_on()

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


def build(settings: Settings, **options: Any) -> Tracer:
    """The recorder worker for `aldebaran run tracer` and `aldebaran up`."""
    return Tracer(settings, **options)


# --- `python -m workers.tracer bench`: what tracing costs the pipeline's broker -----------

def _bench_recorder(settings: Settings, bindings: tuple[str, ...], stop: Any, ready: Any) -> None:
    """Runs in a child process so the recorder does not share the publisher's CPU."""
    async def main() -> None:
        life = Lifecycle()
        tracer = Tracer(settings, bindings=bindings, heartbeat_seconds=5)
        task = asyncio.create_task(tracer.run(life))
        await life._ready.wait()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        life.stopping.set()
        await task
    asyncio.run(main())


async def _pipeline_rate(url: str, events: int) -> float:
    """Trade events/s through a pipeline-shaped flow: publish to Aldebaran.Trade_Data, an
    aggregator-like consumer republishes each to a book queue (default exchange), a book-like
    consumer drains it. Two publishes and two deliveries per event; the audit traces one."""
    connection = await aio_pika.connect(url)
    async with connection:
        pub = await connection.channel(publisher_confirms=True)
        agg = await connection.channel()
        book = await connection.channel()
        await agg.set_qos(prefetch_count=500)
        await book.set_qos(prefetch_count=500)
        trades = await pub.get_exchange("Aldebaran.Trade_Data")
        ingress = await agg.get_queue("Aldebaran.Trade_Data")
        books_q = await book.declare_queue("book-bench", durable=False, auto_delete=True)
        done = asyncio.Event()
        seen = 0

        async def route(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await agg.default_exchange.publish(aio_pika.Message(message.body), routing_key="book-bench")
            await message.ack()

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal seen
            await message.ack()
            seen += 1
            if seen >= events:
                done.set()
        await ingress.consume(route)
        await books_q.consume(take)
        body = json.dumps({"id": "1", "initial_order_id": "9", "#shares": 10, "client": "c", "stock": "s"}).encode()
        started = time.perf_counter()
        window = 500
        for start in range(0, events, window):
            await asyncio.gather(*(trades.publish(aio_pika.Message(body), routing_key="Aldebaran.Trade_Data")
                                   for _ in range(min(window, events - start))))
        await asyncio.wait_for(done.wait(), 600)
        return events / (time.perf_counter() - started)


def bench(events: int = 20_000, rounds: int = 3) -> dict[str, float]:
    """Median events/s per mode: firehose off, on with nothing bound, on with the audit's
    bindings recorded, on with `#` recorded. Modes are interleaved round by round so a
    machine whose load changes (shared CI) biases none of them."""
    import multiprocessing
    import statistics
    import tempfile
    import uuid

    from aldebaran.settings import load_settings
    from declare.declarer import declare

    base = load_settings()
    firehose = Firehose(base.management_url, "/")
    parts = urlsplit(base.amqp_url)
    ctx = multiprocessing.get_context("spawn")
    modes = ("off", "on, nothing bound", "on, audit bindings recorded", "on, '#' recorded")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for round_no in range(rounds):
        for mode in modes:
            vhost = f"tracebench-{uuid.uuid4().hex[:8]}"
            url = urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))
            with httpx.Client(base_url=firehose.base, auth=firehose.auth, timeout=30) as http:
                http.put(f"/api/vhosts/{quote(vhost, safe='')}").raise_for_status()
                http.put(f"/api/permissions/{quote(vhost, safe='')}/{quote(parts.username or 'guest')}",
                         json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    settings = base.model_copy(update={"amqp_url": url, "amqp_urls": [], "traces_dir": tmp})
                    declare(settings, echo=lambda _: None)
                    stop, ready, child = ctx.Event(), ctx.Event(), None
                    if mode == "on, nothing bound":
                        asyncio.run(Firehose(base.management_url, vhost).turn_on())
                    elif mode != "off":
                        bindings = BINDINGS if "audit" in mode else ("#",)
                        child = ctx.Process(target=_bench_recorder, args=(settings, bindings, stop, ready))
                        child.start()
                        ready.wait(60)
                    rate = asyncio.run(_pipeline_rate(url, events))
                    rates[mode].append(rate)
                    if child is not None:
                        stop.set()
                        child.join(60)
                    print(f"round {round_no + 1} {mode:30s} {rate:8.0f} events/s", flush=True)
            finally:
                with httpx.Client(base_url=firehose.base, auth=firehose.auth, timeout=30) as http:
                    http.delete(f"/api/vhosts/{quote(vhost, safe='')}")
    medians = {m: statistics.median(r) for m, r in rates.items()}
    for mode, rate in medians.items():
        print(f"median {mode:30s} {rate:8.0f} events/s ({rate / medians['off']:.2f}x of off)", flush=True)
    return medians


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Measure what the firehose costs the pipeline.")
    parser.add_argument("command", choices=["bench"])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench(args.events, args.rounds)
