"""The firehose recorder against the real broker: what it records, acks, and marks as gaps."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import aio_pika

from aldebaran.io.trace_files import partition_dir, trace_record
from aldebaran.settings import LogChannel, Settings
from declare.declarer import declare
from tests.support import services
from tests.support.waiting import eventually
from workers.runtime import Lifecycle
from workers.tracer import QUEUE, Tracer, build


def read_records(root: Path) -> list[dict]:
    """Every record the recorder wrote (gzip members concatenated per part file)."""
    records = []
    for part in sorted(root.glob("date=*/hour=*/*.jsonl.gz")):
        with gzip.open(part, "rt") as fh:
            records += [json.loads(line) for line in fh if line.strip()]
    return records


def tracing_on(vhost: services.Vhost) -> bool:
    with services._management() as http:
        return bool(http.get(f"/api/vhosts/{quote(vhost.name, safe='')}").json().get("tracing"))


def set_tracing(vhost: services.Vhost, on: bool) -> None:
    with services._management() as http:
        http.put(f"/api/vhosts/{quote(vhost.name, safe='')}", json={"tracing": on}).raise_for_status()


class Running:
    """A tracer running as an asyncio task, stopped the way the runtime stops it."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.life = Lifecycle()
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> Tracer:
        self.task = asyncio.create_task(self.tracer.run(self.life))
        await asyncio.wait_for(self.life._ready.wait(), 20)
        return self.tracer

    async def __aexit__(self, *exc: object) -> None:
        self.life.stopping.set()
        await asyncio.wait_for(self.task, 20)


# A part file read while the recorder appends a member: its tail is not complete yet.
HALF_WRITTEN = (EOFError, OSError, zlib.error, ValueError)


async def wait_recorded(tracer: Tracer, count: int, timeout: float = 15) -> None:
    await eventually(lambda: tracer.recorded >= count, lambda: f"{count} records written, {tracer.recorded} so far",
                     timeout)


async def wait_written(root: Path, found: Callable[[list[dict]], object], what: str) -> list[dict]:
    """Until the records on disk show `what` (`found` of them is truthy); returns them."""
    records: list[dict] = []

    def probe() -> object:
        records[:] = read_records(root)
        return found(records)

    await eventually(probe, f"{what} on disk", ignoring=HALF_WRITTEN)
    return records


def periodic_beats(records: list[dict]) -> list[dict]:
    """The recorder's heartbeats from its loop (start, stop and catch-up beats name an event)."""
    return [r for r in records if r["kind"] == "heartbeat" and "event" not in r]


async def wait_covered_past_last_record(tracer: Tracer, past_ms: int) -> None:
    """Until a periodic heartbeat of `tracer` lies `past_ms` after the last publish or delivery
    it traced: the recording covers the stream's end, so the audit can judge the last alerts."""
    def covered(records: list[dict]) -> bool:
        mine = [r for r in records if r.get("recorder") == tracer.recorder]
        last = max((r["ts"] for r in mine if r["kind"] in ("publish", "deliver")), default=None)
        return last is not None and any(r["ts"] >= last + past_ms for r in periodic_beats(mine))

    await wait_written(tracer.root, covered, f"a heartbeat {past_ms} ms after the last traced record")


def with_channels(settings: Settings, *names: str) -> Settings:
    return settings.model_copy(update={"channels": [LogChannel(name=n, kind="log") for n in names]})


def test_trace_record_keeps_what_the_audit_needs() -> None:
    headers = {"exchange_name": b"Aldebaran.Alert", "routing_keys": [b"Aldebaran.Alert"],
               "properties": {"message_id": b"over_purchase:1", "content_type": b"application/json"},
               "node": b"rabbit@x", "routed_queues": [b"Aldebaran.Alert"]}
    record = trace_record("publish.Aldebaran.Alert", headers, b'{"k": 1}', 1_700_000_000_123, "h-1")
    assert record["kind"] == "publish" and record["exchange"] == "Aldebaran.Alert"
    assert record["message_id"] == "over_purchase:1" and record["content_type"] == "application/json"
    assert base64.b64decode(record["body_b64"]) == b'{"k": 1}'
    assert record["headers"]["routed_queues"] == ["Aldebaran.Alert"]
    deliver = trace_record("deliver.Aldebaran.Channel.ops", {"exchange_name": b"", "redelivered": 1}, b"x", 1, "h")
    assert deliver["queue"] == "Aldebaran.Channel.ops" and deliver["redelivered"] is True
    assert partition_dir(Path("/t"), 1_700_000_000_123) == Path("/t/date=2023-11-14/hour=22")


