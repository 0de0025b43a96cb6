"""Trade bodies split in the Python workers (`spark_analytics.bodies`, msgspec) against Spark's
own reading of them (`wire.element_maps`, and the msgpack UDF the audit used before), on junk
and on random bodies. The two must give the same elements, element by element.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import msgspec
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_analytics import bodies, records, wire
from tests.support.scale import FULL

pytestmark = pytest.mark.spark

Body = tuple[str | None, bytes | None]  # (text, msgpack bytes)
FIELDS = ["ts", "idx", "valid", "etype", "event_id", "order_id", "shares"]


def _msgpack_json(body: bytes) -> str | None:
    """The audit's msgpack reading before `bodies` (kept here as the reference)."""
    def text(v: Any) -> str | None:
        if isinstance(v, bool):
            return "\u0000bool"
        if isinstance(v, (int, str)):
            return str(v)
        return None if v is None else "\u0000" + type(v).__name__
    try:
        obj = msgspec.msgpack.decode(body)
        items = obj if isinstance(obj, list) else [obj]
        return json.dumps([{str(k): text(v) for k, v in item.items()} if isinstance(item, dict) else {"\u0000": None}
                           for item in items])
    except Exception:  # noqa: BLE001 - unreadable: no events
        return None


@F.pandas_udf(T.StringType())  # type: ignore[call-overload]
def msgpack_as_json(packed: pd.Series) -> pd.Series:
    return packed.map(_msgpack_json, na_action="ignore")


def frame(spark, messages: list[Body]):
    """The messages as `text` and `packed` (for Spark's reading) and as traced (`b64`, `msgpack`)."""
    rows = [("v", 1000 + i, "trade", text, packed, base64.b64encode(packed or text.encode()).decode(),
             packed is not None)
            for i, (text, packed) in enumerate(messages)]
    return spark.createDataFrame(
        rows, "vhost string, ts long, kind string, text string, packed binary, b64 string, msgpack boolean")


def spark_read(spark, messages: list[Body]) -> list[tuple]:
    """Every element as Spark's functions read it: one row per element, `idx` null for none."""
    df = frame(spark, messages)
    maps = (df.where(F.col("text").isNotNull()).select("ts", wire.element_maps(F.col("text")).alias("maps"))
            .unionByName(df.where(F.col("packed").isNotNull()).select("ts", msgpack_as_json("packed").alias("j"))
                         .select("ts", F.when(F.col("j").isNotNull(), wire.element_maps(F.col("j"))).alias("maps"))))
    exploded = maps.select("ts", F.posexplode_outer("maps").alias("idx", "m"))
    values = wire.element_values(wire.canonical(F.col("m")))
    out = exploded.select("ts", "idx", *[v.alias(k) for k, v in values.items()])
    return sorted(tuple(r[f] for f in FIELDS) for r in out.collect())


def split(spark, messages: list[Body], spark_parser: bool = True) -> list[tuple]:
    out = records.elements(frame(spark, messages), 1 << 20, spark_parser=spark_parser)
    return sorted(tuple(r[f] for f in FIELDS) for r in out.collect())


def event(i: str, shares: object = 10, order: object = None, **extra: object) -> dict[str, object]:
    ev = {"id": i, "#shares": shares, "client": "c", "stock": "AAPL", **extra}
    return {**ev, "initial_order_id": order} if order is not None else ev


