"""RabbitMQ connections for workers: robust (reconnecting), named, heartbeating, masked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aio_pika
import aio_pika.abc
import aiormq.exceptions
from yarl import URL

from aldebaran.errors import UnavailableError
from aldebaran.log import get_logger
from aldebaran.metrics import BROKER_RECONNECTS, CONNECTIONS_BLOCKED
from aldebaran.runtime_tuning import collect_after_loss
from aldebaran.settings import Settings, mask_url

log = get_logger("amqp")


class _BlockedWatcher(logging.Handler):
    """aiormq pauses publishing while the broker blocks a connection (memory or disk
    alarm) and says so only in a log line: turn that line into a metric and our log."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "was blocked by" in message:
            CONNECTIONS_BLOCKED.inc()
            log.warning("broker blocked a connection: publishing paused (flow control)",
                        reason=message.rsplit("by:", 1)[-1].strip())
        elif "was unblocked" in message:
            CONNECTIONS_BLOCKED.dec()
            log.warning("broker unblocked a connection: publishing resumes")


_aiormq_log = logging.getLogger("aiormq.connection")
_aiormq_log.setLevel(logging.WARNING)
_aiormq_log.propagate = False
_aiormq_log.addHandler(_BlockedWatcher())


T = TypeVar("T")


def rotated(urls: Sequence[T], start: int) -> list[T]:
    """`urls` beginning at `start` (mod len): where a reconnect should try first.

    In cluster mode every worker lists the same nodes; starting each attempt one node
    further means a worker whose node died goes to the next live one at once instead of
    hammering the dead one first (and connection refusals cost nothing on a LAN).
    """
    if not urls:
        return []
    start %= len(urls)
    return [*urls[start:], *urls[:start]]


class FailoverConnection(aio_pika.RobustConnection):
    """A robust connection over a cluster's nodes: after a loss it reconnects elsewhere.

    aio-pika's robust connection retries its one URL forever, so a worker on a stopped
    node would wait for that node to come back. This one moves `url` to the next node
    when the connection is lost and, while it stays down, every `reconnect_interval`
    (+1 s): the robust machinery then restores channels, declarations and consumers on
    whichever node answers. With a single URL it behaves exactly like its parent.
    """

    _urls: tuple[str, ...] = ()
    _index: int = 0
    _rotator: asyncio.Task[None] | None = None

    def use_nodes(self, urls: list[str], index: int) -> None:
        """Fail over across `urls`; the connection is currently to `urls[index]`."""
        self._urls, self._index = tuple(urls), index

    def _advance(self) -> None:
        if len(self._urls) < 2:
            return
        self._index = (self._index + 1) % len(self._urls)
        self.url = URL(self._urls[self._index])
        log.warning("broker connection down; next attempt on another node", url=mask_url(self._urls[self._index]))

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        # Move first: the parent wakes the reconnect loop, which reads `self.url`.
        lost = not (self._close_called or self.is_closed)
        if lost:
            self._advance()
        await super()._on_connection_close(closing)
        if lost and len(self._urls) > 1 and (self._rotator is None or self._rotator.done()):
            self._rotator = self.loop.create_task(self._rotate_while_down())

    async def _rotate_while_down(self) -> None:
        while not (self._close_called or self.is_closed) and not self.connected.is_set():
            try:
                await asyncio.wait_for(self.connected.wait(), timeout=float(self.reconnect_interval) + 1.0)
            except TimeoutError:
                self._advance()

    async def close(self, exc: Any = asyncio.CancelledError) -> None:
        if self._rotator is not None:
            self._rotator.cancel()
        await super().close(exc)


async def connect(settings: Settings, name: str, *, robust: bool = True,
                  url: str | None = None, start: int = 0) -> aio_pika.abc.AbstractRobustConnection:
    """Connect to the first broker URL that answers; `UnavailableError` if none does.

    The URLs are tried from `start` on (see `rotated`). A robust connection to a cluster
    (several URLs) is a `FailoverConnection`.
    """
    connection, _ = await connect_any(settings, name, robust=robust, url=url, start=start)
    return connection


async def connect_any(settings: Settings, name: str, *, robust: bool = True, url: str | None = None,
                      start: int = 0) -> tuple[aio_pika.abc.AbstractRobustConnection, int]:
    """`connect`, also returning the index (in `settings.broker_urls`) of the node reached."""
    last: BaseException | None = None
    urls = [url] if url else settings.broker_urls
    order = rotated(range(len(urls)), start)
    properties: aio_pika.abc.HeadersType = {"connection_name": f"aldebaran-{name}"}
    # A fixed interval (not the default backoff) when there are other nodes to try.
    failover: dict[str, Any] = {"reconnect_interval": 2} if len(urls) > 1 else {}
    for index in order:
        candidate = urls[index]
        connection: aio_pika.abc.AbstractConnection
        try:
            if robust:
                connection = await aio_pika.connect_robust(
                    candidate,
                    client_properties=properties,
                    timeout=10,
                    heartbeat=30,
                    ssl_context=tls_context(settings, candidate),
                    connection_class=FailoverConnection,
                    **failover,
                )
            else:
                connection = await aio_pika.connect(
                    candidate,
                    client_properties=properties,
                    timeout=10,
                    heartbeat=30,
                    ssl_context=tls_context(settings, candidate),
                )
        # StopAsyncIteration: aiormq's handshake when the peer accepts and closes at once
        # (a partition, a load balancer, a booting node); it crashed the worker (exit 70).
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError, StopAsyncIteration) as exc:
            last = exc
            log.warning("broker unreachable", url=mask_url(candidate), error=mask_url(str(exc) or repr(exc)))
            continue
        if isinstance(connection, FailoverConnection):
            connection.use_nodes(urls, index)
        if isinstance(connection, aio_pika.abc.AbstractRobustConnection):
            connection.reconnect_callbacks.add(lambda *_: _reconnected(name))
        log.debug("connected to broker", url=mask_url(candidate), worker=name)
        return connection, index  # type: ignore[return-value]
    reason = mask_url(str(last) or repr(last))
    raise UnavailableError(f"cannot connect to RabbitMQ at {', '.join(mask_url(u) for u in urls)}: {reason}")


