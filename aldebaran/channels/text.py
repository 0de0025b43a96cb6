"""Alert text for people: one line, whatever characters an id holds.

Ids may hold CR/LF, NUL or other control characters (CONTRACT §1); an e-mail header
refuses a line break and an SMS gateway may cut a message at a NUL. Each control
character is written as a visible escape (`\\r`, `\\x00`), so the text stays one line
and still tells the ids apart.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with every control character escaped as Python would show it."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