async def test_records_trade_data_alerts_and_channel_deliveries(settings: Settings, vhost: services.Vhost) -> None:
    settings = with_channels(settings, "ops")
    declare(settings, echo=lambda _: None)
    assert not tracing_on(vhost)
    tracer = build(settings, heartbeat_seconds=0.5, linger_seconds=0.1)
    async with Running(tracer):
        assert tracing_on(vhost), "the recorder turns the firehose on"
        connection = await aio_pika.connect(vhost.amqp_url)
        async with connection:
            channel = await connection.channel()
            trades = await channel.get_exchange("Aldebaran.Trade_Data")
            alerts = await channel.get_exchange("Aldebaran.Alert")
            await trades.publish(aio_pika.Message(b"id:1\n# shares: 100\nclient: S\nstock: AAPL"),
                                 routing_key="Aldebaran.Trade_Data")
            await alerts.publish(aio_pika.Message(b'{"alert_id": "over_purchase:1"}', message_id="over_purchase:1",
                                                  content_type="application/json"), routing_key="Aldebaran.Alert")
            # The fan-out to a channel goes through the default exchange: not traced as a publish,
            # but the channel's delivery is.
            await channel.default_exchange.publish(aio_pika.Message(b"a", message_id="over_purchase:1"),
                                                   routing_key="Aldebaran.Channel.ops")
            await channel.default_exchange.publish(aio_pika.Message(b"noise"), routing_key="Aldebaran.Dead_Letter")
            queue = await channel.get_queue("Aldebaran.Channel.ops")
            message = await queue.get(timeout=5)
            await message.ack()
            await wait_recorded(tracer, 3)
            await wait_written(Path(settings.traces_dir), periodic_beats, "a heartbeat from the recorder's loop")
    records = read_records(Path(settings.traces_dir))
    traced = [r for r in records if r["kind"] in ("publish", "deliver")]
    assert [(r["kind"], r["exchange"] or r["queue"]) for r in traced] == [
        ("publish", "Aldebaran.Trade_Data"), ("publish", "Aldebaran.Alert"), ("deliver", "Aldebaran.Channel.ops")]
    assert base64.b64decode(traced[0]["body_b64"]).startswith(b"id:1\n")
    assert traced[1]["message_id"] == "over_purchase:1" and traced[2]["message_id"] == "over_purchase:1"
    assert traced[2]["redelivered"] is False
    assert all(isinstance(r["ts"], int) for r in traced)
    beats = [r for r in records if r["kind"] == "heartbeat"]
    assert [r.get("event") for r in beats if r.get("event")] == ["start", "stop"]
    assert periodic_beats(records), "heartbeats while recording, not only at start and stop"
    assert not [r for r in records if r["kind"] == "gap"], "first start: nothing to mark"
    connection = await aio_pika.connect(vhost.amqp_url)
    async with connection:
        left = await (await connection.channel()).declare_queue(QUEUE, passive=True)
        assert left.declaration_result.message_count == 0, "everything written was acked"


