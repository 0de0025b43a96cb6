"""Trade data on the wire: JSON objects, the design document's text form, batches, msgpack.

Every way a message can be wrong ends in one `DecodeError` with a reason a person can
act on; nothing else escapes `decode_message`. A batch is judged element by element,
so one bad element is rejected and its neighbours go on.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from aldebaran.trades import internal_form
from aldebaran.trades.events import (
    MAX_ID_BYTES,
    MAX_SHARES,
    PURCHASE,
    REQUEST,
    SHORT_ID,
    Label,
    Purchase,
    PurchaseRequest,
    Shares,
    TradeEvent,
    id_too_long,
)

JSON = "application/json"
MSGPACK = "application/msgpack"
TEXT = "text/plain"


class DecodeError(ValueError):
    """One unreadable message or batch element, with the reason and the offending bytes."""

    def __init__(self, reason: str, raw: bytes = b"", index: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw
        self.index = index


@dataclass(slots=True)
class Decoded:
    """What one AMQP message held: the good events and the rejected elements."""

    events: list[TradeEvent] = field(default_factory=list)
    rejects: list[DecodeError] = field(default_factory=list)


# Fast path: msgspec validates the common, correct shape in C, a whole batch per call, straight
# into `TradeEvent`s. It accepts a subset of what `event_from_mapping` accepts and yields the
# same events for it: exact key names only (an unknown or differently spelt key fails the fast
# decode), share counts as integers in range, labels of 1-200 characters. Integer ids fail it
# and take a second fast decode into wire structs (`_Wire`), turned into events in Python. What
# msgspec cannot judge cheaply in C (a label of only spaces: a regex per string costs 4x the
# whole decode; an id over 200 bytes of UTF-8) is checked after, in `_shared` or `_typed`.
# Anything the fast path refuses goes through the per-element path, which alone words the rejects.
_IntId = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # str() of it: <= 20 characters


class _Wire(msgspec.Struct, rename={"shares": "#shares"}, forbid_unknown_fields=True, gc=False):
    id: Label | _IntId
    shares: Shares
    client: Label
    stock: Label
    initial_order_id: Label | _IntId | None = None


_json_direct = (msgspec.json.Decoder(list[TradeEvent]), msgspec.json.Decoder(TradeEvent))
_json_wire = (msgspec.json.Decoder(list[_Wire]), msgspec.json.Decoder(_Wire))
_msgpack_direct = (msgspec.msgpack.Decoder(list[TradeEvent]), msgspec.msgpack.Decoder(TradeEvent))
_msgpack_wire = (msgspec.msgpack.Decoder(list[_Wire]), msgspec.msgpack.Decoder(_Wire))
_json_any = msgspec.json.Decoder()
_msgpack_any = msgspec.msgpack.Decoder()
_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()

# The keys, normalised: lower case, without ASCII whitespace or underscores anywhere (`# Shares`,
# `initial order id`). Whitespace here is what the audit's Spark functions take it to be: ASCII
# whitespace in keys, spaces around values, `\r?\n` between text-form lines.
_KEYS = {"id": "id", "#shares": "#shares", "initialorderid": "initial_order_id",
         "client": "client", "stock": "stock"}
_KEY_JUNK = str.maketrans("", "", " _\t\r\n\f\v")
# ASCII digits ("²" and "٣" are str.isdigit() too), at most 16, and one line end: Java's `$`.
_SHARE_TEXT = re.compile(r"([0-9]{1,16})(?:\r\n|\n|\r)?")


def _norm_key(key: str) -> str:
    return key.translate(_KEY_JUNK).lower()


def _ident(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DecodeError(f"{name} must be a non-empty string or an integer, got {_show(value)}")
    text = str(value) if isinstance(value, int) else value
    if not text.strip(" "):
        raise DecodeError(f"{name} must be a non-empty string or an integer, got {_show(value)}")
    if (size := id_too_long(text)) is not None:
        raise DecodeError(f"{name} must be at most {MAX_ID_BYTES} bytes of UTF-8, got {size}")
    return text


def _shares(value: Any) -> int:
    if isinstance(value, str) and (digits := _SHARE_TEXT.fullmatch(value.strip(" "))):
        value = int(digits[1])
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DecodeError(f"#shares must be a positive integer, got {_show(value)}")
    if value > MAX_SHARES:
        raise DecodeError(f"#shares must be at most {MAX_SHARES}, got {_show(value)}")
    return value


def _label(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip(" "):
        raise DecodeError(f"{name} must be a non-empty string, got {_show(value)}")
    if len(value) > 200:
        raise DecodeError(f"{name} must be at most 200 characters, got {len(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def event_from_mapping(obj: Any) -> TradeEvent:
    """Validate one decoded object (JSON, msgpack or text form) into a typed event."""
    if not isinstance(obj, dict):
        raise DecodeError(f"an event must be an object, got {type(obj).__name__}")
    fields: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(key, str) and (canonical := _KEYS.get(_norm_key(key))):
            fields[canonical] = value
    for required in ("id", "#shares", "client", "stock"):
        if required not in fields:
            raise DecodeError(f"missing field {required!r}")
    ident = _ident(fields["id"], "id")
    shares = _shares(fields["#shares"])
    client = _label(fields["client"], "client")
    stock = _label(fields["stock"], "stock")
    order = fields.get("initial_order_id")
    if order is None:
        return PurchaseRequest(id=ident, shares=shares, client=client, stock=stock)
    return Purchase(id=ident, order_id=_ident(order, "initial_order_id"), shares=shares,
                    client=client, stock=stock)


def _shared(events: list[TradeEvent]) -> list[TradeEvent] | None:
    """Fast-decoded `events` with their clients and stocks shared, or None when an id or a label
    is blank (spaces only, as the audit's Spark `trim` reads it) or an id too long (the slow path
    words it). The checks stay inline: a call per event cost ~6 % of the engine step."""
    labels = _LABELS
    for event in events:
        ident, order = event.id, event.initial_order_id
        # Blank: spaces only. `isspace()` first, as cheap as before for every other id (min_length=1).
        if (ident.isspace() and not ident.strip(" ")) or (len(ident) > SHORT_ID and id_too_long(ident) is not None):
            return None
        if order is not None and ((order.isspace() and not order.strip(" "))
                                  or (len(order) > SHORT_ID and id_too_long(order) is not None)):
            return None
        client = event.client = labels.get(event.client) or _new_label(event.client)
        stock = event.stock = labels.get(event.stock) or _new_label(event.stock)
        if not (client and stock):
            return None
    return events


def _typed(wires: list[_Wire]) -> list[TradeEvent] | None:
    """The events of a batch fast-decoded into wire structs, integer ids made strings, checked
    and shared by `_shared`; None when it refuses them (the slow path words why)."""
    return _shared([TradeEvent(str(wire.id), wire.shares, wire.client, wire.stock,
                               None if wire.initial_order_id is None else str(wire.initial_order_id))
                    for wire in wires])  # msgspec never yields a bool for an integer id


# Clients and stocks are few and repeat across millions of open events: one string each, shared by
# every event that names it, instead of two fresh strings per event (~30 % of an open book's
# memory). At most this many are kept (~16 MB of 200-character labels); past it a new label is not
# shared, and none is ever forgotten.
MAX_SHARED_LABELS = 65_536
_LABELS: dict[str, str] = {}


def _new_label(text: str) -> str:
    """`text` shared from now on, or "" when it is blank (the slow path words the error)."""
    if not text.strip(" "):
        return ""
    if len(_LABELS) < MAX_SHARED_LABELS:
        _LABELS[text] = text
    return text


def _decode_fast(body: bytes, batch: Any, one: Any) -> list[Any]:
    """A whole batch (or one object) decoded and validated in one msgspec call."""
    try:
        return batch.decode(body)
    except msgspec.ValidationError:
        return [one.decode(body)]


def _fast(body: bytes, direct: tuple[Any, Any], wire: tuple[Any, Any]) -> list[TradeEvent] | None:
    """The events of a well-formed message, decoded in C, or None for the slow path to judge."""
    try:
        try:
            events = _decode_fast(body, *direct)
        except msgspec.ValidationError:  # an integer id, or an element the slow path must word
            wires = _decode_fast(body, *wire)
            return _typed(wires) if wires else None
    except Exception:  # noqa: BLE001 - whatever the fast path refuses, the slow path judges
        return None
    return _shared(events) if events else None


def parse_text_form(text: str) -> dict[str, str]:
    """The design document's `key: value` lines (`id:1`, `# shares: 100`, ...)."""
    fields: dict[str, str] = {}
    for line in re.split(r"\r?\n", text):
        if not line.strip(" "):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise DecodeError(f"text form line without ':': {_show(line)}")
        name = _KEYS.get(_norm_key(key))
        if name is None:
            raise DecodeError(f"text form has an unknown field {_show(key.strip(' '))}")
        if name in fields:
            raise DecodeError(f"text form repeats the field {name!r}")
        fields[name] = value.strip(" ")
    if not fields:
        raise DecodeError("empty message")
    return fields