def tls_context(settings: Settings, url: str) -> ssl.SSLContext | None:
    """For amqps:// with `tls_ca_file`: verify the broker against that CA (else system CAs)."""
    if not url.startswith("amqps://") or not settings.tls_ca_file:
        return None
    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.tls_ca_file)


def _reconnected(name: str) -> None:
    BROKER_RECONNECTS.labels(component=name).inc()
    log.warning("reconnected to broker", worker=name)
    collect_after_loss()


def persistent(body: bytes, **properties: Any) -> aio_pika.Message:
    """A persistent message (survives a broker restart on durable queues)."""
    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, **properties)


Session = Callable[[aio_pika.abc.AbstractConnection, asyncio.Event], Awaitable[None]]


# A session that lasted this long resets the backoff: one that ends sooner after every connect
# (a queue that keeps refusing publishes, Redis down) backs off further each time, up to
# SESSION_BACKOFF_CAP seconds, instead of reconnecting every few tens of milliseconds; the cap
# keeps the wait after the cause is gone short (alerts wait on it).
STABLE_SESSION_SECONDS = 10.0
_LOSSES = (TimeoutError, aiormq.exceptions.AMQPError, ConnectionError, OSError)  # a session's end, not a bug
SESSION_BACKOFF_CAP = 5.0


def backoff_delay(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter: never a busy loop, never a thundering herd."""
    return random.uniform(0, min(cap, base * (2 ** attempt)))


async def run_sessions(settings: Settings, name: str, stopping: asyncio.Event, session: Session) -> None:
    """Run `session` on a fresh connection until `stopping`; reconnect after any loss.

    A session gets an `ended` event that fires on stop *or* on connection loss, and must
    return soon after. Its unacked deliveries die with the connection and come back from
    the broker, which is how held state is rebuilt without trusting a stale channel.
    The first connection failing is fatal (`UnavailableError`: systemd decides); later
    losses are retried with backoff and jitter, each attempt beginning on the node after
    the one just lost, so a cluster worker fails over instead of waiting for its node. The
    backoff starts over only after a session that lasted `STABLE_SESSION_SECONDS`.
    """
    attempt = 0
    connected_once = False
    start = 0  # where the next attempt begins in settings.broker_urls
    while not stopping.is_set():
        try:
            connection, index = await connect_any(settings, name, robust=False, start=start)
        except UnavailableError:
            if not connected_once:
                raise
            delay = backoff_delay(attempt)
            attempt += 1
            log.warning("broker still unreachable", worker=name, retry_in_seconds=round(delay, 2))
            await _sleep_unless(stopping, delay)
            continue
        if connected_once:
            BROKER_RECONNECTS.labels(component=name).inc()
            log.warning("reconnected to broker", worker=name, url=mask_url(settings.broker_urls[index]))
        connected_once = True
        began = time.monotonic()
        # A lost session starts its next attempt on the next node (cluster failover).
        start = index + 1
        ended = asyncio.Event()
        connection.close_callbacks.add(lambda *_, ended=ended: ended.set())
        watcher = asyncio.ensure_future(_forward(stopping, ended))
        try:
            await session(connection, ended)
        except Exception as exc:
            # A connection that closed under the session is a loss whatever the client raised:
            # aiormq opens a channel on a closed connection with a RuntimeError.
            if not (isinstance(exc, _LOSSES) or connection.is_closed):
                raise
            if not stopping.is_set():
                log.warning("session lost", worker=name, error=mask_url(str(exc) or repr(exc)))
        finally:
            watcher.cancel()
            if not connection.is_closed:
                with contextlib.suppress(Exception):  # closing a dead connection may fail
                    await asyncio.wait_for(connection.close(), timeout=5)
        if not stopping.is_set():
            collect_after_loss()
            if time.monotonic() - began >= STABLE_SESSION_SECONDS:
                attempt = 0
            delay = backoff_delay(attempt, cap=SESSION_BACKOFF_CAP)
            attempt += 1
            log.warning("connection to broker lost; reconnecting", worker=name, retry_in_seconds=round(delay, 2))
            await _sleep_unless(stopping, delay)


async def _forward(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _sleep_unless(stopping: asyncio.Event, delay: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=delay)


async def watch_backlog(channel: aio_pika.abc.AbstractChannel, queue: str, until: asyncio.Event,
                        interval: float = 5.0, warn_at: int = 10_000) -> None:
    """Sample a queue's depth into `aldebaran_queue_depth_messages`; log when a backlog builds.

    Runs beside a consumer until `until` fires. A warning is logged each time the depth
    crosses a new power of ten above `warn_at`, and once when it drains again.
    """
    from aldebaran.metrics import QUEUE_DEPTH

    warned = 0
    while not until.is_set():
        try:
            declared = await channel.declare_queue(queue, passive=True)
            depth = declared.declaration_result.message_count or 0
        except Exception:  # noqa: BLE001 - sampling must never hurt the consumer
            return
        QUEUE_DEPTH.labels(queue=queue).set(depth)
        level = 0 if depth < warn_at else 10 ** len(str(depth // warn_at))
        if level > warned:
            log.warning("backlog building", queue=queue, depth=depth)
        elif level == 0 and warned:
            log.info("backlog drained", queue=queue, depth=depth)
        warned = level
        await _sleep_unless(until, interval)
