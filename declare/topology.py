"""Every exchange and queue Aldebaran uses, as plain data, derived from the settings.

Workers that declare on the fly (per-order book queues) take their arguments from here
too, so a queue is always declared the same way and never trips over itself.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from aldebaran.settings import Settings

TRADE_DATA = "Aldebaran.Trade_Data"
WORK_QUEUE = "Aldebaran.Purchase_Request"
ALERT = "Aldebaran.Alert"
DEAD_LETTER = "Aldebaran.Dead_Letter"
CHANNEL_PREFIX = "Aldebaran.Channel."
REASON_HEADER = "x-aldebaran-reason"
# The publisher's wall-clock time in integer epoch microseconds (whole milliseconds made every
# latency read up to 1 ms long, 0.5 ms on average; AMQP floats reach consumers as 32-bit ones).
PUBLISHED_HEADER = "x-aldebaran-published-us"
PUBLISHED_MS_HEADER = "x-aldebaran-published-ms"  # the same in milliseconds, from older publishers


ENGINE_PARTITION_PREFIX = "aldebaran.engine.partition."


def engine_partition_queue(partition: int) -> str:
    """Where the other engines hand partition `partition` the events of its books."""
    return f"{ENGINE_PARTITION_PREFIX}{partition}"


def channel_queue(name: str) -> str:
    return f"{CHANNEL_PREFIX}{name}"


def channel_dead_letter(name: str) -> str:
    return f"{CHANNEL_PREFIX}{name}.Dead_Letter"


# Per-order queue names: the key's bytes outside [A-Za-z0-9_.] written `@XX` (hex) when
# that stays short, else `#` and a SHA-256. The clients accept only [A-Za-z0-9-_.:@#,/+ ]
# in a queue name (pamqp checks), hence `@`, not `%`. `-` is encoded too, so no encoded
# key can spell an internal name with a `-` after the prefix, and `#`
# never appears in the encoded form, so the two forms cannot meet. Any key works: the
# name is always at most 255 bytes, and two keys never share a queue (CONTRACT §2).
_UNRESERVED = re.compile(r"[^A-Za-z0-9_.]")
MAX_ENCODED_KEY = 200


def encode_key(key: str) -> str:
    """The queue-name form of a book key: readable when it can be, hashed when it cannot."""
    encoded = _UNRESERVED.sub(lambda m: "".join(f"@{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")), key)
    if len(encoded) <= MAX_ENCODED_KEY:
        return encoded
    return "#" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def book_queue(prefix: str, key: str) -> str:
    """The queue of one book (`book-1001`, `book-a@2Fb`, `book-#<sha256>`), never an internal name."""
    if not 0 < len(prefix.encode()) <= 50:
        raise ValueError(f"a book queue prefix must be 1-50 bytes, got {prefix!r}")
    return prefix + encode_key(key)


@dataclass(frozen=True, slots=True)
class ExchangeSpec:
    name: str
    type: str = "direct"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    bind_to: str | None = None  # exchange; routing key = queue name


@dataclass(frozen=True, slots=True)
class Topology:
    exchanges: list[ExchangeSpec]
    queues: list[QueueSpec]


def durable_arguments(settings: Settings, dead_letter: str | None = DEAD_LETTER) -> dict[str, Any]:
    """Arguments of a queue that must not lose data (quorum on clusters)."""
    if settings.queue_type != "quorum":
        return {}
    args: dict[str, Any] = {"x-queue-type": "quorum", "x-delivery-limit": settings.delivery_limit}
    if dead_letter:
        args["x-dead-letter-exchange"] = ""
        args["x-dead-letter-routing-key"] = dead_letter
        # A message over its delivery limit is moved, not dropped: at-least-once dead
        # lettering (RabbitMQ >= 3.10) needs reject-publish overflow.
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    return args


def book_queue_arguments(settings: Settings) -> dict[str, Any]:
    """A per-order book queue: one active consumer, gone by itself once abandoned."""
    expires_ms = int((settings.book_ttl_seconds * 3 + 60) * 1000)
    args: dict[str, Any] = {"x-single-active-consumer": True, "x-expires": expires_ms}
    args.update(durable_arguments(settings))
    return args


def ingress_arguments(settings: Settings) -> dict[str, Any]:
    args = durable_arguments(settings)
    if settings.ingress_max_length:
        args["x-max-length"] = settings.ingress_max_length
        args["x-overflow"] = "reject-publish"
    return args


def topology(settings: Settings) -> Topology:
    """The whole CONTRACT §2 topology for these settings."""
    exchanges = [ExchangeSpec(TRADE_DATA), ExchangeSpec(ALERT)]
    queues = [
        QueueSpec(TRADE_DATA, ingress_arguments(settings), bind_to=TRADE_DATA),
        QueueSpec(WORK_QUEUE, durable_arguments(settings)),
        QueueSpec(ALERT, durable_arguments(settings), bind_to=ALERT),
        QueueSpec(DEAD_LETTER, durable_arguments(settings, dead_letter=None)),
    ]
    if settings.engine.partitions > 1:
        queues += [QueueSpec(engine_partition_queue(p), durable_arguments(settings))
                   for p in range(settings.engine.partitions)]
    for channel in settings.channels:
        queues.append(QueueSpec(channel_queue(channel.name), durable_arguments(settings)))
        queues.append(QueueSpec(channel_dead_letter(channel.name), durable_arguments(settings, None)))
    return Topology(exchanges, queues)
