"""A running worker's /metrics moves when it works; the dashboards and alert rules only
name metrics that exist.

The worker is the real `aldebaran run aggregator --metrics-port N`; the test waits for
its READY=1 (the same NOTIFY_SOCKET systemd uses), publishes trade data, and scrapes
over HTTP until the counters show it (bounded polling, nothing asserted on time).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pika
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from aldebaran import metrics
from aldebaran.settings import Settings
from declare.declarer import open_blocking
from declare.topology import DEAD_LETTER, REASON_HEADER, TRADE_DATA
from tests.support.processes import free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
ALDEBARAN = str(Path(sys.executable).with_name("aldebaran"))


def scrape(port: int) -> dict[str, float]:
    """Every sample of the worker's /metrics, keyed `name{labels}`."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).raise_for_status().text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(name + "{"))


@pytest.fixture
def aggregator(tmp_path: Path, worker_env: dict[str, str]) -> Iterator[int]:
    """A real aggregator process, ready (READY=1 received); yields its metrics port."""
    port = free_port()
    address = str(tmp_path / "notify.sock")
    log = (tmp_path / "aggregator.log").open("w+")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(30)
        proc = subprocess.Popen([ALDEBARAN, "run", "aggregator", "--metrics-port", str(port)],
                                env=dict(worker_env, NOTIFY_SOCKET=address, ALDEBARAN_MODE="per-order"),
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                while "READY=1" not in sock.recv(4096).decode().splitlines():
                    pass
            except TimeoutError:
                log.seek(0)
                raise AssertionError(f"the aggregator never sent READY=1:\n{log.read()}") from None
            yield port
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def publish_trades(settings: Settings, bodies: list[bytes]) -> None:
    connection = open_blocking(settings.amqp_url)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish(TRADE_DATA, TRADE_DATA, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def test_counters_move_on_a_running_aggregator(aggregator: int, settings: Settings,
                                               worker_env: dict[str, str]) -> None:
    before = scrape(aggregator)
    assert "aldebaran_books_open{}" in before  # the worker's own registry is served
    request = {"id": "m1", "#shares": 10, "client": "acme", "stock": "XYZ"}
    purchase = {"id": "m2", "initial_order_id": "m1", "#shares": 4, "client": "acme", "stock": "XYZ"}
    publish_trades(settings, [json.dumps(request).encode(), json.dumps(purchase).encode(), b"\x00 not a trade"])

    after = before

    def counted() -> bool:
        nonlocal after
        after = scrape(aggregator)
        return (total(after, "aldebaran_events_consumed_total") - total(before, "aldebaran_events_consumed_total") >= 2
                and total(after, "aldebaran_messages_dead_lettered_total")
                - total(before, "aldebaran_messages_dead_lettered_total") >= 1)

    wait_until(counted, "2 events consumed and 1 dead letter on /metrics", timeout=30, pause=0.2, required=False)
    consumed = total(after, "aldebaran_events_consumed_total") - total(before, "aldebaran_events_consumed_total")
    dead = (total(after, "aldebaran_messages_dead_lettered_total")
            - total(before, "aldebaran_messages_dead_lettered_total"))
    assert consumed == 2, after
    assert dead == 1, after
    for kind in ("PurchaseRequest", "Purchase"):  # one of each, by the codec's kind names
        key = f"aldebaran_events_consumed_total{{type={kind}}}"
        assert after.get(key, 0) - before.get(key, 0) == 1, after
    batches = total(after, "aldebaran_batch_events_count") - total(before, "aldebaran_batch_events_count")
    assert batches == 3  # one observation per consumed AMQP message

    # `aldebaran stats --metrics` sums the workers' own open-books gauges.
    done = subprocess.run([ALDEBARAN, "stats", "--json", "--peek", "0", "--metrics",
                           f"http://127.0.0.1:{aggregator}/metrics"],
                          env=worker_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["open_books_source"].startswith("aldebaran_books_open")
    assert report["open_books"] == after["aldebaran_books_open{}"]

    # The junk is in the dead-letter queue, with its reason.
    connection = open_blocking(settings.amqp_url)
    try:
        _method, properties, body = connection.channel().basic_get(DEAD_LETTER, auto_ack=False)
        assert body == b"\x00 not a trade" and properties.headers[REASON_HEADER]
    finally:
        connection.close()


# --- the dashboards and rules speak of metrics that exist ----------------------------

def declared_metrics() -> set[str]:
    """Every series name aldebaran/metrics.py can expose (with _bucket/_count/_sum/_total)."""
    names = set()
    for value in vars(metrics).values():
        describe = getattr(value, "describe", None)
        if callable(describe) and hasattr(value, "_name"):
            for family in describe():
                names.add(family.name)
                for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
                    names.add(family.name + suffix)
    return names


def referenced(text: str) -> set[str]:
    return set(re.findall(r"\baldebaran_[a-z0-9_]+", text))


def test_alert_rules_cover_the_issue_and_name_real_metrics() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {"AldebaranWorkerDown", "AldebaranDeadLettersGrowing", "AldebaranLatencyP99High",
            "AldebaranAuditFailed"} <= set(alerts)
    for rule in alerts.values():
        assert rule["expr"] and rule["labels"]["severity"] and rule["annotations"]["summary"]
    assert "aldebaran_processing_latency_seconds_bucket" in alerts["AldebaranLatencyP99High"]["expr"]
    assert "0.005" in alerts["AldebaranLatencyP99High"]["expr"]
    unknown = referenced(json.dumps(rules)) - declared_metrics()
    assert not unknown, unknown


def test_grafana_dashboard_names_real_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/aldebaran.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = set().union(*(referenced(e) for e in exprs))
    assert used <= declared_metrics(), used - declared_metrics()
    # Every metric of aldebaran/metrics.py has a panel.
    families = {n for n in declared_metrics() if not n.endswith(("_bucket", "_count", "_sum", "_created"))}
    base = {n.removesuffix("_total") for n in used} | {re.sub(r"_(bucket|count|sum)$", "", n) for n in used}
    missing = {f for f in families if f.removesuffix("_total") not in base}
    assert not missing, missing
