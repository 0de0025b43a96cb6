"""The audit with the operator's in-doubt list (`--in-doubt`): an alert one channel never took
from its queue is `channel_missed` without the list, `channel_in_doubt` (its own row, not a
discrepancy) with it. Hand-made traces in the recorder's format; the shared `spark` fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aldebaran.cli import build_parser
from aldebaran.errors import ConfigError
from aldebaran.settings import Settings
from tests.test_audit import T0, alert, audit, delivery, heartbeats, trade, write_traces

VHOST = "prod"


def prod_traces(root: Path) -> Path:
    """Two alerts in deployment "prod"; `pager` never takes over_purchase:A from its queue."""
    ev = lambda i, sh, o=None: {"id": i, "#shares": sh, "client": "C", "stock": "S",  # noqa: E731
                                **({"initial_order_id": o} if o is not None else {})}
    t = T0 + 5_000
    records = [trade(t, ev("A", 10)), trade(t + 10, ev("A1", 11, "A")), alert(t + 20, "over_purchase", "A"),
               trade(t + 30, ev("B", 10)), trade(t + 40, ev("B1", 12, "B")), alert(t + 50, "over_purchase", "B"),
               delivery(t + 60, "ops", "over_purchase:A"),
               *[delivery(t + 70, ch, "over_purchase:B") for ch in ("ops", "pager")]]
    return write_traces(root, heartbeats(T0, T0 + 200_000) + [{**r, "vhost": VHOST} for r in records])


def in_doubt_file(path: Path) -> Path:
    """What `aldebaran delivery in-doubt --json` prints, plus what the audit must not count."""
    def line(vhost: str, channel: str, alert_id: str, target: str | None = None) -> str:
        return json.dumps({"vhost": vhost, "channel": channel, "alert_id": alert_id, "target": target,
                           "since_ms": T0 + 5_100, "reason": "timeout after the request left",
                           "since": "2026-11-18T11:06:45.100+00:00"})
    path.write_text("\n".join([
        line(VHOST, "pager", "over_purchase:A"),
        line(VHOST, "pager", "over_purchase:A", "+15550100"),  # per recipient: still one alert
        line(VHOST, "pager", "over_purchase:B"),               # the traces show it taken: no finding
        line("staging", "ops", "over_purchase:A"),             # another deployment's list
        '{"channel": "pager", "alert_id": "over_purchase:A"}',  # no vhost: unreadable
        "not json at all",
    ]) + "\n")
    return path


@pytest.mark.spark
def test_missed_delivery_is_in_doubt_only_with_the_operators_list(spark, tmp_path: Path) -> None:
    root = prod_traces(tmp_path / "t")
    code, info, found = audit(spark, root, tmp_path / "without", ttl_tolerance_s=1, channels=["ops", "pager"])
    assert found == [("channel_missed", "over_purchase:A", "pager")], found
    assert (code, info["verdict"], info["counts"]["channel_missed"]) == (1, "discrepancies", 1)
    assert info["counts"]["channel_in_doubt"] == 0 and info["in_doubt_list"] is None

    listed = in_doubt_file(tmp_path / "in-doubt.jsonl")
    args = build_parser().parse_args(["audit", "--traces", str(root), "--out", str(tmp_path / "with"),
                                      "--ttl-tolerance", "1", "--channel", "ops", "--channel", "pager",
                                      "--in-doubt", str(listed)])
    code = args.handler(args, Settings(book_ttl_seconds=60))
    info = json.loads((tmp_path / "with" / "summary.json").read_text())
    found = sorted((r["finding"], r["alert_id"], r["channel"])
                   for r in spark.read.parquet(str(tmp_path / "with" / "findings.parquet")).collect())
    assert found == [("channel_in_doubt", "over_purchase:A", "pager")], found
    counts = info["deployments"][VHOST]["counts"]
    assert (counts["channel_in_doubt"], counts["channel_missed"]) == (1, 0)
    assert (counts["in_doubt_listed"], counts["in_doubt_delivered"]) == (2, 1)
    assert (code, info["verdict"], info["discrepancies"], info["in_doubt"]) == (0, "in_doubt", 0, 1)
    assert info["in_doubt_list"] == {"files": [str(listed)], "entries": 3, "unreadable_lines": 2}
    page = (tmp_path / "with" / "report.html").read_text()
    assert "<th>in doubt</th>" in page and "<td class='doubt'>1</td>" in page
    assert "1 alert delivery in doubt, for the operator to settle" in page
    assert "<h4>channel_in_doubt: 1" in page and "over_purchase:A" in page


def test_an_unreadable_in_doubt_file_stops_before_spark(tmp_path: Path) -> None:
    args = build_parser().parse_args(["audit", "--traces", str(tmp_path), "--in-doubt", str(tmp_path / "none")])
    with pytest.raises(ConfigError, match="--in-doubt"):
        args.handler(args, Settings(book_ttl_seconds=60))