GARBAGE_TEXT = random.Random(21).choices("abc:# \n\t{}[]é", k=10 * 1024)
JUNK: list[Body] = [
    (json.dumps(event("1", 100)), None),
    (json.dumps([event("2", 60, "1"), event("3", 50, "1"), None]), None),   # a null element: rejected
    ('{"id": "90", "#shares": 5, "client": "S"', None),                    # truncated JSON
    ('[{"id": "91", "#shares": 5, "client": "S", "stock": "X"}', None),    # truncated array
    ("".join(GARBAGE_TEXT), None),                                          # 10 kB of garbage text
    ("this is not trade data", None),
    ("id:4\ninitial order id: 1\n# shares: 10\nclient: S\nstock: AAPL", None),  # the text form
    ("id:4\nid: 5\n# shares: 10\nclient: S\nstock: AAPL", None),           # a repeated key: unreadable
    ('{"ID": "6", "# Shares": " 7 ", "Client": "c", "Stock": "s", "Initial Order Id": "1"}', None),
    ('{"id": 8, "#shares": "100\\n", "client": "c", "stock": "s"}', None),  # Java's `$` and cast
    ('{"id": "9", "#shares": 1.5e2, "client": "c", "stock": "s"}', None),  # a float: Spark renders it
    ('{"id": "10", "#shares": 5, "client": "c", "stock": "s"} trailing', None),  # Spark ignores the rest
    ("{'id': '11', '#shares': 5, 'client': 'c', 'stock': 's'}", None),     # single quotes: Spark reads them
    ('{"id": "12", "#shares": 5, "client": "   ", "stock": "s"}', None),   # a blank client: rejected
    ('{"id": "' + "é" * 101 + '", "#shares": 5, "client": "c", "stock": "s"}', None),  # 202 bytes
    ('{"id": {"a": 1}, "#shares": 5, "client": "c", "stock": "s"}', None),  # a nested value
    ('{"id": "\\ud800", "#shares": 5, "client": "c", "stock": "s"}', None),  # a lone surrogate
    ("[]", None), ("{}", None), ("[1, 2]", None), ("   ", None), ("\n{}", None),
    (None, msgspec.msgpack.encode(event("13", 60, "1"))),
    (None, msgspec.msgpack.encode([event("14", 5), 3, {1: "x", "id": True}])),
    (None, b"\xc1 not msgpack"),
]


def test_junk_is_split_as_spark_reads_it(spark) -> None:
    expected = spark_read(spark, JUNK)
    assert split(spark, JUNK) == expected
    by_ts = {}
    for row in expected:
        by_ts.setdefault(row[0] - 1000, []).append(row)
    assert by_ts[0] == [(1000, 0, True, "request", "1", "1", 100)]
    assert [r[2] for r in by_ts[1]] == [True, True, False], "the null element is rejected, the others count"
    assert by_ts[2] == [(1002, None, False, None, None, None, None)], "truncated JSON: unreadable"
    assert by_ts[8] == [(1008, 0, True, "purchase", "6", "1", 7)], "keys as the codec matches them"
    assert by_ts[9][0][2:] == (True, "request", "8", "8", 100)
    assert by_ts[11][0][2:4] == (True, "request") and by_ts[12][0][2:4] == (True, "request")
    assert [r[1:3] for r in by_ts[19]] == [(None, False)], "an array of numbers: unreadable"


def test_bodies_only_spark_reads_exactly_are_marked_not_guessed(spark) -> None:
    """Without Spark's parser, the float, the trailing bytes, the single quotes, the nested value
    and the lone surrogate come back as one marked row each; everything else is already split."""
    rows = split(spark, JUNK, spark_parser=False)
    marked = sorted(r[0] - 1000 for r in rows if r[1] == bodies.DEFERRED)
    assert marked == [10, 11, 12, 15, 16]
    expected = [r for r in spark_read(spark, JUNK) if r[0] - 1000 not in marked]
    assert [r for r in rows if r[0] - 1000 not in marked] == expected


# --- random bodies ---------------------------------------------------------------------------

KEYS = st.sampled_from(["id", "#shares", "initial_order_id", "client", "stock", "# Shares", "ID", "Initial Order Id",
                        "initial order id", " stock", "x", ""])
LABELS = st.one_of(st.sampled_from(["", " ", " 5 ", "100", "0100", "100\n", "100\r\n", "100\u2028", "-3", "x" * 199,
                                    "x" * 201, "é" * 100, "é" * 101, "1", "2"]),
                   st.text(alphabet=" 0123456789ab_é\n\r\t#:", max_size=6))
NUMBERS = st.one_of(st.integers(-5, 300), st.sampled_from([0, 10**15, 10**15 + 1, 10**16, 10**17, 10**30]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, LABELS, st.floats(allow_nan=False, width=32))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.dictionaries(st.sampled_from(["a", "b"]), SCALARS,
                                                                               max_size=2))
PAIRS = st.lists(st.tuples(KEYS, VALUES), max_size=7)
VALID = st.builds(lambda i, o, s: list(event(i, s, o).items()), st.sampled_from(["1", "2", "3", 4]),
                  st.sampled_from([None, "1", 2]), st.integers(1, 300))
ELEMENT = st.one_of(VALID, VALID, PAIRS)


