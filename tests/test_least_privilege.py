"""Least privilege, shipped: `aldebaran declare --publisher-user` makes a user that cannot forge alerts."""

from __future__ import annotations

import subprocess
import sys
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pika.exceptions
import pytest

from declare.topology import ALERT, TRADE_DATA, WORK_QUEUE
from tests.support import services


def _as(user: str, password: str, amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    return urlunsplit((parts.scheme, f"{quote(user)}:{quote(password)}@{parts.hostname}:{parts.port or 5672}",
                       parts.path, "", ""))


def test_a_publisher_user_writes_trade_data_and_gets_403_on_the_alert_exchange(vhost, worker_env, tmp_path) -> None:
    suffix = uuid.uuid4().hex[:8]
    publisher, workers = f"pub-{suffix}", f"wrk-{suffix}"
    (tmp_path / "pub").write_text("pub-secret\n")
    (tmp_path / "wrk").write_text("wrk-secret\n")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "aldebaran.cli", "declare", "--publisher-user", f"{publisher}={tmp_path / 'pub'}",
             "--workers-user", f"{workers}={tmp_path / 'wrk'}"],
            env=worker_env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "pub-secret" not in result.stdout + result.stderr
        assert f"user {publisher} (publisher)" in result.stdout

        connection = pika.BlockingConnection(pika.URLParameters(_as(publisher, "pub-secret", vhost.amqp_url)))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish(TRADE_DATA, TRADE_DATA, b'{"id": "1", "#shares": 1, "client": "c", "stock": "s"}')
            for exchange, key in ((ALERT, ALERT), ("", WORK_QUEUE)):
                channel = connection.channel()
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                    channel.basic_publish(exchange, key, b'{"alert_id": "over_purchase:REAL-1"}')
                    channel.confirm_delivery()  # a round trip: the refusal arrives by then
                assert refused.value.reply_code == 403
        finally:
            connection.close()
        # the workers' user may do what workers do in this vhost
        connection = pika.BlockingConnection(pika.URLParameters(_as(workers, "wrk-secret", vhost.amqp_url)))
        try:
            connection.channel().basic_publish(ALERT, ALERT, b"{}")
            assert connection.channel().queue_declare(TRADE_DATA, passive=True).method.message_count == 1
        finally:
            connection.close()
    finally:
        with services._management() as http:
            for user in (publisher, workers):
                http.delete(f"/api/users/{user}")
