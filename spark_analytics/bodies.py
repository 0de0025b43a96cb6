"""Trade bodies split into their elements in the Python workers (msgspec), one Arrow batch at a time.

Spark's own functions (`wire.element_maps`: `from_json` into string maps, the text form by
`split`, an Arrow UDF for msgpack) remain the definition of what a body means; this module
gives the same elements several times cheaper (a 1000-event JSON batch is one msgspec call
into typed structs instead of 1000 string maps). Where it could disagree with Spark it does
not guess: a JSON body that is not strict JSON (trailing bytes, single quotes, `NaN`,
control characters), or whose values are not strings, integers, booleans or null (floats
and nested values are rendered by Spark's parser), comes back as one row with `spark_text`
set (and `idx` DEFERRED). The walk counts such rows; when there are any, the audit walks
again with `records.elements(spark_parser=True)`, which reads them with `wire.element_maps`.

`tests/test_audit_bodies.py` checks the two against each other on random bodies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_analytics import body_decode
from spark_analytics.wire import JSON_KEYS, MAX_LABEL, MAX_SHARES, NORMAL_KEYS

ELEMENT_SCHEMA = ("vhost string, ts long, idx int, valid boolean, etype string, event_id string, order_id string, "
                  "shares long, junk tinyint, spark_text string")
_ARROW = pa.schema([("vhost", pa.string()), ("ts", pa.int64()), ("idx", pa.int32()), ("valid", pa.bool_()),
                    ("etype", pa.string()), ("event_id", pa.string()), ("order_id", pa.string()),
                    ("shares", pa.int64()), ("junk", pa.int8()), ("spark_text", pa.string())])

DEFERRED = -1  # `idx` of a row whose body Spark's parser reads

_Label = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL)]
_Number = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # longer ones: `_generic`
_MAX_NUMBER = 1000  # Jackson's limit on a number's characters: Spark reads a longer one as no JSON at all


class _Event(msgspec.Struct, forbid_unknown_fields=True, rename={"shares": "#shares"}):
    """An element with exactly the JSON names and plain values: what publishers send. Anything
    else (another key spelling, a missing field, a bad share count) fails here and is read by
    `_generic`, which follows `wire.canonical` and `wire.element_values` step by step."""

    id: _Label
    shares: Annotated[int, msgspec.Meta(gt=0, le=MAX_SHARES)]
    client: _Label
    stock: _Label
    initial_order_id: _Label | None = None


class _NumberedEvent(msgspec.Struct, forbid_unknown_fields=True, rename={"shares": "#shares"}):
    """`_Event` with integer ids allowed (read as their decimal strings), tried second."""

    id: _Label | _Number
    shares: Annotated[int, msgspec.Meta(gt=0, le=MAX_SHARES)]
    client: _Label
    stock: _Label
    initial_order_id: _Label | _Number | None = None


_Decoders = tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]
_DECODERS: dict[bool, _Decoders] = {  # array? -> (str ids, int ids allowed)
    False: (msgspec.json.Decoder(_Event), msgspec.json.Decoder(_NumberedEvent)),
    True: (msgspec.json.Decoder(list[_Event]), msgspec.json.Decoder(list[_NumberedEvent]))}
_SHARES = re.compile(r"[0-9]{1,16}(?:\r\n|\n|\r)?")  # Java's `^[0-9]{1,16}$`, then a cast that trims \r, \n
_KEY_JUNK = str.maketrans("", "", " _\t\r\n\f\u000b")
_JSON = frozenset(JSON_KEYS)
_NORMAL = frozenset(NORMAL_KEYS)


class _Defer(Exception):
    """Spark's parser decides this body (see the module docstring)."""


# One element: (event_id, order_id or None, shares) when valid, else None.
Element = tuple[str, str | None, int] | None


def _label_ok(value: str | None, octets: bool = False) -> bool:
    if value is None or not value.strip(" "):
        return False
    return (len(value.encode()) if octets else len(value)) <= MAX_LABEL


