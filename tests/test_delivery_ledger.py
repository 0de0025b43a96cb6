"""The delivery ledger in Redis: an at-most-once chunk's delivered alerts are settled by marking
their attempt, and every reader (a later claim, another deliverer, the dashboard's statuses)
still sees each alert as delivered, released, interrupted or in doubt."""

from __future__ import annotations

import pytest
import redis

from aldebaran.channels.ledger import Claim, DeliveryLedger, statuses
from aldebaran.io.redis import Keys, connect
from aldebaran.settings import Settings
from tests.support import services

CHANNEL = "bus"


@pytest.fixture
async def ledgers(settings: Settings):
    client = await connect(settings)
    keys = Keys(settings.redis_key_prefix)
    yield (DeliveryLedger(client, keys, CHANNEL, 600, "deliverer-a"),
           DeliveryLedger(client, keys, CHANNEL, 600, "deliverer-b"))
    await client.aclose()


def _statuses(settings: Settings, alert_ids: list[str]) -> list[str | None]:
    client = redis.Redis.from_url(services.REDIS_URL)
    try:
        keys = Keys(settings.redis_key_prefix)
        return statuses(client, keys, [keys.delivered(CHANNEL, alert_id) for alert_id in alert_ids])
    finally:
        client.close()


async def test_a_chunk_settles_its_delivered_alerts_by_its_attempt(ledgers, settings: Settings) -> None:
    a, b = ledgers
    items = [("x", ""), ("y", ""), ("z", "")]
    claimed = await a.claim(items, record_attempt=True)
    assert claimed.claims == [Claim.NEW] * 3 and claimed.attempt is not None
    assert _statuses(settings, ["x", "y", "z"]) == ["sending"] * 3
    await a.settle(delivered=[("x", ""), ("z", "")], released=[("y", "")], attempt=claimed.attempt)
    assert _statuses(settings, ["x", "y", "z"]) == ["delivered", None, "delivered"]
    # Another deliverer (a copy came back): the delivered ones are repeats, the released one is new.
    again = await b.claim(items, record_attempt=True)
    assert again.claims == [Claim.DELIVERED, Claim.NEW, Claim.DELIVERED]
    # An at-least-once reader of the same ledger sees them delivered too.
    assert (await b.claim([("x", "")], record_attempt=False)).claims == [Claim.DELIVERED]


async def test_an_attempt_never_settled_is_interrupted_for_everyone_else(ledgers, settings: Settings) -> None:
    a, b = ledgers
    await a.claim([("x", "")], record_attempt=True)  # a dies mid-send
    assert (await b.claim([("x", "")], record_attempt=True)).claims == [Claim.INTERRUPTED]
    assert _statuses(settings, ["x"]) == ["sending"]
    await b.settle(in_doubt=[("x", "", "interrupted", b"{}")])
    assert _statuses(settings, ["x"]) == ["in-doubt"]


async def test_our_own_record_of_a_send_that_never_left_moves_to_the_next_attempt(ledgers, settings: Settings) -> None:
    """A lost reply leaves our record without a send (`_unsent`): the next claim sends it, and its
    record must name the new attempt, or marking that attempt delivered would not cover it."""
    a, _ = ledgers
    first = await a.claim([("x", "")], record_attempt=True)
    a._unsent.add(a.key("x"))
    second = await a.claim([("x", "")], record_attempt=True)
    assert second.claims == [Claim.NEW] and second.attempt != first.attempt
    await a.settle(delivered=[("x", "")], attempt=second.attempt)
    assert _statuses(settings, ["x"]) == ["delivered"]
    # Not ours and not unsent: interrupted, as from any other process.
    assert (await a.claim([("w", "")], record_attempt=True)).claims == [Claim.NEW]
    assert (await a.claim([("w", "")], record_attempt=True)).claims == [Claim.INTERRUPTED]
