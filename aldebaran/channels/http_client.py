"""The HTTP client the HTTP-based sinks share: one pool, the channel's timeout, no redirects."""

from __future__ import annotations

import httpx


def client(timeout_seconds: float, **options: object) -> httpx.AsyncClient:
    """A client that treats anything but 2xx as failure (redirects are not followed)."""
    return httpx.AsyncClient(timeout=timeout_seconds, follow_redirects=False, **options)  # type: ignore[arg-type]


def check(response: httpx.Response) -> None:
    """Raise with the status and the start of the body, which becomes the parked reason."""
    if not response.is_success:
        raise RuntimeError(f"HTTP {response.status_code} from {response.request.url}: {response.text[:200]}")
