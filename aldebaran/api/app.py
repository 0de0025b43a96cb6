"""The AweQ-style pull API: the seed document's four RPC endpoints over `PullQueue`.

Shapes follow the document verbatim (`status`, `key`, `messages[]`, `stats`), so its
curl sequence works unchanged. A downstream system that cannot speak AMQP pulls the
alerts of a `queue-api` channel here.

The dashboard at `/` is another module's (`aldebaran.api.dashboard`), which builds on
this one: `create_app(settings, routers=[...])` includes its router after the API's.
Every request body is bounded before anything reads it (`BodyLimit`), with or without
a token.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from aldebaran.api.pullqueue import PullQueue, wall_clock_ms
from aldebaran.io.redis import Keys, Replicas
from aldebaran.io.redis import connect as connect_redis
from aldebaran.log import get_logger
from aldebaran.settings import Settings

log = get_logger("api")

MAX_BATCH = 1000
EMPTY_MESSAGE = "Message content required."
NOT_FOUND = "Message not found."


class SendBody(BaseModel):
    message: str = ""


class SendReply(BaseModel):
    status: str = "okay"
    key: str


class ReceivedMessage(BaseModel):
    key: str
    timestamp: int
    retry_count: int
    message: str


class ReceiveReply(BaseModel):
    status: str = "okay"
    message: str
    messages: list[ReceivedMessage]


class OkayReply(BaseModel):
    status: str = "okay"


class ErrorReply(BaseModel):
    status: str = "error"
    message: str


class QueueStats(BaseModel):
    queue_length: int
    checkouts_count: int
    checkout_lifetime: str
    rescue_interval: str
    dead_letter_count: int


class StatsReply(BaseModel):
    status: str = "okay"
    stats: QueueStats


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _batch_note(wanted: int, got: int) -> str:
    if got == 0:
        return "No messages available in queue."
    return "Requested batch-size available." if got >= wanted else "Fewer messages available than requested."


bearer = HTTPBearer(auto_error=False, description="Required when the server has `api_token` set.")


def authorizer(token: str | None) -> Callable[..., None]:
    """A dependency that lets everything through without a token, else checks it."""

    def authorize(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials else ""
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="Bearer token required.",
                                headers={"WWW-Authenticate": "Bearer"})

    return authorize


def _queue(request: Request) -> PullQueue:
    return request.app.state.queue


QueueDep = Annotated[PullQueue, Depends(_queue)]


async def _rescue_loop(queue: PullQueue, interval: float, stopping: asyncio.Event) -> None:
    """Return expired checkouts even when nobody calls receive (stats stay truthful)."""
    # An explicit stop flag: a cancellation landing inside a redis-py command can be
    # swallowed by the client, and the loop must still end.
    while not stopping.is_set():
        try:
            rescued, dead = await queue.rescue()
            if rescued:
                log.info("rescued expired checkouts", queue=queue.name, rescued=rescued, dead_lettered=dead)
        except Exception as exc:  # noqa: BLE001 - a Redis hiccup must not end the loop
            log.warning("rescue failed", queue=queue.name, error=str(exc))
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=interval)


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 before it is read into memory.

    A declared Content-Length over the limit is refused at once; a chunked body is
    counted as it streams and cut off at the limit. It runs before authentication, so a
    huge POST without a token costs nothing either.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received, started, refused = 0, False, False

        async def counted() -> dict[str, Any]:
            # Over the limit: answer 413 now and tell the app the client left (an exception
            # here would become FastAPI's 400), then drop whatever the app still sends.
            nonlocal received, refused
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes and not refused:
                refused = True
                if not started:
                    await self._refuse(send)
                return {"type": "http.disconnect"}
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"status": "error", "message": f"Request body over {self.max_bytes} bytes."}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def body_limit(settings: Settings) -> int:
    """Room for the largest message `send-message` accepts, JSON-escaped (6 bytes a byte at worst)."""
    return settings.max_message_bytes * 6 + 4096


def create_app(settings: Settings, *, clock: Callable[[], int] = wall_clock_ms,
               routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The API bound to `settings.api_queue`, plus `routers`; Redis is opened in the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = await connect_redis(settings)
        app.state.queue = PullQueue(
            redis, Keys(settings.redis_key_prefix), settings.api_queue,
            checkout_lifetime_seconds=settings.checkout_lifetime_seconds,
            max_receive_count=settings.max_receive_count,
            dedup_ttl_seconds=settings.alert_dedup_ttl_seconds, clock=clock, replicas=Replicas.of(settings))
        stopping = asyncio.Event()
        rescuer = asyncio.create_task(_rescue_loop(app.state.queue, settings.rescue_interval_seconds, stopping))
        try:
            yield
        finally:
            stopping.set()
            _, late = await asyncio.wait([rescuer], timeout=5)
            for task in late:
                task.cancel()
            await redis.aclose()

    app = FastAPI(title="Aldebaran pull API", version="1",
                  description="AweQ-style at-least-once pull queue (send, receive, delete, stats).",
                  lifespan=lifespan)
    app.state.settings = settings  # for routers included below (the dashboard reads its vhost, channels)
    app.include_router(_api_router(settings))
    for router in routers:
        app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=body_limit(settings))
    return app


def _api_router(settings: Settings) -> APIRouter:
    router = APIRouter(dependencies=[Depends(authorizer(settings.api_token))],
                       responses={401: {"description": "Missing or wrong bearer token"}})

    @router.post("/send-message", response_model=SendReply,
                 responses={400: {"description": EMPTY_MESSAGE, "content": {"text/plain": {}}},
                            413: {"model": ErrorReply, "description": "Message or request body too large"}})
    async def send_message(body: SendBody, queue: QueueDep) -> object:
        """Enqueue one message; its key (a UUID) is what the consumer deletes later."""
        if not body.message:
            return PlainTextResponse(EMPTY_MESSAGE, status_code=400)
        if len(body.message.encode()) > settings.max_message_bytes:
            return JSONResponse(ErrorReply(message="Message too large.").model_dump(), status_code=413)
        key, _ = await queue.send(body.message)
        return SendReply(key=key)

    @router.get("/receive-message", response_model=ReceiveReply)
    async def receive_message(queue: QueueDep,
                              count: Annotated[int, Query(ge=1, le=MAX_BATCH)] = 1) -> ReceiveReply:
        """Check out up to `count` messages; undeleted ones come back after the checkout lifetime."""
        got = await queue.receive(count)
        return ReceiveReply(message=_batch_note(count, len(got)),
                            messages=[ReceivedMessage(key=m.key, timestamp=m.timestamp,
                                                      retry_count=m.retry_count, message=m.message)
                                      for m in got])

    @router.delete("/delete-message/{key}", response_model=OkayReply, responses={404: {"model": ErrorReply}})
    async def delete_message(key: Annotated[str, Path(max_length=100)], queue: QueueDep) -> object:
        """Acknowledge a processed message."""
        if not await queue.delete(key):
            return JSONResponse(ErrorReply(message=NOT_FOUND).model_dump(), status_code=404)
        return OkayReply()

    @router.get("/get-stats", response_model=StatsReply)
    async def get_stats(queue: QueueDep) -> StatsReply:
        """Queue length, checkouts and the timing configuration."""
        stats = await queue.stats()
        return StatsReply(stats=QueueStats(
            queue_length=stats.queue_length, checkouts_count=stats.checkouts_count,
            checkout_lifetime=_seconds(settings.checkout_lifetime_seconds),
            rescue_interval=_seconds(settings.rescue_interval_seconds),
            dead_letter_count=stats.dead_letter_count))

    return router
