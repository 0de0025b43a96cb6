"""RabbitMQ's firehose (`amq.rabbitmq.trace`) for one vhost: is it on, and turning it on.

The management API first (it works from any host with the management URL), then
`rabbitmqctl trace_on` (only where the CLI reaches the node: same host, same Erlang cookie).
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

from aldebaran.log import get_logger

log = get_logger("tracer")

TRACE_EXCHANGE = "amq.rabbitmq.trace"


class Firehose:
    """Turns the firehose on for one vhost: management API first, `rabbitmqctl` as fallback.

    The HTTP API works from any host with the management URL; `rabbitmqctl trace_on`
    only where the CLI can reach the node (same host, same Erlang cookie).
    """

    def __init__(self, management_url: str, vhost: str) -> None:
        parts = urlsplit(management_url)
        self.base = urlunsplit((parts.scheme, f"{parts.hostname}:{parts.port or 15672}",
                                parts.path.rstrip("/"), "", ""))
        self.auth = (unquote(parts.username or "guest"), unquote(parts.password or "guest"))
        self.vhost = vhost

    async def is_on(self) -> bool | None:
        try:
            async with httpx.AsyncClient(base_url=self.base, auth=self.auth, timeout=10) as http:
                response = await http.get(f"/api/vhosts/{quote(self.vhost, safe='')}")
                response.raise_for_status()
                return bool(response.json().get("tracing"))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("cannot read the firehose state", vhost=self.vhost, error=str(exc))
            return None

    async def turn_on(self) -> bool:
        try:
            async with httpx.AsyncClient(base_url=self.base, auth=self.auth, timeout=10) as http:
                url = f"/api/vhosts/{quote(self.vhost, safe='')}"
                current = (await http.get(url)).json()
                body = {"tracing": True, "description": current.get("description", ""),
                        "tags": ",".join(current.get("tags") or [])}
                (await http.put(url, json=body)).raise_for_status()
                log.info("firehose turned on", vhost=self.vhost, via="management API")
                return True
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("management API could not turn the firehose on", vhost=self.vhost, error=str(exc))
        try:
            proc = await asyncio.create_subprocess_exec(
                "rabbitmqctl", "trace_on", "-p", self.vhost,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        except OSError as exc:  # no CLI on this host
            log.error("cannot turn the firehose on", vhost=self.vhost, output=f"rabbitmqctl: {exc}")
            return False
        out, _ = await proc.communicate()
        if proc.returncode == 0:
            log.info("firehose turned on", vhost=self.vhost, via="rabbitmqctl")
            return True
        log.error("cannot turn the firehose on", vhost=self.vhost, output=out.decode(errors="replace")[-300:])
        return False