def _shares(value: str | None) -> int | None:
    """`wire.element_values`' share check: trimmed of spaces, 1-16 ASCII digits, in (0, MAX_SHARES]."""
    if value is None:
        return None
    text = value.strip(" ")
    if not _SHARES.fullmatch(text):
        return None
    n = int(text.rstrip("\r\n"))
    return n if 0 < n <= MAX_SHARES else None


def _norm(key: str) -> str:
    return key.translate(_KEY_JUNK).lower()


def _element(m: dict[str, str | None] | None) -> Element:
    """`wire.canonical` then `wire.element_values` on one element's string map."""
    if m is None:
        return None
    if not all(k in _JSON for k in m):  # keys not all JSON names: matched as the codec does
        canon: dict[str, str | None] = {}
        for k, v in m.items():
            n = _norm(k)
            canon["initial_order_id" if n == "initialorderid" else n] = v
        m = canon
    event_id, order, shares = m.get("id"), m.get("initial_order_id"), _shares(m.get("#shares"))
    if (shares is None or not _label_ok(event_id, True) or not _label_ok(m.get("client"))
            or not _label_ok(m.get("stock")) or (order is not None and not _label_ok(order, True))):
        return None
    return event_id, order, shares  # type: ignore[return-value]  # event_id is a str once _label_ok


def _json_value(v: Any) -> str | None:
    """A JSON value as Spark's map<string,string> holds it, for the types rendered the same way."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and len(text := str(v)) <= _MAX_NUMBER:
        return text
    raise _Defer  # floats, objects, arrays: Spark's parser renders them (`1.0E20`, `{"a":1}`)


def _generic_json(raw: bytes | memoryview, array: bool) -> list[Element]:
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        # Strict JSON that merely stops early (a truncated body) is unreadable to Spark too; msgspec
        # also says "truncated" for a lone surrogate escape, which Spark reads as '?'.
        if str(exc).startswith("Input data was truncated") and b"\\u" not in bytes(raw):
            return []
        raise _Defer from exc
    items = doc if array else [doc]
    out: list[Element] = []
    for item in items:
        if item is None:        # Spark: a null element of the array, rejected
            out.append(None)
        elif isinstance(item, dict):
            out.append(_element({k: _json_value(v) for k, v in item.items()}))
        else:                   # Spark: the whole array is null (no element)
            return []
    return out


def _text_form(text: str) -> list[Element]:
    """`wire._text_form`: `key: value` lines, keys normalised; any odd line makes it unreadable."""
    lines = [line for line in re.split(r"\r?\n", text) if line.strip(" ")]
    pairs: dict[str, str] = {}
    for line in lines:
        key, colon, value = line.partition(":")
        key = _norm(key)
        if not colon or key not in _NORMAL or key in pairs:
            return []
        pairs[key] = value.strip(" ")
    return [_element(dict(pairs))] if pairs else []


def _msgpack_text(v: Any) -> str | None:
    """`wire._msgpack_json`'s rendering of a msgpack value."""
    if isinstance(v, bool):
        return "\u0000bool"
    if isinstance(v, (int, str)):
        return str(v)
    return None if v is None else "\u0000" + type(v).__name__


def _msgpack(body: bytes) -> list[Element]:
    try:
        obj = msgspec.msgpack.decode(body)
        items = obj if isinstance(obj, list) else [obj]
        maps = [{str(k): _msgpack_text(v) for k, v in item.items()} if isinstance(item, dict) else None
                for item in items]
    except Exception:  # noqa: BLE001 - unreadable (as wire._msgpack_json): no events
        return []
    return [_element(m) for m in maps]


def _generic(raw: bytes | memoryview, array: bool) -> list[Element]:
    """A JSON body the typed structs refused: element by element, as Spark would read it."""
    try:
        return _generic_json(raw, array)
    except ValueError as exc:  # an integer too long for str(): Spark's parser decides
        raise _Defer from exc


def _blank(values: list[str]) -> set[str]:
    """The values (checked once each) that hold nothing but spaces."""
    return {v for v in set(values) if not v.strip(" ")}


