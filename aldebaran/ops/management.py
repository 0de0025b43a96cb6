"""The RabbitMQ management HTTP API, reached through `settings.management_url`.

Depths, rates and consumer counts only exist there (AMQP can tell a queue's depth but
not its rates), so `stats` and `health` read them from it for the vhost the workers use.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

from aldebaran.errors import ConfigError, UnavailableError
from aldebaran.settings import Settings, mask_url


def vhost_of(amqp_url: str) -> str:
    """The virtual host an AMQP URL names; an empty path is the default vhost `/`."""
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


class Management:
    """A small synchronous client for the management API, scoped to one vhost."""

    def __init__(self, settings: Settings, timeout: float = 10.0) -> None:
        parts = urlsplit(settings.management_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("management_url: must be http(s)://user:password@host:port/ "
                              f"(got {mask_url(settings.management_url)})")
        netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.url = mask_url(settings.management_url)
        self.vhost = vhost_of(settings.amqp_url)
        self._vhost_path = quote(self.vhost, safe="")
        self._http = httpx.Client(
            base_url=base,
            auth=(unquote(parts.username or "guest"), unquote(parts.password or "guest")),
            timeout=timeout,
        )

    def __enter__(self) -> Management:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def _unreachable(self, exc: httpx.HTTPError) -> UnavailableError:
        return UnavailableError(f"RabbitMQ management API at {self.url} unreachable: {exc or type(exc).__name__}")

    def _refused(self) -> ConfigError:
        return ConfigError(f"RabbitMQ management API at {self.url} refused the credentials "
                           "(check ALDEBARAN_MANAGEMENT_URL)")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code == 401:
            raise self._refused()
        if response.status_code == 404:
            raise UnavailableError(f"RabbitMQ management API at {self.url}: {path} not found "
                                   f"(is vhost {self.vhost!r} there?)")
        if response.is_error:
            raise UnavailableError(f"RabbitMQ management API at {self.url}: {path} answered {response.status_code}")
        return response.json()

    def put(self, path: str, body: dict[str, Any]) -> None:
        """Create or replace an object (a user, a permission); the API answers without a body."""
        try:
            response = self._http.put(path, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code == 401:
            raise self._refused()
        if response.is_error:
            raise UnavailableError(f"RabbitMQ management API at {self.url}: PUT {path.split('/')[2]} answered "
                                   f"{response.status_code}")

    def overview(self) -> dict[str, Any]:
        return self._call("GET", "/api/overview")

    def vhost_info(self) -> dict[str, Any]:
        return self._call("GET", f"/api/vhosts/{self._vhost_path}")

    def queues(self) -> list[dict[str, Any]]:
        """Every queue of the vhost with its depth, consumers, type and rates."""
        columns = "name,type,arguments,messages,messages_ready,messages_unacknowledged,consumers,message_stats"
        return self._call("GET", f"/api/queues/{self._vhost_path}", params={"columns": columns})

    def peek(self, queue: str, count: int) -> list[dict[str, Any]]:
        """The first `count` messages of a queue, put back where they were (requeued)."""
        body = {"count": count, "ackmode": "reject_requeue_true", "encoding": "auto", "truncate": 2000}
        return self._call("POST", f"/api/queues/{self._vhost_path}/{quote(queue, safe='')}/get", json=body)
