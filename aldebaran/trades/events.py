"""Typed trade events, as every Aldebaran worker sees them after decoding.

One event type for both kinds: a purchase names the order it fills (`initial_order_id`),
a request does not. The struct is its own wire form, so msgspec decodes a batch straight
into the objects the books keep, in C (building them from wire structs in a Python loop
was a fifth of the engine step). `PurchaseRequest(...)` and `Purchase(...)` build each kind.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_SHARES = 10**15  # far beyond any real order; keeps sums exact and inside int64
# CONTRACT §1: an id is at most 200 bytes of UTF-8, so every name derived from it (an
# alert id `<kind>:<id>` as the AMQP message_id, a queue name) fits AMQP's 255 bytes.
MAX_ID_BYTES = 200


SHORT_ID = MAX_ID_BYTES // 4  # characters: 4 bytes each at most, so an id this short cannot be over


def id_too_long(text: str) -> int | None:
    """The id's UTF-8 length when over MAX_ID_BYTES, else None (cheap for short ids; a hot loop
    tests `len(text) > SHORT_ID` first and calls this only then)."""
    if len(text) <= SHORT_ID:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > MAX_ID_BYTES else None


# What msgspec checks in C while decoding (a constructor checks nothing): labels of 1-200
# characters, share counts in range. Blank labels and ids over 200 bytes the codec checks after.
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Shares = Annotated[int, msgspec.Meta(gt=0, le=MAX_SHARES)]


class TradeEvent(msgspec.Struct, rename={"shares": "#shares"}, forbid_unknown_fields=True,
                 omit_defaults=True, gc=False):
    """A purchase request (`initial_order_id` None: it opens order `id`) or a purchase of
    `shares` towards request `initial_order_id`. Not frozen, so the codec can share one string
    per client and stock among events; nothing else changes an event once decoded."""

    id: Label
    shares: Shares
    client: Label
    stock: Label
    initial_order_id: Label | None = None

    @property
    def order_id(self) -> str:
        """The order the event belongs to: its own id for a request."""
        return self.id if self.initial_order_id is None else self.initial_order_id

    @property
    def is_request(self) -> bool:
        return self.initial_order_id is None

    def to_wire(self) -> dict[str, object]:
        """The public wire form as a dict (CONTRACT §1)."""
        wire: dict[str, object] = {"id": self.id}
        if self.initial_order_id is not None:
            wire["initial_order_id"] = self.initial_order_id
        wire.update({"#shares": self.shares, "client": self.client, "stock": self.stock})
        return wire


REQUEST, PURCHASE = "PurchaseRequest", "Purchase"  # the events metric's `type` labels (TradeCodec.kinds)


def PurchaseRequest(id: str, shares: int, client: str, stock: str) -> TradeEvent:
    """Opens an order: a limit of `shares` for `client` buying `stock`."""
    return TradeEvent(id, shares, client, stock)


def Purchase(id: str, order_id: str, shares: int, client: str, stock: str) -> TradeEvent:
    """Fills an order: `shares` bought towards request `order_id`."""
    return TradeEvent(id, shares, client, stock, order_id)
