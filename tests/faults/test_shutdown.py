"""Graceful shutdown: the first SIGTERM drains and exits 0 (nothing lost), a second exits at once.

Bounded waits only: a worker that does not exit within its grace period plus a margin
fails the test; how fast it exits is never asserted.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from aldebaran.errors import ExitCode
from tests.faults.conftest import redis_url
from tests.faults.fleet import (
    ORDERS,
    TEST_TIMEOUT,
    Fleet,
    RetryingPublisher,
    WebhookServer,
    channels_toml,
    describe,
    pull_queue_deliveries,
    wait_for_sinks,
)
from tests.support.checker import fault_stream
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
GRACE = 15  # ALDEBARAN_SHUTDOWN_GRACE_SECONDS in fault_env
BOUND = GRACE + 20  # grace + interpreter teardown, generous for a loaded 2-core box


def test_first_sigterm_drains_mid_stream_and_exits_0_nothing_lost(fault_env, webhook, redis_prefix, vhost,
                                                                   tmp_path: Path, record) -> None:
    stream = fault_stream(ORDERS, seed=31)
    fleet = Fleet(fault_env, tmp_path / "logs").start_all()
    publisher = RetryingPublisher(vhost.amqp_url)
    exits: dict[str, int] = {}

    def stop_everything() -> None:
        for process in fleet.processes.values():
            process.send_signal(signal.SIGTERM)
        for kind, process in fleet.processes.items():
            try:
                exits[kind] = process.wait(timeout=BOUND)
            except subprocess.TimeoutExpired:
                exits[kind] = -999  # did not stop within the bound
                process.kill()
                process.wait(timeout=30)
        fleet.start_all()  # the next run carries on from what the broker kept

    try:
        publisher.publish_stream(stream.events, at={0.5: stop_everything})
        reports = wait_for_sinks(stream.expected, {
            "webhook": webhook.deliveries,
            "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix)},
            timeout=120 + len(stream.events) / 50)
    finally:
        publisher.close()
        codes = fleet.stop_all(timeout=BOUND)
    print(f"\nSIGTERM mid-stream: exits {exits}, final {codes}\n{describe(reports.values())}")
    record("SIGTERM to every worker at 50% (graceful), then restart", 1, len(stream.events), reports,
           "FAULTS_SCALE=full .venv/bin/python -m pytest -m faults -q -s "
           "'tests/faults/test_shutdown.py::test_first_sigterm_drains_mid_stream_and_exits_0_nothing_lost'")
    assert exits and all(code == ExitCode.OK for code in exits.values()), exits
    assert all(code == ExitCode.OK for code in codes.values()), codes
    assert all(r.ok for r in reports.values()), describe(reports.values())
    log = fleet.all_logs()
    assert '"event": "stopping"' in log and "worker crashed" not in log


def test_second_sigterm_exits_at_once_with_137(fault_env, tmp_path: Path, vhost) -> None:
    """A deliverer stuck on a hanging recipient: the first SIGTERM waits for it (grace),
    the second one ends the process at once with ExitCode.KILLED; the alert stays queued."""
    hanging = WebhookServer(delay=120)
    try:
        env = {**fault_env, "ALDEBARAN_CONFIG": str(channels_toml(tmp_path / "hang.toml", hanging.url)),
               "ALDEBARAN_SHUTDOWN_GRACE_SECONDS": "300"}
        fleet = Fleet(env, tmp_path / "logs", kinds=("aggregator", "books", "lookout", "hook"))
        fleet.start_all()
        stream = fault_stream(10, seed=32, orphans=0.0)
        assert stream.expected
        publisher = RetryingPublisher(vhost.amqp_url)
        publisher.publish_stream(stream.events)
        publisher.close()
        wait_until(lambda: hanging.requests > 0, lambda: f"the hung delivery to start:\n{fleet.tail('hook')}",
                   timeout=60, pause=0.2)
        hook = fleet.processes["hook"]
        hook.send_signal(signal.SIGTERM)
        wait_until(lambda: '"event": "stopping"' in fleet.tail("hook"),
                   lambda: f"the deliverer to start stopping:\n{fleet.tail('hook')}")
        assert hook.poll() is None  # still draining the hung delivery
        hook.send_signal(signal.SIGTERM)
        code = hook.wait(timeout=30)
        assert code == ExitCode.KILLED, fleet.tail("hook")
        assert "second signal" in fleet.tail("hook")
        others = fleet.stop_all(timeout=BOUND)
        assert all(c == 0 for k, c in others.items() if k != "hook"), others
    finally:
        hanging.delay = 0
        hanging.close()
