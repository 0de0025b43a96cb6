"""The delivery ledger in Redis: an at-most-once chunk's delivered alerts are settled by marking
their attempt, and every reader (a later claim, another deliverer, the dashboard's statuses)
still sees each alert as delivered, released, interrupted or in doubt."""

from __future__ import annotations

import pytest
import redis

from aldebaran.channels import ledger as ledger_module
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


def _script_call_fails(monkeypatch: pytest.MonkeyPatch, call: int = 1, *, applied: bool) -> list[int]:
    """The `call`-th Redis script call from now fails: `applied`, it ran in Redis and its reply was
    lost (a cut after the command left); else it never reached Redis. The others are real; the
    returned list counts the calls."""
    real = ledger_module.run_script
    calls: list[int] = []

    async def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) != call:
            return await real(*args, **kwargs)
        if applied:
            await real(*args, **kwargs)
        raise redis.ConnectionError("the link went" + (" before the reply" if applied else ""))

    monkeypatch.setattr(ledger_module, "run_script", failing)
    return calls


async def _settle_fails(ledger: DeliveryLedger, *, applied: bool = False, **outcomes) -> None:
    """A settle that fails: `applied`, it ran in Redis and its reply was lost; else it never
    reached Redis (the link is down)."""
    real = ledger._settle

    async def failing(*args, **kwargs) -> None:
        if applied:
            await real(*args, **kwargs)
        raise redis.ConnectionError("the link went" + (" before the reply" if applied else ""))

    ledger._settle = failing
    try:
        with pytest.raises(redis.ConnectionError):
            await ledger.settle(**outcomes)
    finally:
        ledger._settle = real


