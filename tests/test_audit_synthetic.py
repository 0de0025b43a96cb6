"""The synthetic traces the audit is benchmarked on: the default stream stays the one every
measurement in docs/audit.md used, and `--alert-share` gives the engine's low-alert traffic."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from spark_analytics.synthetic import Shape, generate

START_MS = 1_795_000_000_000


def _records(root: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(root.rglob("*.jsonl.gz")) for line in gzip.open(part)]


def test_the_default_traces_are_the_ones_measured_before(tmp_path: Path) -> None:
    made = generate(str(tmp_path), 20_000, START_MS, shape=Shape(batch=1000, alert_batch=100))
    # The seed's stream before `alert_share` existed: the same events, orders and alerts.
    assert made == {"events": 20_003, "messages": 21, "alerts": 2_931, "records": 3_073}


def test_a_low_alert_share_gives_few_alerts_each_delivered_once(tmp_path: Path) -> None:
    made = generate(str(tmp_path), 20_000, START_MS, shape=Shape(batch=1000, alert_batch=100, alert_share=0.01))
    assert made["events"] >= 20_000
    assert 0 < made["alerts"] < made["events"] * 0.01
    records = _records(tmp_path)
    delivered = [r["message_id"] for r in records if r["kind"] == "deliver"]
    assert len(delivered) == len(set(delivered)) == made["alerts"]
