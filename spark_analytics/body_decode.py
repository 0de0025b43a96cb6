"""A traced trade body from its base64 to bytes, in the Python workers, judged as Spark judges it.

Spark's `try_to_binary(body, 'base64')` checks each character in Scala, one boxed character at
a time, and `is_valid_utf8` walks each byte: with 1000-event batches the two were ~40 % of the
JVM's samples in the read. Here a trade body stays base64 in the cached record frame and the
workers that split it (`bodies`) decode it (SIMD base64; CPython's UTF-8 decoder), with the same
answers (`tests/test_audit_body_decode.py` checks them against Spark's functions):

- base64 as `try_to_binary` accepts it (`UnBase64.isValidBase64`, RFC 4648): the alphabet,
  whitespace (Java's `Character.isWhitespace`) anywhere before the padding, at most two `=` and
  only at the end, no last unit of one character; decoded as Java's MIME decoder decodes it
  (whitespace skipped, a short last unit as if padded). A strict decode settles the bodies a
  recorder writes; only the rest is checked character by character.
- UTF-8 as `is_valid_utf8` accepts it (well formed: no surrogates, overlong forms or code
  points past U+10FFFF), which is Python's strict decoder.
"""

from __future__ import annotations

import binascii

import pybase64

# Why a trade message has no element (`bodies` marks its one row with the code).
NOT_BASE64, OVERSIZE, NOT_UTF8 = 1, 2, 3
REASONS = {NOT_BASE64: "not_base64", OVERSIZE: "oversize", NOT_UTF8: "not_utf8"}

_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
# Java's Character.isWhitespace: the Unicode space, line and paragraph separators except the
# non-breaking ones, and nine control characters.
_JAVA_SPACE = frozenset("\t\n\u000b\f\r\u001c\u001d\u001e\u001f \u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                        "\u2006\u2008\u2009\u200a\u2028\u2029\u205f\u3000")


def spark_base64(text: str | memoryview) -> bytes | None:
    """`text` (or its UTF-8 bytes) decoded as Spark's `try_to_binary(text, 'base64')` decodes it;
    None where that is null."""
    try:
        return pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass  # not the strict form: Spark's own rule, character by character
    if isinstance(text, memoryview):
        text = str(text, "utf-8")
    units = pad = 0
    for c in text:
        if c in _ALPHABET:
            if pad:
                return None
            units += 1
        elif c == "=":
            pad += 1
            if pad > 2:
                return None
        elif c not in _JAVA_SPACE or pad:
            return None
    if ((units + pad) % 4 != 0) if pad else units % 4 == 1:
        return None
    data = "".join(c for c in text if c in _ALPHABET)
    return binascii.a2b_base64(data + "=" * (-len(data) % 4))


def trade_body(b64: str | memoryview | None, msgpack: bool, max_bytes: int) -> tuple[bytes | None, int | None]:
    """(the body, None) when it can hold elements: base64, at most `max_bytes`, and UTF-8 unless it
    is `msgpack`; else (None, the reason code)."""
    body = None if b64 is None else spark_base64(b64)
    if body is None:
        return None, NOT_BASE64
    if len(body) > max_bytes:
        return None, OVERSIZE
    if not msgpack:
        try:
            body.decode()
        except UnicodeDecodeError:
            return None, NOT_UTF8
    return body, None
