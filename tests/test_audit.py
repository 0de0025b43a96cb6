"""The nightly audit: real recorded traces audited clean, injected faults found exactly, gaps.

One SparkSession (local[2], the `spark` fixture in conftest) is shared by every audit test.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import shutil
from pathlib import Path

import aio_pika
import msgspec
import pytest

from aldebaran.io.trace_files import partition_dir
from aldebaran.settings import LogChannel, Settings
from declare.declarer import declare
from spark_analytics.job import exit_status, run
from spark_analytics.options import AuditOptions
from tests.support import services
from tests.test_tracer import Running, read_records, wait_covered_past_last_record, wait_recorded
from workers.tracer import build

pytestmark = pytest.mark.spark

T0 = 1_795_000_000_000  # 2026-11-18T11:06:40Z, a fixed base for hand-made traces


# --- hand-made traces in the recorder's format --------------------------------------------

def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def trade(ts: int, body: bytes | dict | list, content_type: str = "application/json") -> dict:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return {"kind": "publish", "ts": ts, "exchange": "Aldebaran.Trade_Data", "content_type": content_type,
            "body_b64": b64(raw), "redelivered": False}


def alert(ts: int, kind: str, order: str) -> dict:
    aid = f"{kind}:{order}"
    body = json.dumps({"alert_id": aid, "kind": kind, "order_id": order}).encode()
    return {"kind": "publish", "ts": ts, "exchange": "Aldebaran.Alert", "message_id": aid,
            "content_type": "application/json", "body_b64": b64(body), "redelivered": False}


def delivery(ts: int, channel: str, alert_id: str, redelivered: bool = False) -> dict:
    return {"kind": "deliver", "ts": ts, "queue": f"Aldebaran.Channel.{channel}", "message_id": alert_id,
            "body_b64": b64(b"{}"), "redelivered": redelivered}


def heartbeats(start: int, end: int, every: int = 10_000) -> list[dict]:
    return [{"kind": "heartbeat", "ts": t, "interval": every / 1000} for t in range(start, end + 1, every)]


def write_traces(root: Path, records: list[dict]) -> Path:
    groups: dict[Path, list[str]] = {}
    for r in sorted(records, key=lambda r: r.get("ts") or r.get("end")):
        groups.setdefault(partition_dir(root, r.get("ts") or r["end"]), []).append(json.dumps(r))
    for d, lines in groups.items():
        d.mkdir(parents=True, exist_ok=True)
        with gzip.open(d / "part-test-00001.jsonl.gz", "wt") as fh:
            fh.write("\n".join(lines) + "\n")
    return root


def audit(spark, root: Path, out: Path, **options) -> tuple[int, dict, list[tuple[str, str, str | None]]]:
    allow_gaps = options.pop("allow_gaps", False)
    opts = AuditOptions(traces_dir=str(root), **options)
    code, info = run(opts, None, str(out), allow_gaps, spark=spark)
    found = [(r["finding"], r["alert_id"], r["channel"]) for r in
             spark.read.parquet(str(out / "findings.parquet")).collect()]
    return code, info, sorted(found, key=str)


# --- the must-show test: a real recording, audited clean, then three injected faults -------

TTL = 2.0


def known_stream() -> list[tuple[str, bytes, str | None]]:
    """(step, body, content type) in publish order; `alert:<id>` steps are the pipeline's alerts."""
    def js(obj: object) -> bytes:
        return json.dumps(obj).encode()
    ev = lambda i, sh, o=None: {"id": i, "#shares": sh, "client": "Sendence", "stock": "AAPL",  # noqa: E731
                                **({"initial_order_id": o} if o is not None else {})}
    return [
        ("trade", b"id:1\n# shares: 100\nclient: Sendence\nstock: AAPL", "text/plain"),
        ("trade", js(ev(2, 90, 1)), "application/json"),
        ("trade", js(ev(2, 90, 1)), "application/json"),       # the same purchase again: counts once
        ("trade", js([ev(3, 30, 1), ev(5, 10, 1)]), "application/json"),  # crosses 100: fires
        ("alert", b"over_purchase:1", None),
        ("trade", b"id:4\ninitial order id: 1\n# shares: 10\nclient: S\nstock: AAPL", "text/plain"),  # no refire
        ("trade", js(ev("10", 100)), "application/json"),
        ("trade", js([ev("11", 50, "10"), ev("12", 50, "10")]), "application/json"),  # equal: no alert
        ("trade", msgspec.msgpack.encode(ev("21", 60, "20")), "application/msgpack"),
        ("trade", js(ev("22", 50, "20")), "application/json"),
        ("trade", js(ev("20", 100)), "application/json"),        # request after purchases: fires now
        ("alert", b"over_purchase:20", None),
        ("trade", js(ev("31", 5, "30")), "application/json"),    # no request ever: fires at book close
        ("trade", js(ev("40", 10)), "application/json"),         # request alone: nothing
        ("trade", b"this is not trade data", "text/plain"),      # unreadable: changes nothing
        ("trade", js({"id": "50", "#shares": -3, "client": "S", "stock": "X"}), "application/json"),
        ("sleep", b"", None),
        ("alert", b"purchase_without_request:30", None),
    ]