def _elements(items: Iterable[Any], encode: Any, decoded: Decoded) -> None:
    for index, item in enumerate(items):
        try:
            decoded.events.append(event_from_mapping(item))
        except DecodeError as exc:
            exc.index, exc.raw = index, _safe_encode(encode, item)
            decoded.rejects.append(exc)


def _safe_encode(encode: Any, item: Any) -> bytes:
    try:
        return encode(item)
    except Exception:  # noqa: BLE001 - a reject must carry *some* bytes
        return repr(item).encode()[:4096]


def decode_message(body: bytes, content_type: str | None = None, max_bytes: int = 1 << 20,
                   *, fast: bool = True) -> Decoded:
    """Decode one AMQP message body into events and per-element rejects. Never raises.

    `fast=False` skips the batch fast path: the reference the fast path is tested against.
    """
    decoded = Decoded()
    try:
        if len(body) > max_bytes:
            raise DecodeError(f"message of {len(body)} bytes exceeds the limit of {max_bytes}")
        if content_type == MSGPACK:
            if fast and (events := _fast(body, _msgpack_direct, _msgpack_wire)) is not None:
                decoded.events = events
                return decoded
            _decode_structured(body, decoded, _msgpack_any, _msgpack_encoder.encode, "msgpack")
            return decoded
        stripped = body.lstrip()
        if stripped[:1] in (b"{", b"["):
            if fast and (events := _fast(body, _json_direct, _json_wire)) is not None:
                decoded.events = events
                return decoded
            _decode_structured(body, decoded, _json_any, _json_encoder.encode, "JSON")
            return decoded
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("neither JSON nor the text form: not valid UTF-8") from None
        decoded.events.append(event_from_mapping(parse_text_form(text)))
    except DecodeError as exc:
        exc.raw = exc.raw or body
        decoded.rejects.append(exc)
    except RecursionError:
        decoded.rejects.append(DecodeError("structure nested too deeply", body))
    except Exception as exc:  # noqa: BLE001 - the codec's promise: only DecodeError comes out
        decoded.events.clear()
        decoded.rejects.append(DecodeError(f"unreadable message ({type(exc).__name__}: {exc})", body))
    return decoded


