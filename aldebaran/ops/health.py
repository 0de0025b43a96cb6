"""`aldebaran health`: is each dependency up, right now, from this machine?

Each check connects for real with a short timeout and no retries (a health check that
retries for a minute hides the outage it is there to show): AMQP to every broker URL,
the management API (and the vhost there), and Redis (PING).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pika
import pika.exceptions
import redis

from aldebaran.errors import AldebaranError
from aldebaran.io.redis import describe, sync_client
from aldebaran.ops.management import Management
from aldebaran.settings import Settings, mask_url


@dataclass
class Check:
    name: str
    target: str
    ok: bool
    detail: str


def check_amqp(url: str, timeout: float) -> Check:
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.retry_delay = 0
    params.socket_timeout = timeout
    params.stack_timeout = timeout
    params.blocked_connection_timeout = timeout
    params.client_properties = {"connection_name": "aldebaran-health"}
    try:
        connection = pika.BlockingConnection(params)
    except (pika.exceptions.AMQPError, OSError) as exc:
        return Check("rabbitmq", mask_url(url), False, _reason(exc))
    connection.close()
    return Check("rabbitmq", mask_url(url), True, "AMQP connection opened")


def check_management(settings: Settings, timeout: float) -> Check:
    try:
        with Management(settings, timeout=timeout) as mgmt:
            overview = mgmt.overview()
            mgmt.vhost_info()
            target = mask_url(mgmt.url)
    except AldebaranError as exc:
        return Check("management", mask_url(settings.management_url), False, mask_url(str(exc)))
    return Check("management", target, True, f"RabbitMQ {overview.get('rabbitmq_version', '?')}, vhost found")


def check_redis(settings: Settings, timeout: float) -> Check:
    """PING the master (found through the sentinels with a Sentinel URL) and count its replicas.

    Fails when fewer replicas are attached than `redis_min_replicas_acked` asks for: the
    workers' writes would then wait and fail, and the pipeline stands still.
    """
    target = describe(settings)
    client = sync_client(settings.redis_url, timeout=timeout, tls_ca_file=settings.tls_ca_file)
    try:
        client.ping()
        version = client.info("server").get("redis_version", "?")
        replicas = int(client.info("replication").get("connected_slaves", 0))
    except (redis.RedisError, OSError) as exc:
        return Check("redis", target, False, _reason(exc))
    finally:
        client.close()
    required = settings.redis_replicas_required
    detail = f"PING answered (Redis {version}), {replicas} replica(s) attached"
    if replicas < required:
        return Check("redis", target, False, f"{detail}, {required} required (redis_min_replicas_acked)")
    return Check("redis", target, True, detail)


def _reason(exc: BaseException) -> str:
    return mask_url(str(exc) or repr(exc) or type(exc).__name__)


def run_checks(settings: Settings, timeout: float = 5.0) -> list[Check]:
    """Every check, in order; none raises."""
    checks = [check_amqp(url, timeout) for url in settings.broker_urls]
    checks.append(check_management(settings, timeout))
    checks.append(check_redis(settings, timeout))
    return checks


def summary(checks: list[Check]) -> str | None:
    """One line naming what is down, or None when all is up."""
    down = [f"{c.name} ({c.target}: {c.detail})" for c in checks if not c.ok]
    return f"down: {'; '.join(down)}" if down else None


def to_json(checks: list[Check]) -> str:
    return json.dumps({"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}, indent=2)


def render(checks: list[Check], console: object) -> None:
    from rich.table import Table

    table = Table(title="Aldebaran dependencies", title_justify="left")
    for column in ("check", "target", "status", "detail"):
        table.add_column(column, overflow="fold")
    for c in checks:
        table.add_row(c.name, c.target, "[green]up[/green]" if c.ok else "[red]DOWN[/red]", c.detail)
    console.print(table)  # type: ignore[attr-defined]