class _Batch:
    """One Arrow batch's rows, gathered column by column; arrays are built once per batch."""

    def __init__(self) -> None:
        self.counts: list[int] = []           # rows per message
        self.has_idx: list[bool] = []         # per message: elements, or one row for a message with none
        self.ids: list[str | int | None] = []
        self.orders: list[str | int | None] = []
        self.shares: list[int] = []
        self.judged: list[bool] = []          # per row: validity known (else the fast path's, checked by `_rows`)
        self.valid: list[bool] = []
        self.spark_text: dict[int, str] = {}  # first row of a message -> the body Spark's parser decides
        self.numbers = False                  # an id may be an int (else every id is a str or None)
        self.deferred: list[int] = []         # rows of messages that Spark's parser reads
        self.junk: dict[int, int] = {}        # row of a message whose body is junk -> `body_decode` reason

    def fast(self, events: list[_Event] | list[_NumberedEvent]) -> None:
        """Elements the typed structs read: what is left to check (blank labels, id bytes) is checked
        per batch, vectorised, except blank clients and stocks (rare: the message goes generic)."""
        n = len(events)
        self.ids += [e.id for e in events]
        self.orders += [e.initial_order_id for e in events]
        self.shares += [e.shares for e in events]
        self.judged += [False] * n
        self.valid += [True] * n
        self._message(n)

    def elements(self, elements: list[Element]) -> None:
        for e in elements:
            self.ids.append(e[0] if e else None)
            self.orders.append(e[1] if e else None)
            self.shares.append(e[2] if e else 0)
            self.valid.append(e is not None)
        self.judged += [True] * len(elements)
        self._message(len(elements))

    def none(self, spark_text: str | None = None, junk: int | None = None) -> None:
        """A message with no element (unreadable; `junk`: why, when its body is junk), or one that
        Spark's parser reads (`spark_text`)."""
        if junk is not None:
            self.junk[len(self.ids)] = junk
        if spark_text is not None:
            self.spark_text[len(self.ids)] = spark_text
            self.deferred.append(len(self.ids))
        self.ids.append(None)
        self.orders.append(None)
        self.shares.append(0)
        self.judged.append(True)
        self.valid.append(False)
        self.counts.append(1)
        self.has_idx.append(False)

    def _message(self, n: int) -> None:
        if n == 0:
            self.none()
            return
        self.counts.append(n)
        self.has_idx.append(True)


def _typed(raw: bytes | memoryview, array: bool, numbered: bool) -> list[_Event] | list[_NumberedEvent] | None:
    """The body's elements as typed structs, or None when one of them is not of that shape."""
    try:
        decoded = _DECODERS[array][numbered].decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    events = decoded if array else [decoded]
    if _blank([e.client for e in events]) or _blank([e.stock for e in events]):
        return None
    return events


def _json_body(out: _Batch, raw: bytes | memoryview, array: bool) -> None:
    events = _typed(raw, array, False)
    if events is None and (events := _typed(raw, array, True)) is not None:
        out.numbers = True
    if events is not None:
        out.fast(events)
        return
    try:
        out.elements(_generic(raw, array))
    except _Defer:
        out.none(bytes(raw).decode())


def _body(out: _Batch, text: bytes | memoryview | None, packed: bytes | None) -> None:
    """One trade message's rows (`wire.element_maps`' three forms, or msgpack)."""
    if packed is not None:
        out.elements(_msgpack(packed))
        return
    assert text is not None
    view = memoryview(text)
    start = 0
    while start < len(view) and view[start] == 0x20:  # Spark's ltrim: spaces only
        start += 1
    first = view[start] if start < len(view) else 0
    if first in (0x7B, 0x5B):  # { [
        _json_body(out, view[start:], first == 0x5B)
    else:
        out.elements(_text_form(bytes(view).decode()))


def _strings(values: list[str | int | None], numbers: bool) -> pa.Array:
    if numbers:
        values = [str(v) if type(v) is int else v for v in values]
    return pa.array(values, pa.string())