def json_object(pairs: list[tuple[str, object]], ascii_only: bool) -> str:
    """Pairs as a JSON object, repeated keys kept."""
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=ascii_only)}: {json.dumps(v, ensure_ascii=ascii_only)}"
                           for k, v in pairs) + "}"


def packable(v: object) -> object:
    """msgpack has no integers past 64 bits: those become their decimal strings."""
    if isinstance(v, list):
        return [packable(x) for x in v]
    if isinstance(v, dict):
        return {k: packable(x) for k, x in v.items()}
    return str(v) if isinstance(v, int) and abs(v) >= 2**63 else v


@st.composite
def message(draw: st.DrawFn) -> Body:
    form = draw(st.sampled_from(["object", "array", "text", "msgpack", "cut", "tail"]))
    ascii_only = draw(st.booleans())
    if form == "array":
        items = draw(st.lists(st.one_of(ELEMENT, st.none(), st.just(1)), max_size=4))
        text = "[" + ", ".join("null" if i is None else "1" if i == 1 else json_object(i, ascii_only)
                               for i in items) + "]"
        return text, None
    pairs = draw(ELEMENT)
    if form == "text":
        lines = [f"{k}: {v}" for k, v in pairs] + draw(st.lists(st.sampled_from(["", " ", "junk", "a:b"]), max_size=2))
        return draw(st.sampled_from(["\n", "\r\n"])).join(draw(st.permutations(lines))), None
    if form == "msgpack":
        item = {k: packable(v) for k, v in pairs}
        return None, msgspec.msgpack.encode(item if draw(st.booleans()) else [item, None])
    text = json_object(pairs, ascii_only)
    if form == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif form == "tail":
        text += draw(st.sampled_from([" ", " x", "\n", "}", " {}"]))
    return draw(st.sampled_from(["", " ", "  "])) + text, None


# Few examples of many bodies each: every example is two Spark jobs (seconds on a loaded host).
@settings(max_examples=40 if FULL else 4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(message(), min_size=1, max_size=150))
def test_random_bodies_are_split_as_spark_reads_them(spark, messages: list[Body]) -> None:
    assert split(spark, messages) == spark_read(spark, messages)


def test_the_audit_walks_again_with_sparks_parser_when_a_body_needs_it(spark, tmp_path) -> None:
    """A request written with trailing bytes (Spark's parser reads it, msgspec does not) and a
    purchase crossing it: the over_purchase is expected and published, so the audit is clean
    only if the request was read; a float share count next to it is rejected, as before."""
    from spark_analytics.job import run
    from spark_analytics.options import AuditOptions
    from tests.test_audit import T0, alert, delivery, heartbeats, trade, write_traces

    t = T0 + 5_000
    records_ = [
        *heartbeats(T0, T0 + 200_000), trade(t, json.dumps(event("R", 10)).encode() + b" trailing"),
        trade(t + 10, [event("R1", 11, "R"), event("R2", 1.5, "R")]),
        alert(t + 20, "over_purchase", "R"), delivery(t + 30, "ops", "over_purchase:R")]
    opts = AuditOptions(traces_dir=str(write_traces(tmp_path / "t", records_)), channels=["ops"])
    code, info = run(opts, None, str(tmp_path / "out"), spark=spark)
    assert (code, info["verdict"]) == (0, "clean"), info["counts"]
    assert (info["counts"]["expected_alerts"], info["counts"]["trade_elements_rejected"]) == (1, 1)
    assert info["counts"]["trade_events_decoded"] == 2 and info["counts"]["trade_unreadable"] == 0


def test_the_codecs_whitespace_cases_are_split_as_spark_reads_them(spark) -> None:
    """`tests/test_codec.py` holds the codec to the workers' reading on these; here that reading is
    held to Spark's, so that the codec and Spark agree on them."""
    from tests.test_codec import KEYS, SHARE_TEXTS, TEXT_FORMS

    bodies: list[Body] = [(json.dumps([{"id": "r-1", key: shares, "client": "c", "stock": "s"}]), None)
                          for shares in SHARE_TEXTS for key in KEYS]
    bodies += [(text, None) for text in TEXT_FORMS]
    expected = spark_read(spark, bodies)
    assert split(spark, bodies) == expected
    valid = [row for row in expected if row[2]]
    assert 0 < len(valid) < len(expected)
