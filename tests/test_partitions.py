"""Partitioned engines (pure): each owns the books of one partition, hands the others' events to
their owners, and together they fire exactly the alerts one engine would, once each."""

from __future__ import annotations

import random
import zlib
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from aldebaran.apps import load_rule
from aldebaran.apps.trade_limits import rule
from aldebaran.core.engine import Engine, HandoverRefused
from aldebaran.core.partitions import Partitioning, partition_of
from aldebaran.core.wal import WalMessage, decode_record
from aldebaran.trades.codec import MSGPACK, encode_msgpack
from aldebaran.trades.events import Purchase, PurchaseRequest
from aldebaran.trades.generator import generate

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TTL = 600.0  # no book closes before the last handover is taken: the verdicts are a single engine's


def _engine(index: int | None = None, count: int = 1, rules: list | None = None) -> Engine:
    rules = rules or [rule]
    partitioning = Partitioning(rules, index, count) if index is not None else None
    return Engine(rules, default_ttl=TTL, done_retention=60.0, done_cap=10**9, max_message_bytes=1 << 20,
                  partitioning=partitioning)


def test_the_partition_of_a_key_is_a_stable_hash_of_any_id() -> None:
    assert [partition_of(key, 4) for key in ("1", "order-7", "é")] == [
        zlib.crc32(key.encode()) % 4 for key in ("1", "order-7", "é")]
    assert 0 <= partition_of("\udc80 lone surrogate", 3) < 3  # any id CONTRACT §1 allows
    assert {partition_of(str(n), 2) for n in range(100)} == {0, 1}


def _messages(seed: int, orders: int, size: int) -> tuple[list[WalMessage], set[str]]:
    stream = generate(orders=orders, seed=seed, orphans=0.1)
    events = stream.events
    messages = [WalMessage(MSGPACK, encode_msgpack(events[i:i + size])) for i in range(0, len(events), size)]
    messages += messages[::7]  # redeliveries and publisher retries
    return messages, stream.expected


def _run_partitioned(messages: list[WalMessage], count: int, rng: random.Random, rules: list | None = None
                     ) -> tuple[list[str], list[Engine], list[list[bytes]]]:
    """Each ingress message to a random engine; handovers wait in their owner's queue and are
    taken in random order with the owner's later cycles. Returns every alert id fired, the
    engines and each one's log records."""
    engines = [_engine(p, count, rules) for p in range(count)]
    queues: list[list[WalMessage]] = [[] for _ in range(count)]
    logs: list[list[bytes]] = [[] for _ in range(count)]
    fired: list[str] = []
    stamp = 10_000
    pending = list(messages)
    while pending or any(queues):
        stamp += 10
        p = rng.randrange(count)
        ingress = [pending.pop(0)] if pending and rng.random() < 0.7 else []
        rng.shuffle(queues[p])
        taken = rng.randint(0, 3)
        handed, queues[p] = queues[p][:taken], queues[p][taken:]
        cycle = engines[p].cycle(ingress + handed, stamp, NOW)
        fired += [a.alert_id for a in cycle.alerts]
        if cycle.record:
            logs[p].append(cycle.record)
        for owner, body in cycle.handovers.items():
            assert owner != p
            queues[owner].append(WalMessage("", body, handed_over=True))
    for engine in engines:  # every book closes: the orphans' alerts
        fired += [a.alert_id for a in engine.cycle([], stamp + int(TTL * 1000) + 1, NOW).alerts]
    return fired, engines, logs


@hsettings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(2, 4), size=st.integers(1, 12), order=st.integers(0, 10**6))
def test_partitioned_engines_fire_exactly_the_alerts_of_one_engine_once(seed: int, count: int, size: int,
                                                                         order: int) -> None:
    messages, expected = _messages(seed, orders=40, size=size)
    fired, engines, logs = _run_partitioned(messages, count, random.Random(order))
    assert sorted(fired) == sorted(expected)  # each expected alert once, nothing else
    # Every book lived in its owner only.
    for p, engine in enumerate(engines):
        assert all(partition_of(key, count) == p for key in engine.books.done.of("trade_limits"))
    # Each partition's log rebuilds its own books (the ones the final close then closed).
    for p, records in enumerate(logs):
        rebuilt = _engine(p, count)
        for data in records:
            rebuilt.replay(decode_record(data), NOW)
        assert set(rebuilt.books.books["trade_limits"]) == set(engines[p].books.done.of("trade_limits"))


def test_a_rule_keyed_by_time_is_partitioned_by_its_partition_key() -> None:
    """The daily limit's book is `<day>:<client>`; it is partitioned by the client alone, so
    engines stamping purchases at different moments (either side of midnight) agree on the
    owner. Its orders' books spread over the partitions; each alert fires once."""
    daily = load_rule("client_daily_limit", {"max_shares": 10})
    rules = [rule, daily]
    purchases = [Purchase(f"p{n}", f"o{n}", 4, "acme", "s") for n in range(8)]  # 32 shares for one client
    messages = [WalMessage(MSGPACK, encode_msgpack([p])) for p in purchases]
    fired, engines, _ = _run_partitioned(messages, 3, random.Random(1), rules)
    assert sum(a.startswith("client_daily_limit:") for a in fired) == 1
    assert sorted(a for a in fired if a.startswith("purchase_without_request")) == [
        f"purchase_without_request:o{n}" for n in range(8)]
    owners = [p for p, engine in enumerate(engines)  # a day's book lives past the final close
              if engine.books.books["client_daily_limit"] or engine.books.done.of("client_daily_limit")]
    assert owners == [partition_of("acme", 3)]
    assert len({p for p, e in enumerate(engines) if e.books.done.of("trade_limits")}) > 1


def test_a_handover_from_an_engine_partitioned_otherwise_is_refused_whole() -> None:
    two = _engine(0, 2)
    cycle = two.cycle([WalMessage(MSGPACK, encode_msgpack([PurchaseRequest(str(n), 5, "c", "s")
                                                           for n in range(20)]))], 1_000, NOW)
    [(owner, body)] = cycle.handovers.items()
    three = _engine(owner, 3)
    refused = three.cycle([WalMessage("", body, handed_over=True)], 1_000, NOW)
    assert refused.applied == 0 and decode_record(refused.record).messages == []  # type: ignore[arg-type]
    [(index, reject)] = refused.rejects
    assert index == 0 and isinstance(reject, HandoverRefused) and "partitions=2" in reject.reason
    garbled = _engine(owner, 2).cycle([WalMessage("", b"\xc1 not msgpack", handed_over=True)], 1_000, NOW)
    assert garbled.applied == 0 and "unreadable handover" in garbled.rejects[0][1].reason
    lone = _engine().cycle([WalMessage("", body, handed_over=True)], 1_000, NOW)
    assert lone.applied == 0 and "not partitioned" in lone.rejects[0][1].reason


def test_partitioning_refuses_an_index_outside_its_count() -> None:
    with pytest.raises(ValueError, match=r"not one of 0\.\.1"):
        Partitioning([rule], 2, 2)