async def record_known_stream(settings: Settings, vhost: services.Vhost) -> int:
    """Publish the stream the way the pipeline would, with a channel consumer; returns records."""
    settings = settings.model_copy(update={"channels": [LogChannel(name="ops", kind="log"),
                                                        LogChannel(name="pager", kind="log")]})
    declare(settings, echo=lambda _: None)
    tracer = build(settings, heartbeat_seconds=0.5, linger_seconds=0.05)
    expected_records = 0
    async with Running(tracer):
        connection = await aio_pika.connect(vhost.amqp_url)
        async with connection:
            channel = await connection.channel()
            trades = await channel.get_exchange("Aldebaran.Trade_Data")
            alerts = await channel.get_exchange("Aldebaran.Alert")
            for step, body, ctype in known_stream():
                if step == "trade":
                    await trades.publish(aio_pika.Message(body, content_type=ctype), routing_key="Aldebaran.Trade_Data")
                    expected_records += 1
                elif step == "sleep":
                    await asyncio.sleep(TTL + 0.3)
                else:
                    aid = body.decode()
                    kind, _, order = aid.partition(":")
                    payload = json.dumps({"alert_id": aid, "kind": kind, "order_id": order}).encode()
                    await alerts.publish(aio_pika.Message(payload, message_id=aid, content_type="application/json"),
                                         routing_key="Aldebaran.Alert")
                    for name in ("ops", "pager"):  # the fan-out, through the default exchange
                        await channel.default_exchange.publish(
                            aio_pika.Message(payload, message_id=aid), routing_key=f"Aldebaran.Channel.{name}")
                    expected_records += 1
                await asyncio.sleep(0.02)
            for name in ("ops", "pager"):
                queue = await channel.get_queue(f"Aldebaran.Channel.{name}")
                for i in range(3):
                    message = await queue.get(timeout=5)
                    if name == "pager" and i == 0:
                        await message.nack(requeue=True)  # a consumer crash: redelivered=true next time
                        message = await queue.get(timeout=5)
                        expected_records += 1
                    await message.ack()
                    expected_records += 1
            await wait_recorded(tracer, expected_records)
            await wait_covered_past_last_record(tracer, 1200)  # heartbeats after the last alert: the end is covered
    return expected_records


def rewrite(root: Path, change) -> None:
    records = read_records(root)
    for part in root.glob("date=*/hour=*/*.jsonl.gz"):
        part.unlink()
    write_traces(root, change(records))


