"""An event for an order whose book already closed is counted as late, in a metric and a log
line, and changes nothing (CONTRACT §1), in the engine process as it runs."""

from __future__ import annotations

from pathlib import Path

from aldebaran.bench.metrics_scrape import scrape, total
from aldebaran.trades.events import Purchase
from tests.support.pipeline import TAP, Broker, alerts_before_barrier, read_alert_message, worker
from tests.support.processes import free_port
from tests.support.waiting import wait_until


def test_a_late_purchase_is_counted_and_logged_and_fires_nothing(broker: Broker, worker_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "engine.log"
    env = {**worker_env, "ALDEBARAN_BOOK_TTL_SECONDS": "1"}
    with worker(env, log_path, "engine", "--metrics-port", str(port)):
        broker.publish([Purchase("lone-p", "lone", 3, "c", "s")])
        closed: list[dict] = []

        def book_closed() -> bool:
            for properties, body in broker.drain(TAP):
                closed.extend(read_alert_message(properties, body))
            return any(alert["alert_id"] == "purchase_without_request:lone" for alert in closed)

        wait_until(book_closed, lambda: f"the lone purchase's alert (read: {closed})", 60)
        broker.publish([Purchase("lone-late", "lone", 5, "c", "s")])

        assert alerts_before_barrier(broker) == []  # the late purchase fired nothing

        def late() -> float:
            return total(scrape([port]), "aldebaran_book_events_total", outcome="late")

        wait_until(lambda: late() == 1, lambda: f"late events counted: {late()}", 30)
        wait_until(lambda: '"late events: their book already closed"' in log_path.read_text(),
                   lambda: "the late events' log line", 30)
    assert '"count": 1' in next(line for line in log_path.read_text().splitlines()
                                 if "late events: their book already closed" in line)
