"""The web dashboard served by `aldebaran api` at `/`: the pipeline's state at a glance.

The page is plain HTML + vanilla JS + CSS from `static/` (no build step, no CDN, works
offline); it polls `/api/dashboard`, whose JSON is what `aldebaran stats` gathers (queue
depths and rates, open books, dead letters with their reasons: `aldebaran.ops.stats`,
reused, never copied) plus what only the API process knows: the pull queue's state and,
per latest alert, which configured channels have delivered it (the channels' ledgers).

One snapshot is shared by every poll within `CACHE_SECONDS`, so many open browsers cost
the broker's management API one query per second, not one per tab.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse
from fastapi.security import HTTPAuthorizationCredentials

from aldebaran.api import app as api_app
from aldebaran.api.app import authorizer, bearer
from aldebaran.api.pullqueue import PullQueue
from aldebaran.channels.ledger import IN_DOUBT, statuses
from aldebaran.channels.registry import build_sink
from aldebaran.errors import AldebaranError
from aldebaran.io.redis import Keys, sync_client
from aldebaran.log import get_logger
from aldebaran.ops import stats as ops_stats
from aldebaran.ops.delivery import in_doubt_counts
from aldebaran.ops.management import Management
from aldebaran.settings import Settings, mask_url
from declare.topology import DEAD_LETTER, REASON_HEADER, channel_dead_letter, channel_queue

log = get_logger("dashboard")

STATIC = Path(__file__).with_name("static")
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
LATEST_ALERTS = 20
PEEKED_DEAD_LETTERS = 10
CACHE_SECONDS = 1.0

router = APIRouter()


@dataclass
class Parked:
    """An alert a channel gave up on, from the channel's own dead-letter queue."""

    channel: str
    queue: str
    alert_id: str | None
    reason: str | None
    body: str


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _authorize(request: Request,
               credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """The data needs the API's bearer token when one is set; the page itself holds none."""
    authorizer(_settings(request).api_token)(credentials)


def create_app(settings: Settings, **options: Any) -> FastAPI:
    """What `aldebaran api` serves: the pull API with this page (the API never imports the page)."""
    return api_app.create_app(settings, routers=[router], **options)


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/{name}", include_in_schema=False)
async def asset(name: str) -> FileResponse:
    """Only the page's own files: nothing else under the package is reachable."""
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail="Not found.")
    return FileResponse(STATIC / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})


# Kept out of the OpenAPI spec: that spec is the AweQ pull API's contract; this is the
# page's feed and may change with the page.
@router.get("/api/dashboard", dependencies=[Depends(_authorize)], include_in_schema=False)
async def dashboard(request: Request) -> dict[str, Any]:
    """Everything the page shows, in one JSON object (also handy for scripts)."""
    state = request.app.state
    lock: asyncio.Lock = _state(state, "dashboard_lock", asyncio.Lock)
    async with lock:
        cached = getattr(state, "dashboard_cache", None)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        snapshot = await build_snapshot(_settings(request), state.queue)
        state.dashboard_cache = (time.monotonic(), snapshot)
        return snapshot


def _state(state: Any, name: str, factory: Any) -> Any:
    if not hasattr(state, name):
        setattr(state, name, factory())
    return getattr(state, name)


async def build_snapshot(settings: Settings, queue: PullQueue) -> dict[str, Any]:
    """One picture of the pipeline; a dependency that does not answer becomes a `problems` line."""
    problems: list[str] = []
    broker, alerts, doubt = await asyncio.gather(
        asyncio.to_thread(_broker_side, settings), asyncio.to_thread(_alerts_side, settings),
        asyncio.to_thread(in_doubt_counts, settings), return_exceptions=True)
    if isinstance(doubt, BaseException):
        problems.append(_problem(doubt))
        doubt = {}
    parked: list[Parked] = []
    if isinstance(broker, BaseException):
        problems.append(_problem(broker))
        broker = None
    else:
        broker, parked = broker
    if isinstance(alerts, BaseException):
        problems.append(_problem(alerts))
        alerts = None
    else:
        _mark_parked(alerts, parked)
    try:
        pull: dict[str, Any] | None = asdict(await queue.stats())
    except (redis.RedisError, OSError) as exc:
        pull = None
        problems.append(_problem(exc))
    if pull is not None:
        pull.update(name=queue.name, checkout_lifetime_seconds=settings.checkout_lifetime_seconds,
                    max_receive_count=settings.max_receive_count)
    depths = {q.name: q.messages for q in broker.queues} if broker else {}
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "vhost": broker.vhost if broker else None,
        "queues": [asdict(q) for q in broker.queues] if broker else None,
        "book_queues": broker.book_queues if broker else None,
        "open_books": broker.open_books if broker else None,
        "open_books_source": broker.open_books_source if broker else None,
        "channels": [_channel(c, settings, depths, doubt.get(c.name)) for c in settings.channels],
        "alerts": alerts,
        "pull_queue": pull,
        "dead_letters": {
            "count": broker.dead_letters,
            "peek": [dict(asdict(d), queue=DEAD_LETTER) for d in broker.dead_letter_peek],
            "note": broker.dead_letter_note,
            "parked": [asdict(p) for p in parked],
        } if broker else None,
        "problems": problems + (broker.problems if broker else []),
    }