def _label_ok_arrow(labels: pa.Array) -> np.ndarray:
    """`_label_ok(octets=True)` over an array (null: False)."""
    trimmed = pc.utf8_trim(labels, " ")
    ok = pc.and_(pc.greater(pc.binary_length(trimmed), 0), pc.less_equal(pc.binary_length(labels), MAX_LABEL))
    return pc.fill_null(ok, False).to_numpy(zero_copy_only=False)


def _rows(out: _Batch, vhost: pa.Array, ts: pa.Array) -> pa.RecordBatch:
    counts = np.asarray(out.counts, dtype=np.int64)
    total = int(counts.sum())
    message = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    idx = np.arange(total, dtype=np.int32) - np.repeat(starts, counts).astype(np.int32)
    idx[out.deferred] = DEFERRED
    has_idx = np.repeat(np.asarray(out.has_idx, dtype=bool), counts)
    has_idx[out.deferred] = True
    ids, orders = _strings(out.ids, out.numbers), _strings(out.orders, out.numbers)
    valid = np.asarray(out.valid, dtype=bool)
    fast = ~np.asarray(out.judged, dtype=bool)
    if fast.any():
        request = np.asarray(pc.is_null(orders).to_numpy(zero_copy_only=False), dtype=bool)
        valid &= ~fast | (_label_ok_arrow(ids) & (request | _label_ok_arrow(orders)))
    invalid = pa.array(~valid)
    texts: list[str | None] = [None] * total
    for row, text in out.spark_text.items():
        texts[row] = text
    junk = np.zeros(total, dtype=np.int8)
    junk[list(out.junk)] = list(out.junk.values())
    return pa.RecordBatch.from_arrays([
        vhost.take(pa.array(message)), ts.take(pa.array(message)),
        pa.array(idx, mask=~has_idx), pa.array(valid),
        pc.if_else(invalid, pa.scalar(None, pa.string()),
                   pc.if_else(pc.is_null(orders), pa.scalar("request"), pa.scalar("purchase"))),
        pc.if_else(invalid, pa.scalar(None, pa.string()), ids),
        pc.if_else(invalid, pa.scalar(None, pa.string()), pc.coalesce(orders, ids)),
        pa.array(np.asarray(out.shares, dtype=np.int64), mask=~valid),
        pa.array(junk, mask=junk == 0), pa.array(texts, pa.string()),
    ], schema=_ARROW)


def split_batch(batch: pa.RecordBatch, max_bytes: int) -> pa.RecordBatch:
    """Trade messages (vhost, ts, b64: the traced body, msgpack: its content type says so) to one
    row per element (ELEMENT_SCHEMA): `idx` null for a message with none (`junk`: why, when its
    body is no base64, over `max_bytes`, or no UTF-8 text), `spark_text` set for a body Spark's
    parser reads instead."""
    out = _Batch()
    for b64, msgpack in zip(_views(batch.column("b64")), batch.column("msgpack").to_pylist(), strict=True):
        body, junk = body_decode.trade_body(b64, bool(msgpack), max_bytes)
        if body is None:
            out.none(junk=junk)
        else:
            _body(out, None if msgpack else body, body if msgpack else None)
    return _rows(out, batch.column("vhost"), batch.column("ts"))


def _views(texts: pa.Array) -> list[memoryview | None]:
    """The strings' UTF-8 bytes without a copy."""
    if texts.null_count == len(texts):
        return [None] * len(texts)
    wide = pa.types.is_large_string(texts.type)
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64 if wide else np.int32)
    offsets = offsets[texts.offset: texts.offset + len(texts) + 1]
    data = memoryview(texts.buffers()[2])
    valid = texts.is_valid().to_numpy(zero_copy_only=False)
    return [data[offsets[i]: offsets[i + 1]] if valid[i] else None for i in range(len(texts))]


def split(max_bytes: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For `mapInArrow` over trade messages: `split_batch` on each Arrow batch."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield split_batch(batch, max_bytes)
    return run
