"""Handing events to the engine that owns their books (partitioned engines, docs/engine.md).

A cycle's events of other partitions' books leave as one message per owning partition, on
that partition's queue: persistent, mandatory, confirmed. The cycle's ingress messages are
acked only after every handover is confirmed, so a crash in between hands them over again;
the owner counts an event once by its id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiormq.abc
from pamqp import commands as spec

from aldebaran.io.publish_many import publish_many

HANDOVER_CONTENT_TYPE = "application/x-aldebaran-handover"


class HandoverRefused(Exception):
    """The broker did not take a handover: the cycle's messages stay unacked."""


async def hand_over(channel: aiormq.abc.AbstractChannel, handovers: Sequence[tuple[str, bytes]]) -> None:
    """Each (queue, body) as one message to that queue; returns once every one is confirmed."""
    async def one(queue: str, body: bytes) -> None:
        properties = spec.Basic.Properties(delivery_mode=2, content_type=HANDOVER_CONTENT_TYPE)
        confirmations = await publish_many(channel, [body], [properties], routing_key=queue)
        [outcome] = await confirmations.wait()
        if outcome is not None:
            raise HandoverRefused(f"handover to {queue} not confirmed: {outcome!r}")

    await asyncio.gather(*(one(queue, body) for queue, body in handovers))
