"""The trade codec: all three wire forms, batches judged per element, one typed error."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from aldebaran.trades.codec import (
    MSGPACK,
    Decoded,
    DecodeError,
    decode_message,
    encode_json,
    encode_msgpack,
    encode_text,
)
from aldebaran.trades.events import MAX_SHARES, Purchase, PurchaseRequest, TradeEvent

DOC_REQUEST = b"id:1\n# shares: 100\nclient: Sendence\nstock: AAPL\n"
DOC_PURCHASE_2 = b"id:2\ninitial order id: 1\n# shares: 90\nclient: Sendence\nstock: AAPL\n"
DOC_PURCHASE_3 = b"id:3\ninitial order id: 1\n# shares: 30\nclient: Sendence\nstock: AAPL\n"

# Text-form-safe strings: no line breaks, no surrounding blanks.
label = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=30).map(
    str.strip).filter(bool)
ident = st.one_of(label, st.integers(min_value=0, max_value=10**12).map(str))
shares = st.integers(min_value=1, max_value=MAX_SHARES)
requests = st.builds(PurchaseRequest, id=ident, shares=shares, client=label, stock=label)
purchases = st.builds(Purchase, id=ident, order_id=ident, shares=shares, client=label, stock=label)
events = st.one_of(requests, purchases)


def test_design_document_examples_decode_exactly() -> None:
    assert decode_message(DOC_REQUEST).events == [PurchaseRequest("1", 100, "Sendence", "AAPL")]
    assert decode_message(DOC_PURCHASE_2).events == [Purchase("2", "1", 90, "Sendence", "AAPL")]
    assert decode_message(DOC_PURCHASE_3).events == [Purchase("3", "1", 30, "Sendence", "AAPL")]


def test_publisher_shape_with_integer_ids() -> None:
    body = json.dumps({"id": 2, "initial_order_id": 1, "#shares": 90, "client": "S", "stock": "AAPL"})
    assert decode_message(body.encode()).events == [Purchase("2", "1", 90, "S", "AAPL")]


@given(events)
def test_json_object_round_trip(event) -> None:
    body = msgspec.json.encode(event.to_wire())
    assert decode_message(body).events == [event]


@given(events)
def test_text_form_round_trip(event) -> None:
    assert decode_message(encode_text(event)).events == [event]


@given(st.lists(events, min_size=1, max_size=50))
def test_json_batch_round_trip(batch) -> None:
    decoded = decode_message(encode_json(batch))
    assert decoded.events == batch and decoded.rejects == []


@given(st.lists(events, min_size=1, max_size=50))
def test_msgpack_batch_round_trip(batch) -> None:
    decoded = decode_message(encode_msgpack(batch), MSGPACK)
    assert decoded.events == batch and decoded.rejects == []


def test_bad_element_in_batch_is_rejected_alone() -> None:
    good = {"id": "a", "#shares": 5, "client": "c", "stock": "s"}
    bad = {"id": "b", "#shares": -5, "client": "c", "stock": "s"}
    decoded = decode_message(json.dumps([good, bad, good | {"id": "c"}]).encode())
    assert [e.id for e in decoded.events] == ["a", "c"]
    assert len(decoded.rejects) == 1
    reject = decoded.rejects[0]
    assert reject.reason == "#shares must be a positive integer, got -5"
    assert reject.index == 1 and json.loads(reject.raw) == bad


def test_reasons_are_readable() -> None:
    cases = {
        b'{"id": 1, "client": "c", "stock": "s"}': "missing field '#shares'",
        b'{"id": 1, "#shares": 0, "client": "c", "stock": "s"}': "#shares must be a positive integer, got 0",
        b'{"id": 1, "#shares": 1.5, "client": "c", "stock": "s"}': "#shares must be a positive integer, got 1.5",
        b'{"id": "", "#shares": 1, "client": "c", "stock": "s"}': "id must be a non-empty string or an integer, got ''",
        b'{"id": true, "#shares": 1, "client": "c", "stock": "s"}':
            "id must be a non-empty string or an integer, got True",
        b"[]": "empty batch",
        b"\xff\x00": "neither JSON nor the text form: not valid UTF-8",
        b"id:1\nnonsense": "text form line without ':': 'nonsense'",
        b"": "empty message",
    }
    for body, reason in cases.items():
        decoded = decode_message(body)
        assert decoded.events == [], body
        assert [r.reason for r in decoded.rejects] == [reason], body


def test_oversized_body_is_rejected() -> None:
    body = encode_json([PurchaseRequest("1", 1, "c", "s")] * 100)
    decoded = decode_message(body, max_bytes=1024)
    assert decoded.events == []
    assert decoded.rejects[0].reason.startswith(f"message of {len(body)} bytes exceeds the limit of 1024")


def test_deep_nesting_and_huge_integers_are_rejected() -> None:
    assert decode_message(b"[" * 100_000).rejects[0].reason
    huge = b'{"id": 1, "#shares": 123456789012345678901234567890, "client": "c", "stock": "s"}'
    assert decode_message(huge).rejects[0].reason.startswith("#shares must be at most")
    # An integer of 5,000 digits is past what Python and Spark's JSON reader (1,000 digits) read:
    # the whole batch is refused with its reason, good neighbour too, as the audit reads it.
    good = b'{"id": "ok", "#shares": 1, "client": "c", "stock": "s"}'
    unread = decode_message(b'[{"id": ' + b"9" * 5000 + b', "#shares": 1, "client": "c", "stock": "s"}, ' + good + b"]")
    assert (unread.events, [r.reason for r in unread.rejects]) == (
        [], ["not valid JSON: Integer value out of range - at `$[0][...]`"])


@hsettings(max_examples=400)
@given(st.binary(max_size=400), st.sampled_from([None, "application/json", MSGPACK, "text/plain"]))
def test_arbitrary_bytes_yield_events_or_typed_errors(body, content_type) -> None:
    decoded = decode_message(body, content_type)
    for event in decoded.events:
        assert isinstance(event, TradeEvent) and event.shares > 0
    for reject in decoded.rejects:
        assert isinstance(reject, DecodeError) and reject.reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["id", "#shares", "initial_order_id", "client", "stock", "x"]), children, max_size=6),
    max_leaves=20,
)


@hsettings(max_examples=400)
@given(json_values)
def test_arbitrary_json_yields_events_or_typed_errors(value) -> None:
    decoded = decode_message(json.dumps(value).encode())
    assert decoded.events or decoded.rejects
    assert all(isinstance(r, DecodeError) and r.reason for r in decoded.rejects)


def test_unicode_digits_are_not_share_counts_and_keep_their_neighbours() -> None:
    for digits in ("\u00b2", "\u0663"):  # superscript two, Arabic-Indic three: isdigit(), not ASCII
        body = json.dumps([{"id": "n1", "#shares": 5, "client": "c", "stock": "s"},
                           {"id": "n2", "#shares": digits, "client": "c", "stock": "s"}]).encode()
        decoded = decode_message(body)
        assert [e.id for e in decoded.events] == ["n1"]
        assert [r.reason for r in decoded.rejects] == [f"#shares must be a positive integer, got {digits!r}"]


# --- the batch fast path agrees with the per-element path --------------------------------

def _outcome(decoded) -> tuple[list, list]:
    return decoded.events, [(r.reason, r.index, r.raw) for r in decoded.rejects]


wire_values = st.one_of(
    ident, label, st.just(""), st.just("   "), st.just("\u00a0"), st.text(max_size=3),
    st.text(min_size=199, max_size=202),
    st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=-2, max_value=2), st.booleans(),
    st.none(), st.floats(allow_nan=False), st.just("12"), st.just(" 7 "), st.just("\u00b2"),
    st.just(MAX_SHARES), st.just(MAX_SHARES + 1), st.just(10**201), st.lists(st.integers(), max_size=2),
)
wire_keys = st.sampled_from(["id", "#shares", "initial_order_id", "client", "stock", "# Shares", "Initial Order ID",
                             "initialorderid", "ID", "x", "shares"])


def _mutated(event):
    """A wire dict of `event`, with some fields replaced, dropped or added under other spellings."""
    return st.tuples(
        st.dictionaries(wire_keys, wire_values, max_size=3),
        st.lists(st.sampled_from(["id", "#shares", "initial_order_id", "client", "stock"]), max_size=2),
    ).map(lambda change: {k: v for k, v in {**event.to_wire(), **change[0]}.items() if k not in change[1]})


elements = st.one_of(
    events.map(lambda e: e.to_wire()),
    events.flatmap(_mutated),
    st.builds(lambda e, i: {**e.to_wire(), "id": i, **({} if e.is_request else {"initial_order_id": i})},
              events, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    json_values,
)


@hsettings(max_examples=500)
@given(st.one_of(st.lists(elements, max_size=12), elements), st.sampled_from(["json", "msgpack"]))
def test_fast_path_agrees_with_the_per_element_path(value, form) -> None:
    if form == "json":
        body, content_type = json.dumps(value).encode(), None
    else:
        try:
            body, content_type = msgspec.msgpack.encode(value), MSGPACK
        except OverflowError:  # msgpack has no integers beyond 64 bits
            assume(False)
    assert _outcome(decode_message(body, content_type)) == _outcome(decode_message(body, content_type, fast=False))


@hsettings(max_examples=300)
@given(st.binary(max_size=300), st.sampled_from([None, "application/json", MSGPACK]))
def test_fast_path_agrees_on_arbitrary_bytes(body, content_type) -> None:
    assert _outcome(decode_message(body, content_type)) == _outcome(decode_message(body, content_type, fast=False))


@given(st.lists(events, min_size=1, max_size=50))
def test_valid_batches_take_the_fast_path(batch) -> None:
    from aldebaran.trades import codec

    for encode, (direct, _) in ((encode_msgpack, codec._msgpack_direct), (encode_json, codec._json_direct)):
        assert codec._shared(direct.decode(encode(batch))) == batch


@given(st.lists(st.tuples(events, st.integers(min_value=-(2**63), max_value=2**63 - 1)), min_size=1, max_size=20))
def test_integer_ids_take_the_second_fast_path_and_become_strings(pairs) -> None:
    from aldebaran.trades import codec

    body = msgspec.msgpack.encode([{**event.to_wire(), "id": number} for event, number in pairs])
    expected = [TradeEvent(str(number), e.shares, e.client, e.stock, e.initial_order_id) for e, number in pairs]
    assert codec._typed(codec._msgpack_wire[0].decode(body)) == expected
    assert decode_message(body, MSGPACK).events == expected


def test_events_of_different_messages_share_one_string_per_client_and_stock() -> None:
    """Millions of open events name a few clients and stocks: each name is one string, not two
    fresh ones per event (an open book's memory, docs/engine.md)."""
    client, stock = "".join(["Desk", "-", "7"]), "".join(["ISIN", "DE0001"])  # built here: not constants
    first = decode_message(encode_msgpack([PurchaseRequest("r-1", 10, client, stock)]), MSGPACK)
    second = decode_message(encode_msgpack([Purchase("p-1", "r-1", 5, client, stock)]), MSGPACK)
    [request], [purchase] = first.events, second.events
    assert request.client == client and purchase.stock == stock
    assert request.client is purchase.client and request.stock is purchase.stock


def test_past_the_shared_labels_cap_a_new_label_still_decodes_unshared(monkeypatch) -> None:
    from aldebaran.trades import codec

    monkeypatch.setattr(codec, "MAX_SHARED_LABELS", len(codec._LABELS))
    decoded = decode_message(encode_msgpack([PurchaseRequest("r-2", 10, "Fresh Client 42", "Fresh Stock 42")]),
                             MSGPACK)
    assert [(e.client, e.stock) for e in decoded.events] == [("Fresh Client 42", "Fresh Stock 42")]
    assert "Fresh Client 42" not in codec._LABELS
    blank = decode_message(encode_msgpack([PurchaseRequest("r-3", 10, "   ", "AAPL")]), MSGPACK)
    assert blank.events == [] and "client" in blank.rejects[0].reason


# Whitespace other than the space is a character: ids and labels of it are kept, in both paths and
# in the audit, whose Spark `trim` takes off spaces alone (`spark_analytics.bodies` reads as Spark).
WHITESPACE = ["", " ", "   ", "\t", "\n", " \t ", "\u00a0", "\u2003", "\u3000", "\u0085", "\x1c", " a ", "\ta"]


@pytest.mark.parametrize("field", ["id", "initial_order_id", "client", "stock"])
@pytest.mark.parametrize("value", WHITESPACE)
def test_ids_and_labels_of_whitespace_are_judged_as_the_audit_judges_them(field: str, value: str) -> None:
    from spark_analytics.bodies import _generic

    element = {"id": "w-1", "#shares": 3, "client": "c", "stock": "s", field: value}
    body = json.dumps([element]).encode()
    audit_keeps = _generic(body, True)[0] is not None
    for fast in (True, False):
        for encoded, content_type in ((body, None), (msgspec.msgpack.encode([element]), MSGPACK)):
            decoded = decode_message(encoded, content_type, fast=fast)
            assert bool(decoded.events) == audit_keeps == bool(value.strip(" ")), (decoded, fast, content_type)


def _agreed(decoded: Decoded) -> list[tuple[str, str | None, int]]:
    return [(event.id, event.initial_order_id, event.shares) for event in decoded.events]


SHARE_TEXTS = ["5", " 5 ", " \t5", "\t5", "5\n", "5\r\n", "5\r", "5\n\n", "5\u2028", "\u00a05", "05", "0", "-3",
               "1" * 17, "²", "5 5", "+5", "5.0"]
KEYS = ["#shares", "# Shares", "#\tshares", "#_SHARES", "#\u00a0shares", " #shares ", "#shares\u3000", "\uff03shares"]


@pytest.mark.parametrize("shares", SHARE_TEXTS)
@pytest.mark.parametrize("key", KEYS)
def test_share_texts_and_key_spellings_are_read_as_the_audit_reads_them(shares: str, key: str) -> None:
    """The audit reads `#shares` as Spark does: spaces trimmed, 1-16 ASCII digits, one line end
    at most (Java's `$`); keys without ASCII whitespace or underscores, in lower case."""
    from spark_analytics.bodies import _generic

    body = json.dumps([{"id": "r-1", key: shares, "client": "c", "stock": "s"}]).encode()
    audit = [element for element in _generic(body, True) if element is not None]
    assert _agreed(decode_message(body)) == audit
    assert _agreed(decode_message(body, fast=False)) == audit


TEXT_FORMS = ["id: 7\n# shares: 5\nclient: c\nstock: s", "id: 7\r\n#shares: 5\r\nclient: c\r\nstock: s\r\n",
              "id:\t7\n#shares: 5\nclient: c\nstock: s", "id: 7\n\t\n#shares: 5\nclient: c\nstock: s",
              "id: 7\r#shares: 5\rclient: c\rstock: s", "id: 7\u2028#shares: 5\nclient: c\nstock: s",
              "id: 7\n#shares: 5\nclient: c\nstock: s\ninitial order id: 3",
              "id: 7\n\n\n#shares: 5\nclient: c\nstock: s",
              "id: 7 \n#shares:\u00a05\nclient: c\nstock: s", "id: 7\n#shares: 5\nclient: \t\nstock: s"]


@pytest.mark.parametrize("text", TEXT_FORMS)
def test_text_forms_are_read_as_the_audit_reads_them(text: str) -> None:
    from spark_analytics.bodies import _text_form

    audit = [element for element in _text_form(text) if element is not None]
    assert _agreed(decode_message(text.encode())) == audit