async def test_recorded_stream_audits_clean_then_injected_faults_are_found_exactly(
        settings: Settings, vhost: services.Vhost, spark, tmp_path: Path) -> None:
    recorded = await record_known_stream(settings, vhost)
    root = Path(settings.traces_dir)
    assert len([r for r in read_records(root) if r["kind"] in ("publish", "deliver")]) == recorded

    code, info, found = await asyncio.to_thread(audit, spark, root, tmp_path / "clean", book_ttl_s=TTL, grace_s=0.5,
                                                late_after_s=30, ttl_tolerance_s=0.2, channels=["ops", "pager"])
    assert found == [], found
    assert (code, info["verdict"]) == (0, "clean")
    assert info["counts"]["expected_alerts"] == 3 and info["counts"]["alert_publishes"] == 3
    assert info["counts"]["channel_redeliveries"] == 1, "the nacked copy came back redelivered: not a duplicate"
    assert info["counts"]["distinct_events"] == 13
    assert info["latency_ms"]["all"]["count"] == 3

    injected = tmp_path / "injected"
    shutil.copytree(root, injected)

    def inject(records: list[dict]) -> list[dict]:
        out = []
        for r in records:
            if r.get("message_id") == "over_purchase:20" and r["kind"] in ("publish", "deliver"):
                continue  # suppressed: the pipeline never fired it
            out.append(r)
            if r["kind"] == "publish" and r.get("message_id") == "over_purchase:1":
                out.append({**r, "ts": r["ts"] + 3})  # a duplicate publish
        t = max(r["ts"] for r in records if r.get("message_id") == "over_purchase:1")
        out += [alert(t + 5, "over_purchase", "10")]  # spurious: equal never fires
        out += [delivery(t + 9, name, "over_purchase:10") for name in ("ops", "pager")]
        return out
    rewrite(injected, inject)

    code, info, found = await asyncio.to_thread(audit, spark, injected, tmp_path / "faults", book_ttl_s=TTL,
                                                grace_s=0.5, late_after_s=30, ttl_tolerance_s=0.2,
                                                channels=["ops", "pager"])
    assert found == sorted([("duplicate", "over_purchase:1", None), ("missed", "over_purchase:20", None),
                            ("spurious", "over_purchase:10", None)], key=str)
    assert code == 1 and info["verdict"] == "discrepancies" and info["discrepancies"] == 3
    page = (tmp_path / "faults" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "over_purchase:20" in page


# --- CONTRACT §1 and §3 on hand-made traces ----------------------------------------------

def test_wire_forms_meaning_and_channels(spark, tmp_path: Path) -> None:
    ev = lambda i, sh, o=None: {"id": i, "#shares": sh, "client": "C", "stock": "S",  # noqa: E731
                                **({"initial_order_id": o} if o is not None else {})}
    t = T0 + 5_000
    records = [
        *heartbeats(T0, T0 + 200_000),
        trade(t, b"id: A\n# shares: 10\nclient: C\nstock: S", "text/plain"),
        trade(t + 10, b"id: A1\nInitial_Order_Id: A\n#Shares: 6\nclient: C\nstock: S", "text/plain"),
        trade(t + 20, [ev("A2", 5, "A"), ev("A3", 0, "A")]),    # one bad element; the good one counts
        alert(t + 30, "over_purchase", "A"),
        trade(t + 40, msgspec.msgpack.encode([ev("B1", 7, "B")]), "application/msgpack"),
        trade(t + 50, b"id: B\n# shares: 7\nbogus: 1\nclient: C\nstock: S", "text/plain"),  # unknown key: unread
        alert(t + 60_000 + 45, "purchase_without_request", "B"),
        trade(t + 100, ev(1, 10)),          # integer ids read as decimal strings
        trade(t + 110, ev(2, 11, "1")),
        trade(t + 115, ev(2, 11, "1")),     # same purchase again: once
        trade(t + 120, ev("1", 1, "1")),    # purchase "1" is not request "1": it counts
        alert(t + 125, "over_purchase", "1"),
        trade(t + 200, ev("C", 5)),
        trade(t + 200 + 65_000, ev("C1", 9, "C")),  # after the book closed: late, changes nothing
        # channels: one copy of every alert per channel; broker redeliveries are not duplicates
        *[delivery(t + 130, ch, aid) for ch in ("ops", "sms")
          for aid in ("over_purchase:A", "over_purchase:1", "purchase_without_request:B")
          if (ch, aid) != ("sms", "over_purchase:1")],
        delivery(t + 131, "ops", "over_purchase:A", redelivered=True),
        delivery(t + 132, "ops", "over_purchase:1"),                  # a second first delivery: duplicate
        delivery(t + 133, "ops", "over_purchase:Y"),                  # never published: spurious
    ]
    code, info, found = audit(spark, write_traces(tmp_path / "t", records), tmp_path / "out", ttl_tolerance_s=1,
                              channels=["ops", "sms"])
    assert found == sorted([("channel_duplicate", "over_purchase:1", "ops"),
                            ("channel_missed", "over_purchase:1", "sms"),
                            ("channel_spurious", "over_purchase:Y", "ops")], key=str), found
    assert code == 1 and info["counts"]["channel_redeliveries"] == 1
    assert info["counts"]["expected_alerts"] == 3 and info["counts"]["missed"] == 0
    orders = {r["order_id"]: r for r in spark.read.parquet(str(tmp_path / "out" / "orders.parquet")).collect()}
    assert orders["A"]["purchased_shares"] == 11 and orders["1"]["purchased_shares"] == 12
    assert orders["A"]["latency_ms"] == 10, "from the crossing purchase's publish to the alert's"
    assert orders["B"]["verdict"] == "ok" and orders["B"]["requested_shares"] is None


def test_recorder_outage_is_an_unaudited_window_not_a_verdict(spark, tmp_path: Path) -> None:
    ok_t = T0 + 5_000
    hole = (T0 + 60_000, T0 + 120_000)
    records = (heartbeats(T0, hole[0]) + heartbeats(hole[1], T0 + 400_000)
               + [{"kind": "gap", "ts": hole[1], "start": hole[0], "end": hole[1], "reason": "recorder not running"}]
               + [trade(ok_t, {"id": "K", "#shares": 1, "client": "C", "stock": "S"}),
                  trade(ok_t + 1, {"id": "K1", "initial_order_id": "K", "#shares": 5, "client": "C", "stock": "S"}),
                  alert(ok_t + 3, "over_purchase", "K"),
                  # an order seen just before the outage; its alert would fall inside it
                  trade(hole[0] - 2_000, {"id": "G", "#shares": 1, "client": "C", "stock": "S"}),
                  trade(hole[0] - 1_000, {"id": "G1", "initial_order_id": "G", "#shares": 5,
                                          "client": "C", "stock": "S"})])
    # and a silent stretch with no marker at all (a crashed recorder that never came back)
    records = [r for r in records if not (r["kind"] == "heartbeat" and T0 + 200_000 < r["ts"] < T0 + 300_000)]
    root = write_traces(tmp_path / "t", records)
    # Through `aldebaran audit`: an audit window opening 40 s before the traces, and --allow-gaps.
    from aldebaran.cli import build_parser

    args = build_parser().parse_args(["audit", "--traces", str(root), "--out", str(tmp_path / "cli"), "--allow-gaps",
                                      "--since", "2026-11-18T11:06:00", "--until", "2026-11-18T11:09:00"])
    code = args.handler(args, Settings(book_ttl_seconds=60))
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert (code, summary["verdict"]) == (0, "unaudited"), "exit 0 on gaps alone with --allow-gaps"
    assert (exit_status("unaudited"), exit_status("unaudited", allow_gaps=True), exit_status("in_doubt")) == (1, 0, 0)
    assert summary["window"]["since"].startswith("2026-11-18T11:06:00")
    assert spark.read.parquet(str(tmp_path / "cli" / "findings.parquet")).count() == 0, \
        "no false 'missed' for the order inside the outage"
    windows = [(w["reason"], w["seconds"]) for w in summary["unaudited_windows"]]
    assert windows == [("not recording at the window's start", 40.0), ("recorder not running", 60.0),
                       ("no heartbeat", 100.0)], windows
    orders = {r["order_id"]: r["verdict"]
              for r in spark.read.parquet(str(tmp_path / "cli" / "orders.parquet")).collect()}
    assert orders == {"K": "ok", "G": "unaudited"}
