"""Typed trade events, as every Aldebaran worker sees them after decoding."""

from __future__ import annotations

import msgspec

MAX_SHARES = 10**15  # far beyond any real order; keeps sums exact and inside int64


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
