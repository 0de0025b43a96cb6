"""The audit on hostile traces: junk bytes, two deployments in one directory, alert batches.

Recordings are made by the real recorder on the real broker (two vhosts, two recorders,
one traces directory); the duplicate tests inject records into hand-made traces. The
SparkSession is the shared `spark` fixture (conftest).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from contextlib import AsyncExitStack
from pathlib import Path

import aio_pika
import pytest

from aldebaran.io.trace_files import PartWriter
from aldebaran.settings import LogChannel, Settings
from declare.declarer import declare
from spark_analytics.job import run
from spark_analytics.options import AuditOptions
from tests.support import services
from tests.test_audit import T0, alert, b64, delivery, heartbeats, known_stream, trade, write_traces
from tests.test_tracer import Running, read_records, wait_covered_past_last_record, wait_recorded
from workers.tracer import build

pytestmark = pytest.mark.spark

TTL = 2.0
GARBAGE = random.Random(21).randbytes(10 * 1024)  # a 10 kB body of random bytes
JUNK = [  # (step, body, content type, headers): what a hostile publisher sends; the pipeline dead-letters it
    ("trade", b"\xff\xfe\x00id:\xc3\x28 not UTF-8", "text/plain", None),
    ("trade", b'{"id": "90", "#shares": 5, "client": "S"', "application/json", None),  # truncated JSON
    ("trade", GARBAGE, "application/octet-stream", None),
    ("trade", b'{"id": "91", "#shares": 5, "client": "S", "stock": "X"}', "application/json",
     {"x-junk": bytearray(b"\xff\xfe not UTF-8")}),  # a valid request (alone: no alert) under a non-UTF-8 header
]


def audit(spark, root: Path, out: Path, **options) -> tuple[int, dict, list[tuple[str, str, str, str | None]]]:
    knobs = {"book_ttl_s": TTL, "grace_s": 0.5, "late_after_s": 30, "ttl_tolerance_s": 0.2, **options}
    opts = AuditOptions(traces_dir=str(root), **knobs)
    code, info = run(opts, None, str(out), spark=spark)
    found = [(r["vhost"], r["finding"], r["alert_id"], r["channel"])
             for r in spark.read.parquet(str(out / "findings.parquet")).collect()]
    return code, info, sorted(found, key=str)


async def record(settings: Settings, steps: list[tuple], name: str, starting: asyncio.Lock | None = None) -> int:
    """Publish `steps` into the settings' vhost with a recorder of its own; returns records.

    Recorders share `starting` while they turn their firehose on: RabbitMQ keeps the traced
    vhosts in one node-wide list, and two `trace_on`s at the same moment can leave one vhost
    off (the recorder then marks a gap and turns it on again, 5 s later: after the steps)."""
    settings = settings.model_copy(update={"channels": [LogChannel(name="ops", kind="log")]})
    declare(settings, echo=lambda _: None)
    tracer = build(settings, heartbeat_seconds=0.5, linger_seconds=0.05)
    tracer.recorder = f"test{name}-1"  # two recorders in one process: their own part files
    tracer.writer = PartWriter(tracer.root, tracer.recorder)
    recorded = 0
    async with AsyncExitStack() as stack:
        async with starting or asyncio.Lock():
            await stack.enter_async_context(Running(tracer))
        connection = await aio_pika.connect(tracer.settings.amqp_url)
        async with connection:
            channel = await connection.channel()
            trades = await channel.get_exchange("Aldebaran.Trade_Data")
            alerts = await channel.get_exchange("Aldebaran.Alert")
            for step, body, ctype, *headers in steps:
                if step == "sleep":
                    await asyncio.sleep(TTL + 0.3)
                    continue
                if step == "trade":
                    await trades.publish(aio_pika.Message(body, content_type=ctype, headers=(headers or [None])[0]),
                                         routing_key="Aldebaran.Trade_Data")
                else:
                    kind, _, order = body.decode().partition(":")
                    payload = json.dumps({"alert_id": body.decode(), "kind": kind, "order_id": order}).encode()
                    message = aio_pika.Message(payload, message_id=body.decode(), content_type="application/json")
                    await alerts.publish(message, routing_key="Aldebaran.Alert")
                    await channel.default_exchange.publish(aio_pika.Message(payload, message_id=body.decode()),
                                                           routing_key="Aldebaran.Channel.ops")
                    recorded += 1
                recorded += step == "trade"
                await asyncio.sleep(0.02)
            queue = await channel.get_queue("Aldebaran.Channel.ops")
            for _ in range(sum(1 for s in steps if s[0] == "alert")):
                await (await queue.get(timeout=5)).ack()
                recorded += 1
            await wait_recorded(tracer, recorded)
            await wait_covered_past_last_record(tracer, 1200)  # heartbeats after the last alert: the end is covered
    return recorded


def damage(root: Path) -> None:
    """What a disk and a killed recorder leave: a line that is not UTF-8, a half-written last
    line (testA's part), and a torn gzip tail (testB's part)."""
    part_a = next(root.glob("date=*/hour=*/part-testA-*.jsonl.gz"))
    part_b = next(root.glob("date=*/hour=*/part-testB-*.jsonl.gz"))
    with open(part_a, "ab") as fh:
        fh.write(gzip.compress(b'{"kind": "heartbeat", "ts": 1, "reason": "\xff\xfe"}\n'))
        fh.write(gzip.compress(b'{"kind": "publish", "ts": 1795000000000, "exchange": "Aldebaran.Al'))
    member = gzip.compress(b'{"kind": "note", "text": "a record the recorder never finished writing"}\n' * 200)
    with open(part_b, "ab") as fh:
        fh.write(member[: len(member) // 2])


async def test_junk_and_two_deployments_in_one_directory(settings: Settings, vhost: services.Vhost, spark,
                                                         tmp_path: Path) -> None:
    """Deployment A's stream carries junk; B's is the same stream without order 20. Both are
    judged on their own (the same alert ids in both are not duplicates), the junk is counted,
    the damaged files are read up to the damage. Then an alert of A copied into B's trace is
    spurious (order 20) or a duplicate (order 1) there, and A stays clean."""
    other = services.create_vhost()
    try:
        settings_b = settings.model_copy(update={"amqp_url": other.amqp_url})
        stream = [(*s, None) for s in known_stream()]
        steps_a = stream[:3] + JUNK + stream[3:]
        steps_b = stream[:8] + stream[12:]  # without order 20's three trades and its alert
        assert [s[1] for s in stream[8:12]][-1] == b"over_purchase:20"
        starting = asyncio.Lock()
        await asyncio.gather(record(settings, steps_a, "A", starting), record(settings_b, steps_b, "B", starting))
    finally:
        services.delete_vhost(other)
    root = Path(settings.traces_dir)
    recorded = read_records(root)
    damage(root)
    code, info, found = await asyncio.to_thread(audit, spark, root, tmp_path / "clean", channels=["ops"])
    assert (code, info["verdict"], found) == (0, "clean", [])
    a, b = info["deployments"][vhost.name], info["deployments"][other.name]
    assert (a["counts"]["expected_alerts"], b["counts"]["expected_alerts"]) == (3, 2)
    assert (a["counts"]["alert_publishes"], b["counts"]["alert_publishes"]) == (3, 2)
    assert a["counts"]["trade_not_utf8"] == 2, "the non-UTF-8 body and the 10 kB garbage"
    assert a["counts"]["trade_unreadable"] == 4, "those two, the truncated JSON, 'this is not trade data'"
    assert b["counts"]["trade_unreadable"] == 1 and b["counts"]["trade_not_utf8"] == 0
    assert a["counts"]["trade_elements_rejected"] == 1, "the -3 shares element"
    assert info["counts"]["corrupt_lines"] == 2 and info["counts"]["torn_files"] == 1, info["counts"]
    assert info["damaged_files"][0]["file"].endswith(".jsonl.gz") and info["damaged_files"][0]["bytes_lost"] > 0
    page = (tmp_path / "clean" / "report.html").read_text()
    assert page.index("Deployments") < page.index("latency histogram") < page.index(f"Deployment {vhost.name}")

    def copy_into_b(records: list[dict]) -> list[dict]:
        copies = [{**r, "vhost": other.name, "headers": {**r["headers"], "vhost": other.name}, "ts": r["ts"] + 5}
                  for r in records if r["kind"] == "publish" and r.get("vhost") == vhost.name
                  and r.get("message_id") in ("over_purchase:20", "over_purchase:1")]
        return records + copies
    injected = tmp_path / "injected"
    write_traces(injected, copy_into_b(recorded))
    code, info, found = await asyncio.to_thread(audit, spark, injected, tmp_path / "faults", channels=["ops"])
    # (B's channel has not delivered the copy of over_purchase:20 either: `pending`, inside the delivery grace.)
    assert found == sorted([(other.name, "spurious", "over_purchase:20", None),
                            (other.name, "duplicate", "over_purchase:1", None)], key=str), found
    assert code == 1 and info["deployments"][vhost.name]["verdict"] == "clean"
    assert info["deployments"][other.name]["verdict"] == "discrepancies"

    code, info, found = await asyncio.to_thread(audit, spark, injected, tmp_path / "only-a", channels=["ops"],
                                                vhosts=[vhost.name])
    assert (code, list(info["deployments"]), found) == (0, [vhost.name], [])


# --- alert batches and duplicates, on hand-made traces ----------------------------------

def alert_batch(ts: int, ids: list[str], batch_id: str) -> dict:
    body = json.dumps([{"alert_id": a, "kind": a.split(":")[0], "order_id": a.split(":")[1]} for a in ids]).encode()
    return {"kind": "publish", "ts": ts, "exchange": "Aldebaran.Alert", "message_id": batch_id,
            "content_type": "application/json", "body_b64": b64(body), "redelivered": False, "vhost": "prod"}


def orders_stream(batched: bool) -> list[dict]:
    """Three orders that go over (X, Y, Z), their alerts (one by one, or Y and Z in a batch)
    delivered once each to `ops`, and heartbeats; audited clean as it is."""
    ev = lambda i, sh, o=None: {"id": i, "#shares": sh, "client": "C", "stock": "S",  # noqa: E731
                                **({"initial_order_id": o} if o is not None else {})}
    t = T0 + 5_000
    records = heartbeats(T0, T0 + 200_000)
    for n, order in enumerate("XYZ"):
        records += [trade(t + n * 100, ev(order, 10)), trade(t + n * 100 + 10, [ev(f"{order}1", 11, order)])]
    ids = [f"over_purchase:{o}" for o in "XYZ"]
    if batched:
        records += [alert(t + 20, "over_purchase", "X"), alert_batch(t + 220, ids[1:], "batch:1")]
    else:
        records += [alert(t + n * 100 + 20, "over_purchase", o) for n, o in enumerate("XYZ")]
    records += [delivery(t + 300, "ops", a) for a in ids]
    return [{**r, "vhost": "prod"} if r["kind"] != "heartbeat" else r for r in records]


@pytest.mark.parametrize("form", ["single", "batch"])
def test_copies_of_alert_publishes_injected_later_are_duplicates(form: str, spark, tmp_path: Path) -> None:
    """Two alert publishes copied 30 s later (as single messages, or inside one alert batch)
    give exit 1 and duplicate = 2, and nothing else."""
    records = orders_stream(batched=form == "batch")
    later = T0 + 35_000
    if form == "single":
        records += [{**alert(later, "over_purchase", o), "vhost": "prod"} for o in "XY"]
    else:
        records += [alert_batch(later, ["over_purchase:X", "over_purchase:Y"], "batch:2")]
    code, info, found = audit(spark, write_traces(tmp_path / "t", records), tmp_path / "out", channels=["ops"],
                              book_ttl_s=60, ttl_tolerance_s=1)
    assert found == [("prod", "duplicate", "over_purchase:X", None), ("prod", "duplicate", "over_purchase:Y", None)]
    assert (code, info["counts"]["duplicate"], info["discrepancies"]) == (1, 2, 2)
    assert info["counts"]["expected_alerts"] == 3 and info["counts"]["alert_publishes"] == 5
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"]["duplicate"] == 2 and summary["deployments"]["prod"]["counts"]["duplicate"] == 2