def _decode_structured(body: bytes, decoded: Decoded, anything: Any, encode: Any, what: str) -> None:
    """The per-element path: every element judged on its own, each reject with its reason."""
    try:
        value = anything.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"not valid {what}: {exc}") from None
    if isinstance(value, list):
        if not value:
            raise DecodeError("empty batch")
        _elements(value, encode, decoded)
    else:
        decoded.events.append(event_from_mapping(value))


SUMMARY_OVER = 10  # rejects in one message beyond which they become one summary dead letter


def dead_letters(decoded: Decoded, body: bytes, limit: int = SUMMARY_OVER) -> list[DecodeError]:
    """What to dead-letter for one message: each reject alone, or one summary of them all.

    A batch of 3,000 junk elements must not become 3,000 dead letters (and log lines):
    past `limit` rejects the whole message is dead-lettered once, its reason counting
    each distinct reason with its first index. Every consumer of trade data calls this.
    """
    rejects = decoded.rejects
    if len(rejects) <= limit:
        return rejects
    kinds: dict[str, list[int]] = {}
    for reject in rejects:
        seen = kinds.setdefault(reject.reason, [0, reject.index if reject.index is not None else -1])
        seen[0] += 1
    total = len(rejects) + len(decoded.events)
    parts = [f"{count} x {reason} (first at index {first})"
             for reason, (count, first) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:20]]
    more = f"; and {len(kinds) - 20} other reasons" if len(kinds) > 20 else ""
    reason = f"{len(rejects)} of {total} batch elements rejected: " + "; ".join(parts) + more
    return [DecodeError(reason[:4000], body)]


def encode_json(events: Iterable[TradeEvent]) -> bytes:
    """A JSON array batch in the public wire form."""
    return _json_encoder.encode(list(events))


def encode_msgpack(events: Iterable[TradeEvent]) -> bytes:
    """A msgpack array batch (content type application/msgpack)."""
    return _msgpack_encoder.encode(list(events))


def encode_text(event: TradeEvent) -> bytes:
    """The design document's text form of one event."""
    lines = [f"id:{event.id}"]
    if event.initial_order_id is not None:
        lines.append(f"initial order id: {event.initial_order_id}")
    lines += [f"# shares: {event.shares}", f"client: {event.client}", f"stock: {event.stock}"]
    return "\n".join(lines).encode()


_order_of = operator.attrgetter("initial_order_id")


class TradeCodec:
    """The trade domain's codec as the core uses it: public wire forms in, compact msgpack inside."""

    name = "trades"
    event_types = (TradeEvent,)  # every event `decode` and `unpack` can yield

    def decode(self, body: bytes, content_type: str | None, max_bytes: int) -> Decoded:
        return decode_message(body, content_type, max_bytes)

    def dead_letters(self, decoded: Decoded, body: bytes) -> list[DecodeError]:
        return dead_letters(decoded, body)

    def kinds(self, events: list[TradeEvent]) -> dict[str, int]:
        """Events per kind (the events metric's `type`), counted in C: a Python loop per event
        would cost as much as the counting is worth."""
        requests = list(map(_order_of, events)).count(None)
        return {kind: number for kind, number in ((REQUEST, requests), (PURCHASE, len(events) - requests)) if number}

    pack = staticmethod(internal_form.pack)
    unpack = staticmethod(internal_form.unpack)
    pack_many = staticmethod(internal_form.pack_many)
    unpack_many = staticmethod(internal_form.unpack_many)

    def describe(self, event: TradeEvent) -> dict[str, str]:
        """Log context for one event."""
        return {"event_id": event.id, "order_id": event.order_id}


TRADE_CODEC = TradeCodec()
