"""The aiormq methods that Aldebaran's three AMQP shortcuts stand on, known by their source.

`frame_reader` replaces `FrameReceiver.get_frame`; `inline_consumer` replaces a channel's
delivery handler and calls its private content readers; `publish_many` does `basic_publish`'s
bookkeeping on a channel's attributes and replaces its confirm and return handlers. Each was
written against those methods as aiormq 7.2.4 has them. pyproject admits any 7.x, and a
release may change a private method without a word, so a shortcut asks `known` first and,
where a method's source differs, takes aiormq's own way (slower, never wrong) and says so once
in the log: one table and one check for the three, rather than three ways to trust a private.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from importlib import metadata
from typing import Any

import aiormq.channel
import aiormq.connection

from aldebaran.log import get_logger

# "Class.method" -> the first 16 hex digits of the sha256 of its source in aiormq 7.2.4.
KNOWN: dict[str, str] = {
    "FrameReceiver.get_frame": "3adff046743a2328",
    "Channel._on_deliver_frame": "3cb7bf324f3af08d",
    "Channel.__get_content_header": "9128434a852e41f8",
    "Channel._read_content": "0fc20efc56f8c5f6",
    "Channel.basic_publish": "4c5c91a4d75be291",
    "Channel._on_confirm_frame": "0b1898e2d2b38ab1",
    "Channel._on_return_frame": "f5d69cc1abbbcd40",
    "Channel._confirm_delivery": "191bcd75b78f2ed1",
}
_CLASSES: dict[str, type] = {"FrameReceiver": aiormq.connection.FrameReceiver, "Channel": aiormq.channel.Channel}
_warned: set[str] = set()
log = get_logger("amqp")


def source_digest(function: Any) -> str:
    """The first 16 hex digits of the sha256 of `function`'s source ("" when it has none)."""
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return ""


@functools.cache
def digest(name: str) -> str:
    """The digest of aiormq's method `name` ("Class.method", a `__name` as written in the class)
    as this process has it, read once; "" when there is no such method."""
    owner, attribute = name.split(".", 1)
    cls = _CLASSES[owner]
    if attribute.startswith("__"):
        attribute = f"_{cls.__name__}{attribute}"  # as Python mangles it
    return source_digest(getattr(cls, attribute, None))


def known(shortcut: str, names: tuple[str, ...]) -> bool:
    """Whether each of aiormq's methods in `names` is the one `shortcut` was written against;
    the first time one is not, a warning names what differs."""
    changed = sorted(name for name in names if digest(name) != KNOWN[name])
    if changed and shortcut not in _warned:
        _warned.add(shortcut)
        log.warning("aiormq's code is not what this shortcut was written against: aiormq's own way is taken",
                    shortcut=shortcut, changed=changed, aiormq=_version())
    return not changed


def _version() -> str:
    try:
        return metadata.version("aiormq")
    except metadata.PackageNotFoundError:
        return "unknown"
