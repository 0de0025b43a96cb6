"""Typed trade events, as every Aldebaran worker sees them after decoding."""

from __future__ import annotations

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


class PurchaseRequest(msgspec.Struct, frozen=True, gc=False, tag="request"):
    """Opens an order: a limit of `shares` for `client` buying `stock`."""

    id: str
    shares: int
    client: str
    stock: str

    @property
    def order_id(self) -> str:
        return self.id

    def to_wire(self) -> dict[str, object]:
        return {"id": self.id, "#shares": self.shares, "client": self.client, "stock": self.stock}


class Purchase(msgspec.Struct, frozen=True, gc=False, tag="purchase"):
    """Fills an order: `shares` bought towards request `order_id`."""

    id: str
    order_id: str
    shares: int
    client: str
    stock: str

    def to_wire(self) -> dict[str, object]:
        return {
            "id": self.id,
            "initial_order_id": self.order_id,
            "#shares": self.shares,
            "client": self.client,
            "stock": self.stock,
        }


TradeEvent = PurchaseRequest | Purchase
