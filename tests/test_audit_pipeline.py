"""The audit of a real pipeline run: `aldebaran up` with its tracer, a known stream with junk, `aldebaran audit`.

The audit runs as the CLI runs it (its parser, the deployment's settings, its handler) in the
shared Spark session of the test run, which `spark_session` picks up: a cold JVM costs ~30 s
of a loaded 2-core box, and the `spark` fixture's session starts the way the command's does."""

from __future__ import annotations

import json
import random

import pytest

from aldebaran.cli import build_parser
from aldebaran.settings import load_settings
from aldebaran.trades.events import Purchase
from aldebaran.trades.generator import generate
from tests.support.pipeline import Broker, Pipeline, alert_counts, collect_alerts, declare
from tests.support.tracing import wait_traced
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark

CONFIG = """
[[channels]]
name = "ops-log"
kind = "log"

[[channels]]
name = "pull"
kind = "queue-api"
"""


def test_audit_of_a_real_run_is_clean(vhost, worker_env, spark, tmp_path, monkeypatch) -> None:
    (tmp_path / "aldebaran.toml").write_text(CONFIG)
    traces = tmp_path / "traces"
    env = dict(worker_env, ALDEBARAN_CONFIG=str(tmp_path / "aldebaran.toml"), ALDEBARAN_TRACES_DIR=str(traces),
               ALDEBARAN_BOOK_TTL_SECONDS="3")
    declare(env)
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    stream = generate(orders=150, seed=5, orphans=0.05)
    pipeline = Pipeline(env, tmp_path / "up.log", tracer=True).start()
    try:
        broker.publish_raw(b"id:1\n# shares: 100\nclient: Sendence\nstock: AAPL\n")
        broker.publish([Purchase("2", "1", 90, "Sendence", "AAPL"), Purchase("3", "1", 30, "Sendence", "AAPL")])
        broker.publish(stream.events, batch=25)
        broker.publish_raw(b"not a trade at all")
        broker.publish_raw(b"\xff\xfeid:\xc3\x28 not UTF-8")  # what made the audit die (MALFORMED_CHARACTER_CODING)
        broker.publish_raw(random.Random(5).randbytes(10 * 1024), "application/octet-stream")  # 10 kB of garbage
        expected = stream.expected | {"over_purchase:1"}
        alerts = collect_alerts(broker, expected=len(expected), timeout=90, settle=3)
        assert alert_counts(alerts) == {alert_id: 1 for alert_id in expected}
        wait_until(lambda: not any(broker.depth(f"Aldebaran.Channel.{name}") for name in ("ops-log", "pull")),
                   "both channels to deliver everything", timeout=60)
        wait_traced(lambda body: broker.publish_raw(body, "application/json"), traces)
    finally:
        assert pipeline.stop() == 0
        broker.close()

    out = tmp_path / "audit"
    for key, value in env.items():
        if key.startswith("ALDEBARAN_"):
            monkeypatch.setenv(key, value)
    args = build_parser().parse_args(["audit", "--traces", str(traces), "--out", str(out), "--book-ttl", "3",
                                      "--channel", "ops-log", "--channel", "pull"])
    code = args.handler(args, load_settings())
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, summary.get("counts")
    assert summary["verdict"] == "clean"
    assert summary["counts"]["expected_alerts"] == len(expected)  # re-derived on its own, same answer
    assert all(count == 0 for key, count in summary["counts"].items()
               if key in ("missed", "duplicate", "spurious", "late", "channel_missed", "channel_duplicate",
                          "channel_spurious"))
    assert (out / "report.html").exists()
    # The junk the pipeline dead-lettered is counted, not fatal: the two bytes bodies and the text.
    assert (summary["counts"]["trade_not_utf8"], summary["counts"]["trade_unreadable"]) == (2, 3), summary["counts"]
