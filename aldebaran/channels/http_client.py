"""The HTTP client the HTTP-based sinks share: one pool, no redirects, every answer bounded.

A recipient is outside our control: it may answer 300 MB, drip one byte every two
seconds, or be a URL pointing at this machine's cloud metadata service. So a request
has one deadline for everything (connect, send, read), reads at most `MAX_RESPONSE_BYTES`
of the answer, and link-local addresses are refused unless the channel allows them.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from aldebaran import config_checks
from aldebaran.channels.base import NotDelivered
from aldebaran.settings import mask_url

MAX_RESPONSE_BYTES = 64 * 1024  # what a recipient's answer may be; the rest is never read
RETRYABLE_STATUS = {408, 425, 429}  # 4xx answers that say "try again later"; any other 4xx is final
# A pooled connection idle this long is closed, not reused. Servers drop idle keep-alive
# connections after 2 s (gunicorn), 5 s (uvicorn, Node.js, Apache): a request sent on one as
# the server closes it dies unanswered, and at most once that alert goes in doubt.
KEEPALIVE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Answer:
    """A recipient's answer: its status and at most MAX_RESPONSE_BYTES of its body."""

    status_code: int
    url: str
    body: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


def client(timeout_seconds: float, **options: object) -> httpx.AsyncClient:
    """A client that treats anything but 2xx as failure (redirects are not followed) and
    reuses a connection only while no server would have closed it (`KEEPALIVE_SECONDS`)."""
    # The pool sizes are httpx's own defaults; only the idle expiry changes (theirs is 5 s).
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_SECONDS)
    return httpx.AsyncClient(timeout=timeout_seconds, follow_redirects=False, limits=limits,
                             **options)  # type: ignore[arg-type]


def idempotency_key(value: str) -> str:
    """A header-safe `Idempotency-Key`: the value percent-encoded as UTF-8 (RFC 3986).

    Ids may hold any character (CONTRACT §1); a header may not (non-ASCII, CR/LF, NUL).
    Letters, digits and `-._~:/` stay as they are, so `over_purchase:1` is unchanged and
    the encoding is reversible: a recipient can percent-decode the header to get the id.
    """
    return quote(value, safe=":/")


def is_link_local(host: str) -> bool:
    """169.254.0.0/16 or fe80::/10 (cloud metadata services live there), zone ids ignored."""
    return config_checks.is_link_local(host.strip("[]").split("%")[0])


async def refuse_link_local(url: str) -> None:
    """Raise `NotDelivered` when `url`'s host is, or resolves to, a link-local address."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if is_link_local(host):
        raise NotDelivered(f"refused: {mask_url(url)} is a link-local address (allow_link_local is off)",
                           permanent=True)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
    except OSError:
        return  # unresolvable: the request itself fails with the resolver's reason
    if any(is_link_local(str(info[4][0])) for info in infos):
        raise NotDelivered(f"refused: {mask_url(url)} resolves to a link-local address (allow_link_local is off)",
                           permanent=True)


class _Progress:
    """httpcore's trace hook: whether any byte of the request left for the recipient."""

    def __init__(self) -> None:
        self.sending = False

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if ".send_request_headers." in name:
            self.sending = True


async def post(http: httpx.AsyncClient, url: str, total_seconds: float, *,
               allow_link_local: bool = False, **request: Any) -> Answer:
    """POST with one deadline for the whole exchange and a bounded read of the answer.

    A failure before any byte of the request was sent (no connection, a refused address)
    raises `NotDelivered`; a failure after it (a timeout, a dropped connection) raises
    anything else: the recipient may have the alert (docs/delivery.md).
    """
    if not allow_link_local:
        await refuse_link_local(url)
    progress = _Progress()
    try:
        async with asyncio.timeout(total_seconds):
            async with http.stream("POST", url, extensions={"trace": progress}, **request) as response:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) >= MAX_RESPONSE_BYTES:
                        break  # enough to say what went wrong; closing drops the rest
                return Answer(response.status_code, str(response.request.url), bytes(body[:MAX_RESPONSE_BYTES]))
    except TimeoutError:
        reason = f"no complete answer from {mask_url(url)} within {total_seconds:g} s"
        if not progress.sending:
            raise NotDelivered(reason) from None
        raise RuntimeError(reason) from None
    except httpx.HTTPError as exc:
        if not progress.sending:
            raise NotDelivered(f"{type(exc).__name__}: {mask_url(str(exc))}") from None
        raise


def check(answer: Answer | httpx.Response) -> None:
    """Raise `NotDelivered` for anything but 2xx: the recipient answered, and did not take it.

    The status and the start of the body become the parked reason (URL masked). A 4xx
    other than "try again later" is final: sending the same request again cannot help.
    """
    if isinstance(answer, httpx.Response):
        answer = Answer(answer.status_code, str(answer.request.url), answer.content[:MAX_RESPONSE_BYTES])
    if not answer.is_success:
        text = answer.body[:200].decode("utf-8", "replace")
        final = 400 <= answer.status_code < 500 and answer.status_code not in RETRYABLE_STATUS
        raise NotDelivered(f"HTTP {answer.status_code} from {mask_url(answer.url)}: {text}", permanent=final)
