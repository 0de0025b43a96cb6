"""Trade bodies decoded in the Python workers (`spark_analytics.body_decode`) against Spark's own
functions, which decoded them before: `try_to_binary(body, 'base64')` and `is_valid_utf8`. Each
string or byte string must get the same answer from both."""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_analytics import body_decode
from tests.support.scale import FULL

pytestmark = pytest.mark.spark

EDGES = ["", "QQ", "QQ=", "QQ==", "QQ===", "QUI", "QUI=", "QUI==", "QUJD", "Q", "QUJDR", "QR==", "QUJD\n", " QUJD",
         "QU JD", "QU\tJD", "QQ= =", "QQ=\n", "QQ==QQ==", "=", "==", "=QQ", "QU\u00a0JD", "QU\u2007JD", "QU\u2003JD",
         "QU\u3000JD", "QU\u001fJD", "QU\u0085JD", "QU\u180eJD", "QUJD\U0001f600", "Q-_A", "QUJD\x00", "QQ\r\n=="]
BASE64ISH = st.text(alphabet="QUJDRab+/=0 \t\n\r\u00a0\u2028\u3000\u0085-_.\U0001f600", max_size=14)
BYTES = st.one_of(st.binary(max_size=12), st.lists(st.sampled_from(
    [b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
     b"\xf5", b"\xff", b"\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\x00"]), max_size=5).map(b"".join))


def spark_base64(spark, texts: list[str]) -> list[bytes | None]:
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    rows = df.select("i", F.try_to_binary(F.col("t"), F.lit("base64")).alias("b")).collect()
    return [None if r["b"] is None else bytes(r["b"]) for r in sorted(rows)]


def spark_utf8(spark, bodies: list[bytes]) -> list[bool]:
    df = spark.createDataFrame([(i, b) for i, b in enumerate(bodies)], "i int, b binary")
    rows = df.select("i", F.is_valid_utf8(F.col("b").cast("string")).alias("ok")).collect()
    return [r["ok"] for r in sorted(rows)]


def test_base64_edges_decode_as_spark_decodes_them(spark) -> None:
    expected = spark_base64(spark, EDGES)
    assert [body_decode.spark_base64(t) for t in EDGES] == expected
    assert [body_decode.spark_base64(memoryview(t.encode())) for t in EDGES] == expected
    assert body_decode.spark_base64("QQ") == b"A" and body_decode.spark_base64("Q") is None


@settings(max_examples=40 if FULL else 6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BASE64ISH, min_size=1, max_size=200))
def test_random_base64ish_strings_decode_as_spark_decodes_them(spark, texts: list[str]) -> None:
    """As strings and as the UTF-8 bytes the workers see (Arrow's buffers)."""
    expected = spark_base64(spark, texts)
    assert [body_decode.spark_base64(t) for t in texts] == expected
    assert [body_decode.spark_base64(memoryview(t.encode())) for t in texts] == expected


@settings(max_examples=40 if FULL else 6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BYTES, min_size=1, max_size=200))
def test_random_bytes_are_utf8_where_spark_says_so(spark, raw: list[bytes]) -> None:
    """A body that is base64 of these bytes is text exactly where Spark's check says UTF-8."""
    ours = [body_decode.trade_body(base64.b64encode(b).decode(), False, 1 << 20)[1] is None for b in raw]
    assert ours == spark_utf8(spark, raw)


def test_a_trade_body_is_junk_for_one_reason() -> None:
    def reason(b64: str | None, msgpack: bool = False, limit: int = 4) -> int | None:
        return body_decode.trade_body(b64, msgpack, limit)[1]
    assert reason(None) == reason("Q") == body_decode.NOT_BASE64
    assert reason(base64.b64encode(b"12345").decode()) == body_decode.OVERSIZE
    assert reason(base64.b64encode(b"\xff").decode()) == body_decode.NOT_UTF8
    assert reason(base64.b64encode(b"\xff").decode(), msgpack=True) is None, "msgpack is not text"
    assert body_decode.trade_body(base64.b64encode(b"1234").decode(), False, 4) == (b"1234", None)