def _problem(exc: BaseException) -> str:
    text = mask_url(str(exc) or type(exc).__name__)
    log.warning("dashboard source unavailable", error=text)
    return text


def _broker_side(settings: Settings) -> tuple[ops_stats.Stats, list[Parked]]:
    """Queues, open books and dead letters as `aldebaran stats` sees them, plus parked alerts.

    `collect` skips peeking a quorum dead-letter queue (each requeue counts toward its
    delivery limit), and so does `_parked`, so polling every second never wears them away.
    """
    try:
        stats = ops_stats.collect(settings, alerts=0, peek=PEEKED_DEAD_LETTERS)
        depths = {q.name: q.messages for q in stats.queues}
        waiting = [c.name for c in settings.channels if depths.get(channel_dead_letter(c.name))]
        return stats, _parked(settings, waiting) if waiting else []
    except AldebaranError:
        raise
    except Exception as exc:  # noqa: BLE001 - shown on the page instead of a 500
        raise AldebaranError(f"RabbitMQ management API: {exc}") from None


def _parked(settings: Settings, channels: list[str]) -> list[Parked]:
    """The oldest parked alerts of each channel whose dead-letter queue holds any."""
    out: list[Parked] = []
    with Management(settings) as mgmt:
        raw = {q["name"]: q for q in mgmt.queues()}
        for channel in channels:
            queue = raw.get(channel_dead_letter(channel))
            if queue is None or _is_quorum(queue):
                continue
            for message in mgmt.peek(queue["name"], PEEKED_DEAD_LETTERS):
                properties = message.get("properties") or {}
                reason = (properties.get("headers") or {}).get(REASON_HEADER)
                out.append(Parked(channel, queue["name"], properties.get("message_id"),
                                  None if reason is None else str(reason),
                                  str(message.get("payload", ""))[:200]))
    return out


def _is_quorum(queue: dict[str, Any]) -> bool:
    """The same test `ops.stats.peek_dead_letters` applies to the main dead-letter queue."""
    return queue.get("type") == "quorum" or (queue.get("arguments") or {}).get("x-queue-type") == "quorum"


def _channel(config: Any, settings: Settings, depths: dict[str, int], in_doubt: int | None) -> dict[str, Any]:
    return {
        "name": config.name,
        "kind": config.kind,
        "delivery": config.guarantee,
        "in_doubt": in_doubt,
        "recipients": len(_targets(config, settings)),
        "queued": depths.get(channel_queue(config.name)),
        "parked": depths.get(channel_dead_letter(config.name)),
    }


def _targets(config: Any, settings: Settings) -> tuple[str, ...]:
    """The recipients a channel's ledger records separately: its sink knows them (building
    a sink opens nothing; `start` does)."""
    return tuple(build_sink(config, settings).targets)


def _alerts_side(settings: Settings) -> list[dict[str, Any]]:
    """The newest alerts (the outbox's list) with each channel's ledger."""
    alerts = ops_stats.recent_alerts(settings, LATEST_ALERTS)
    keys = Keys(settings.redis_key_prefix)
    scopes = {c.name: [f"{c.name}/{t}" if t else c.name for t in _targets(c, settings)]
              for c in settings.channels}
    ids = [a.get("alert_id") if isinstance(a.get("alert_id"), str) else None for a in alerts]
    lookups = [keys.delivered(scope, i) for i in ids if i for name in scopes for scope in scopes[name]]
    found = dict(zip(lookups, _statuses(settings, lookups), strict=True))
    for alert, alert_id in zip(alerts, ids, strict=True):
        if alert_id is None:
            alert["delivery"] = {}
            continue
        alert["delivery"] = {name: _status([found[keys.delivered(s, alert_id)] for s in scope_list])
                             for name, scope_list in scopes.items()}
    return alerts


def _mark_parked(alerts: list[dict[str, Any]], parked: list[Parked]) -> None:
    """An undelivered alert found in its channel's dead-letter queue is `parked`, with why."""
    where = {(p.channel, p.alert_id): p.reason for p in parked}
    for alert in alerts:
        for channel, status in (alert.get("delivery") or {}).items():
            key = (channel, alert.get("alert_id"))
            if status["status"] != "delivered" and key in where:
                status.update(status="parked", reason=where[key])


def _status(marks: list[str | None]) -> dict[str, Any]:
    """One channel's state of one alert over its recipients (ledger statuses, `channels/ledger.py`)."""
    done = marks.count("delivered")
    if IN_DOUBT in marks:
        status = "in doubt"
    elif done == len(marks):
        status = "delivered"
    elif "sending" in marks:
        status = "sending"
    else:
        status = "partial" if done else "pending"
    return {"status": status, "delivered": done, "recipients": len(marks)}


def _statuses(settings: Settings, names: list[str]) -> list[str | None]:
    """The ledger status behind each key (None: no record)."""
    if not names:
        return []
    client = sync_client(settings.redis_url, timeout=5, tls_ca_file=settings.tls_ca_file)
    try:
        return statuses(client, Keys(settings.redis_key_prefix), names)
    finally:
        client.close()