async def test_restart_marks_the_outage_and_the_drained_backlog_as_a_gap(settings: Settings,
                                                                        vhost: services.Vhost) -> None:
    declare(settings, echo=lambda _: None)
    async with Running(build(settings, heartbeat_seconds=0.5, linger_seconds=0.1)):
        await wait_written(Path(settings.traces_dir), lambda rs: [r for r in rs if r.get("event") == "start"],
                           "the first recorder's start heartbeat")
    # While no recorder runs, the firehose stays on and its durable queue keeps the trace.
    connection = await aio_pika.connect(vhost.amqp_url)
    async with connection:
        channel = await connection.channel()
        trades = await channel.get_exchange("Aldebaran.Trade_Data")
        for i in range(5):
            await trades.publish(aio_pika.Message(f'{{"id": {i}}}'.encode()), routing_key="Aldebaran.Trade_Data")

        async def held() -> bool:
            return (await channel.declare_queue(QUEUE, passive=True)).declaration_result.message_count >= 5

        await eventually(held, "the 5 traces held in the recorder's queue")
    tracer = build(settings, heartbeat_seconds=0.5, linger_seconds=0.1)
    async with Running(tracer):
        await wait_recorded(tracer, 5)
        await wait_written(Path(settings.traces_dir), lambda rs: [r for r in rs if r["kind"] == "gap"],
                           "the gap marker for the drained backlog")
    records = read_records(Path(settings.traces_dir))
    gaps = [r for r in records if r["kind"] == "gap"]
    assert len(gaps) == 1, gaps
    first_stop = max(r["ts"] for r in records if r.get("event") == "stop" and r["ts"] < gaps[0]["end"])
    backlog = [r for r in records if r["kind"] == "publish"]
    assert len(backlog) == 5
    assert gaps[0]["start"] <= first_stop + 1 and gaps[0]["end"] >= max(r["ts"] for r in backlog), \
        "the backlog's receive times are not event times: they lie inside the gap"


async def test_firehose_found_off_is_turned_back_on_and_marked(settings: Settings, vhost: services.Vhost) -> None:
    declare(settings, echo=lambda _: None)
    tracer = build(settings, heartbeat_seconds=0.3, check_seconds=0.3, linger_seconds=0.1)
    root = Path(settings.traces_dir)
    async with Running(tracer):
        await wait_written(root, periodic_beats, "a heartbeat from the recorder's loop")
        set_tracing(vhost, False)  # what a broker restart does
        await eventually(lambda: tracing_on(vhost), "the recorder to turn the firehose back on")
        await wait_written(root, lambda rs: [r for r in rs if r["kind"] == "gap"], "the gap marker")
    gaps = [r for r in read_records(Path(settings.traces_dir)) if r["kind"] == "gap"]
    assert [g["reason"] for g in gaps] == ["firehose was off"]
    assert gaps[0]["end"] > gaps[0]["start"]


async def test_a_slow_firehose_check_does_not_hold_back_the_heartbeats_a_hung_one_stops_them(
        settings: Settings, vhost: services.Vhost) -> None:
    """The management API stops answering: the recorder goes on beating while the firehose was
    found on lately (a pause there would be a silence while it was recording), then stops, so
    that the audit sees a silence where nobody knows whether it recorded; an answer resumes them."""
    declare(settings, echo=lambda _: None)
    tracer = build(settings, heartbeat_seconds=0.2, check_seconds=1.0, linger_seconds=0.05)
    hung, answer = asyncio.Event(), asyncio.Event()
    hung_at: list[float] = []

    async def answers_late() -> bool:
        hung_at.append(time.time() * 1000)
        hung.set()
        await answer.wait()
        return True

    root = Path(settings.traces_dir)
    beats_after = lambda t: lambda rs: [r for r in periodic_beats(rs) if r["ts"] > t]  # noqa: E731
    async with Running(tracer):
        tracer.firehose.is_on = answers_late  # type: ignore[method-assign]
        await asyncio.wait_for(hung.wait(), 10)
        await wait_written(root, lambda rs: len(beats_after(hung_at[0])(rs)) >= 3, "heartbeats while the check hangs")
        await wait_written(root, lambda rs: time.time() * 1000 - max(r["ts"] for r in periodic_beats(rs)) > 1500,
                           "no heartbeat for 1.5 s once the firehose was not confirmed for 3 checks")
        answer.set()
        released = time.time() * 1000
        await wait_written(root, beats_after(released), "heartbeats again once the check answers")


def test_turn_on_uses_the_management_api(vhost: services.Vhost) -> None:
    from aldebaran.io.firehose import Firehose

    firehose = Firehose(services.MANAGEMENT_URL, vhost.name)
    assert asyncio.run(firehose.is_on()) is False
    assert asyncio.run(firehose.turn_on()) is True
    assert tracing_on(vhost)
