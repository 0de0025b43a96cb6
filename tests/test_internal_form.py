"""The packed form of trade events inside Aldebaran, and the form before it (read after an upgrade)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aldebaran.trades.codec import TRADE_CODEC
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent

text = st.text(min_size=1, max_size=20)
events = st.builds(TradeEvent, id=text, shares=st.integers(min_value=1, max_value=10**15), client=text,
                   stock=text, initial_order_id=st.none() | text)


def _tagged(event: TradeEvent) -> dict[str, object]:
    """An event as the workers before 2026-12-02 packed it: tagged with its class."""
    if event.is_request:
        return {"type": "request", "id": event.id, "shares": event.shares, "client": event.client,
                "stock": event.stock}
    return {"type": "purchase", "id": event.id, "order_id": event.initial_order_id, "shares": event.shares,
            "client": event.client, "stock": event.stock}


@given(st.lists(events, max_size=20))
def test_packed_events_come_back_equal(batch: list[TradeEvent]) -> None:
    assert TRADE_CODEC.unpack_many(TRADE_CODEC.pack_many(batch)) == batch
    for event in batch:
        assert TRADE_CODEC.unpack(TRADE_CODEC.pack(event)) == event


@given(st.lists(events, max_size=20))
def test_events_packed_in_the_tagged_form_before_the_upgrade_still_unpack(batch: list[TradeEvent]) -> None:
    assert TRADE_CODEC.unpack_many(msgspec.msgpack.encode([_tagged(e) for e in batch])) == batch
    for event in batch:
        assert TRADE_CODEC.unpack(msgspec.msgpack.encode(_tagged(event))) == event


def test_the_packed_form_is_the_public_one_without_a_tag() -> None:
    packed = msgspec.msgpack.decode(TRADE_CODEC.pack_many([PurchaseRequest("o1", 10, "c", "s"),
                                                           Purchase("p1", "o1", 11, "c", "s")]))
    assert packed == [{"id": "o1", "#shares": 10, "client": "c", "stock": "s"},
                      {"id": "p1", "#shares": 11, "client": "c", "stock": "s", "initial_order_id": "o1"}]


@pytest.mark.parametrize("junk", [b"\xc1", msgspec.msgpack.encode({"type": "refund", "id": "x"}),
                                  msgspec.msgpack.encode([{"id": "x"}])])
def test_what_is_neither_form_raises_a_value_error(junk: bytes) -> None:
    with pytest.raises(ValueError):
        TRADE_CODEC.unpack(junk)
    with pytest.raises(ValueError):
        TRADE_CODEC.unpack_many(junk)


def test_a_bad_packed_event_is_refused_for_what_is_wrong_with_it() -> None:
    bad = msgspec.msgpack.encode({"id": "p1", "#shares": 0, "client": "c", "stock": "s"})
    with pytest.raises(ValueError, match=r"#shares.*nor the tagged form"):
        TRADE_CODEC.unpack(bad)
    with pytest.raises(ValueError, match=r"#shares.*nor the tagged form"):
        TRADE_CODEC.unpack_many(msgspec.msgpack.encode([msgspec.msgpack.decode(bad)]))
