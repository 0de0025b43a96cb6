"""The synthetic traces the audit is benchmarked on: the default stream's events and alerts stay
the ones every measurement in docs/audit.md used, `--alert-share` gives the engine's low-alert
traffic, and a batched shape's channel deliveries are batches, as the Fire Lookout sends them."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

from spark_analytics.synthetic import Shape, generate

START_MS = 1_795_000_000_000


def _records(root: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(root.rglob("*.jsonl.gz")) for line in gzip.open(part)]


def _delivered(records: list[dict]) -> list[str]:
    """Every alert id the channel deliveries hold (a batch body's alerts one by one)."""
    ids = []
    for r in records:
        if r["kind"] == "deliver":
            body = json.loads(base64.b64decode(r["body_b64"]))
            ids += [a["alert_id"] for a in (body if isinstance(body, list) else [body])]
    return ids


def test_the_default_traces_are_the_ones_measured_before(tmp_path: Path) -> None:
    made = generate(str(tmp_path), 20_000, START_MS, shape=Shape(batch=1000, alert_batch=100))
    # The seed's stream before `alert_share` existed: the same events, orders and alerts. The
    # records were 3,073 while each alert was delivered in a message of its own.
    assert made == {"events": 20_003, "messages": 21, "alerts": 2_931, "records": 247}


def test_single_event_traces_deliver_each_alert_on_its_own(tmp_path: Path) -> None:
    made = generate(str(tmp_path), 2_000, START_MS, shape=Shape())
    deliveries = [r for r in _records(tmp_path) if r["kind"] == "deliver"]
    assert len(deliveries) == made["alerts"] > 0
    assert {r["message_id"] for r in deliveries} == set(_delivered(deliveries))


def test_batched_traces_deliver_each_fan_out_as_one_message(tmp_path: Path) -> None:
    made = generate(str(tmp_path), 20_000, START_MS, shape=Shape(batch=1000, alert_batch=100, channels=("a", "b")))
    records = _records(tmp_path)
    publishes = [r for r in records if r["kind"] == "publish" and r["exchange"] == "Aldebaran.Alert"]
    for channel in ("a", "b"):
        mine = [r for r in records if r["kind"] == "deliver" and r["queue"] == f"Aldebaran.Channel.{channel}"]
        assert len(mine) == len(publishes) < made["alerts"]  # one message per batch taken
        ids = _delivered(mine)
        assert len(ids) == len(set(ids)) == made["alerts"]


def test_a_low_alert_share_gives_few_alerts_each_delivered_once(tmp_path: Path) -> None:
    made = generate(str(tmp_path), 20_000, START_MS, shape=Shape(batch=1000, alert_batch=100, alert_share=0.01))
    assert made["events"] >= 20_000
    assert 0 < made["alerts"] < made["events"] * 0.01
    delivered = _delivered(_records(tmp_path))
    assert len(delivered) == len(set(delivered)) == made["alerts"]
