"""The trade publisher against the real broker: what it does when nobody would take a message."""

from __future__ import annotations

import asyncio

import pika
import pytest

from aldebaran.errors import PublishRefused
from aldebaran.io.publisher import Body, publish_bodies
from aldebaran.metrics import UNROUTABLE
from aldebaran.trades.codec import encode_json
from aldebaran.trades.events import PurchaseRequest
from declare.topology import TRADE_DATA


def test_an_exchange_without_its_queue_is_an_error_naming_declare_not_a_silent_confirm(settings) -> None:
    """Without mandatory publishes the broker would confirm these into nowhere."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        connection.channel().exchange_declare(TRADE_DATA, exchange_type="direct", durable=True)
    finally:
        connection.close()
    returned = UNROUTABLE.labels(publisher="trade")
    before = returned._value.get()
    body = Body(encode_json([PurchaseRequest("lonely", 1, "c", "s")]), 1)
    with pytest.raises(PublishRefused, match="no queue is bound.*aldebaran declare"):
        asyncio.run(publish_bodies(settings, [body], max_retries=3))
    assert returned._value.get() - before == 3
