"""Per-test isolation on the machine's real RabbitMQ and Redis.

Each test gets its own RabbitMQ virtual host (created and deleted through the
management API) and its own Redis key prefix, so tests never see each other's
queues or keys. The URLs can be pointed elsewhere with TEST_AMQP_URL,
TEST_MANAGEMENT_URL and TEST_REDIS_URL.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import redis

AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
MANAGEMENT_URL = os.environ.get("TEST_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672/")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _management() -> httpx.Client:
    parts = urlsplit(MANAGEMENT_URL)
    base = urlunsplit((parts.scheme, f"{parts.hostname}:{parts.port or 15672}", parts.path.rstrip("/"), "", ""))
    return httpx.Client(base_url=base, auth=(parts.username or "guest", parts.password or "guest"), timeout=30)


def vhost_url(vhost: str, base: str = AMQP_URL) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), parts.query, ""))


@dataclass
class Vhost:
    name: str
    amqp_url: str
    management_url: str

    def queues(self) -> dict[str, dict]:
        with _management() as http:
            response = http.get(f"/api/queues/{quote(self.name, safe='')}")
            response.raise_for_status()
            return {q["name"]: q for q in response.json()}

    def bindings(self) -> set[tuple[str, str, str]]:
        """(exchange, queue, routing key) of every binding from a named exchange to a queue."""
        with _management() as http:
            response = http.get(f"/api/bindings/{quote(self.name, safe='')}")
            response.raise_for_status()
            return {(b["source"], b["destination"], b["routing_key"]) for b in response.json()
                    if b["source"] and b["destination_type"] == "queue"}

    def exchanges(self) -> dict[str, dict]:
        with _management() as http:
            response = http.get(f"/api/exchanges/{quote(self.name, safe='')}")
            response.raise_for_status()
            return {e["name"]: e for e in response.json() if e["name"] and not e["name"].startswith("amq.")}


def create_vhost(prefix: str = "test") -> Vhost:
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    with _management() as http:
        http.put(f"/api/vhosts/{quote(name, safe='')}").raise_for_status()
        user = urlsplit(AMQP_URL).username or "guest"
        http.put(f"/api/permissions/{quote(name, safe='')}/{user}",
                 json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    return Vhost(name=name, amqp_url=vhost_url(name), management_url=MANAGEMENT_URL)


def delete_vhost(vhost: Vhost) -> None:
    with _management() as http:
        http.delete(f"/api/vhosts/{quote(vhost.name, safe='')}")


def check_services() -> None:
    """Fail loudly (never skip) when the real broker or Redis is not there."""
    try:
        with _management() as http:
            http.get("/api/overview").raise_for_status()
    except Exception as exc:
        raise RuntimeError(
            f"RabbitMQ management API not reachable at {MANAGEMENT_URL.split('@')[-1]} ({exc}); "
            "run `make setup` (it starts RabbitMQ and enables rabbitmq_management)"
        ) from exc
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=5).ping()
    except Exception as exc:
        raise RuntimeError(f"Redis not reachable at {REDIS_URL} ({exc}); run `make setup`") from exc


def redis_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def clean_redis(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])
