"""The engine's alert witnesses: what reached `Aldebaran.Alert`, readable after a crash.

The engine records an alert as pending in Redis, publishes it, and marks it sent after
the confirm. A crash between the confirm and the mark left it pending, and the next
owner published it again: `Aldebaran.Alert` carried it twice (1 to 12 repeats per run of
tests/faults/test_kill_up.py). Every alert batch is now published with a `BCC` to
`aldebaran.engine.witness`, a queue bound to the alert exchange under its own name: the
broker routes one publish to both queues or to neither. Before it publishes what is still
pending, a new owner reads the witnesses, marks every alert they hold sent, and publishes
only the rest, save the entries whose publish the broker did not confirm: a nacked batch
may sit in the witness queue and not in another (`EngineStore.refuse`). The owner also
reads them at each compaction, so the queue stays short. Only the lease holder reads this
queue (after a fenced compaction, never before).
"""

from __future__ import annotations

from typing import NamedTuple

import aiormq.abc
import msgspec
from pamqp import commands as spec
from pamqp.common import FieldTable

from aldebaran.io.alert_bus import split_alerts
from aldebaran.log import get_logger
from aldebaran.settings import Settings
from declare.topology import ALERT

log = get_logger("witness")
WITNESS_QUEUE = "aldebaran.engine.witness"
TRIM_READ = 2_000  # witness messages read per trim (one round trip each); the next trim goes on


class _Id(msgspec.Struct):
    alert_id: str


_id_decoder = msgspec.json.Decoder(_Id)
_ids_decoder = msgspec.json.Decoder(list[_Id] | _Id)


def witness_queue(settings: Settings) -> str:
    """The engine's witness queue; partitioned engines keep one each (each settles its own outbox)."""
    engine = settings.engine
    return WITNESS_QUEUE if engine.partitions == 1 else f"{WITNESS_QUEUE}.{engine.partition}"


async def declare_witness(channel: aiormq.abc.AbstractChannel, settings: Settings) -> None:
    """The witness queue, bound to the alert exchange under its own name."""
    # No delivery limit on a quorum witness queue: a witness returned by trims must never be dropped.
    arguments: FieldTable = {"x-queue-type": "quorum"} if settings.queue_type == "quorum" else {}
    queue = witness_queue(settings)
    await channel.queue_declare(queue, durable=True, arguments=arguments)
    await channel.queue_bind(queue, ALERT, routing_key=queue)


class Witness(NamedTuple):
    """One witness message: its delivery tag on the reading channel, the alerts it holds."""

    tag: int
    alerts: dict[str, bytes]  # alert id -> its JSON


class WitnessIds(NamedTuple):
    """One witness message as a trim needs it: its delivery tag, the ids of its alerts."""

    tag: int
    ids: frozenset[str]


async def read_witnesses(channel: aiormq.abc.AbstractChannel, queue: str,
                         limit: int | None = TRIM_READ) -> list[Witness]:
    """The witness messages in queue order (at most `limit`; None: all), unacked (the caller
    acks or returns them)."""
    return [Witness(tag, _alerts(body)) for tag, body in await _get(channel, queue, limit)]


async def read_witness_ids(channel: aiormq.abc.AbstractChannel, queue: str,
                           limit: int | None = TRIM_READ) -> list[WitnessIds]:
    """As `read_witnesses`, the alert ids alone: a trim decodes each message in one call, a
    third of splitting it and decoding each alert."""
    return [WitnessIds(tag, _ids(body)) for tag, body in await _get(channel, queue, limit)]


async def _get(channel: aiormq.abc.AbstractChannel, queue: str, limit: int | None) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    while limit is None or len(got) < limit:
        message = await channel.basic_get(queue, no_ack=False)
        if not isinstance(message.delivery, spec.Basic.GetOk):
            break
        tag = message.delivery.delivery_tag
        assert tag is not None, "a Basic.GetOk always carries its delivery tag"
        got.append((tag, message.body))
    return got


def _alerts(body: bytes) -> dict[str, bytes]:
    alerts: dict[str, bytes] = {}
    try:
        for raw in split_alerts(body):
            alerts[_id_decoder.decode(raw).alert_id] = raw
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:  # not ours: acked with the rest
        log.warning("unreadable witness message", error=str(exc))
    return alerts


def _ids(body: bytes) -> frozenset[str]:
    try:
        value = _ids_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # what `_alerts` reads, and its warning
        return frozenset(_alerts(body))
    return frozenset(a.alert_id for a in value) if isinstance(value, list) else frozenset((value.alert_id,))