async def test_our_own_record_of_a_send_that_never_left_moves_to_the_next_attempt(
        ledgers, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost claim reply leaves our record without a send: the next claim sends it, and its
    record must name the new attempt, or marking that attempt delivered would not cover it."""
    a, _ = ledgers
    _script_call_fails(monkeypatch, applied=True)
    with pytest.raises(redis.ConnectionError):
        await a.claim([("x", "")], record_attempt=True)
    assert _statuses(settings, ["x"]) == ["sending"]
    second = await a.claim([("x", "")], record_attempt=True)
    assert second.claims == [Claim.NEW]
    await a.settle(delivered=[("x", "")], attempt=second.attempt)
    assert _statuses(settings, ["x"]) == ["delivered"]


async def test_a_release_cut_sends_again(ledgers, settings: Settings) -> None:
    """A send that certainly failed, its release cut before Redis: the record is ours and nothing left."""
    a, _ = ledgers
    first = await a.claim([("x", "")], record_attempt=True)
    await _settle_fails(a, released=[("x", "")], attempt=first.attempt)
    assert (await a.claim([("x", "")], record_attempt=True)).claims == [Claim.NEW]


async def test_a_send_whose_settle_was_cut_is_never_sent_again(ledgers, settings: Settings,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """At most once: a send left without an answer, its settle was cut, and the next claim's reply
    was lost after Redis moved the record to that claim's attempt. Every later claim is in doubt."""
    a, b = ledgers
    first = await a.claim([("x", "")], record_attempt=True)
    assert first.claims == [Claim.NEW]  # ... the alert is sent; no answer comes
    await _settle_fails(a, in_doubt=[("x", "", "no answer", b"{}")], attempt=first.attempt)
    _script_call_fails(monkeypatch, applied=True)
    with pytest.raises(redis.ConnectionError):
        await a.claim([("x", "")], record_attempt=True)
    assert (await a.claim([("x", "")], record_attempt=True)).claims == [Claim.INTERRUPTED]
    assert (await a.claim([("x", "")], record_attempt=True)).claims == [Claim.INTERRUPTED]
    assert (await b.claim([("x", "")], record_attempt=True)).claims == [Claim.INTERRUPTED]


async def test_a_delivered_send_whose_settle_was_cut_is_settled_by_the_next_claim(
        ledgers, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipient took it and the settle was cut (the next claim's reply lost too): the next
    claim knows it delivered, never sends it again nor lists it in doubt, and marks it delivered
    in Redis, where every other reader sees it so."""
    a, b = ledgers
    first = await a.claim([("x", ""), ("y", "")], record_attempt=True)
    await _settle_fails(a, delivered=[("x", "")], in_doubt=[("y", "", "no answer", b"{}")], attempt=first.attempt)
    _script_call_fails(monkeypatch, applied=True)
    with pytest.raises(redis.ConnectionError):
        await a.claim([("x", ""), ("y", "")], record_attempt=True)
    again = await a.claim([("x", ""), ("y", "")], record_attempt=True)
    assert again.claims == [Claim.DELIVERED, Claim.INTERRUPTED]
    assert _statuses(settings, ["x", "y"]) == ["delivered", "sending"]
    assert (await b.claim([("x", "")], record_attempt=True)).claims == [Claim.DELIVERED]
    assert (await a.claim([("x", "")], record_attempt=True)).claims == [Claim.DELIVERED]
    assert a.key("x") not in a._unsettled  # marked in Redis: nothing left to remember


async def test_an_unsettled_send_whose_record_redis_lost_is_not_sent_again(ledgers, settings: Settings) -> None:
    """A failover to a replica that missed the record: Redis says new, the deliverer knows better."""
    a, _ = ledgers
    first = await a.claim([("x", ""), ("y", "")], record_attempt=True)
    await _settle_fails(a, delivered=[("x", "")], in_doubt=[("y", "", "no answer", b"{}")], attempt=first.attempt)
    client = redis.Redis.from_url(services.REDIS_URL)
    try:
        client.delete(a.key("x"), a.key("y"))
    finally:
        client.close()
    again = await a.claim([("x", ""), ("y", "")], record_attempt=True)
    assert again.claims == [Claim.DELIVERED, Claim.INTERRUPTED]
    assert _statuses(settings, ["x"]) == ["delivered"]


async def test_a_settle_applied_whose_reply_was_lost_leaves_redis_the_judge(ledgers, settings: Settings) -> None:
    """The settle reached Redis and only its reply was lost: the next claim reads the outcome there
    and forgets its own note, which would otherwise outlive the ledger's ttl."""
    a, _ = ledgers
    first = await a.claim([("x", ""), ("y", "")], record_attempt=True)
    await _settle_fails(a, applied=True, delivered=[("x", "")], in_doubt=[("y", "", "no answer", b"{}")],
                        attempt=first.attempt)
    assert a._unsettled  # what it knows before it reads Redis again
    assert (await a.claim([("x", ""), ("y", "")], record_attempt=True)).claims == [Claim.DELIVERED, Claim.IN_DOUBT]
    assert not a._unsettled


async def test_a_claim_cut_before_its_delivered_mark_leaves_its_new_alerts_unsent(
        ledgers, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim ran in Redis, then the link went before it could mark a known delivery: the claim
    raised, so its new alerts were never sent, and the next claim takes them as new again."""
    a, _ = ledgers
    first = await a.claim([("x", "")], record_attempt=True)
    await _settle_fails(a, delivered=[("x", "")], attempt=first.attempt)
    calls = _script_call_fails(monkeypatch, 2, applied=False)  # the claim, then the mark
    with pytest.raises(redis.ConnectionError):
        await a.claim([("x", ""), ("z", "")], record_attempt=True)
    assert len(calls) == 2 and _statuses(settings, ["x", "z"]) == ["sending", "sending"]
    assert (await a.claim([("x", ""), ("z", "")], record_attempt=True)).claims == [Claim.DELIVERED, Claim.NEW]


async def test_a_settled_claim_is_forgotten_and_one_never_settled_is_in_doubt(ledgers) -> None:
    a, _ = ledgers
    claimed = await a.claim([("x", ""), ("y", "")], record_attempt=True)
    await a.settle(delivered=[("x", "")], in_doubt=[("y", "", "no answer", b"{}")], attempt=claimed.attempt)
    assert not a._unsettled  # what is settled in Redis needs no memory here
    # Claimed and never settled: our own record of a send that may have left is in doubt.
    assert (await a.claim([("w", "")], record_attempt=True)).claims == [Claim.NEW]
    assert (await a.claim([("w", "")], record_attempt=True)).claims == [Claim.INTERRUPTED]


async def test_a_release_without_its_attempt_is_refused(ledgers, settings: Settings) -> None:
    """A release names the attempt it drops: with none it would match no record and leave the
    alert `sending` (in doubt for every later claim) while looking settled."""
    a, _ = ledgers
    await a.claim([("x", "")], record_attempt=True)
    with pytest.raises(ValueError, match="attempt"):
        await a.settle(released=[("x", "")])
    assert _statuses(settings, ["x"]) == ["sending"]
