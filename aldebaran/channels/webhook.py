"""`webhook`: HTTP POST of the alert JSON, with the alert_id as `Idempotency-Key`.

The header is the alert_id percent-encoded (`http_client.idempotency_key`): unchanged for
ids of letters, digits and `-._~:/`, and valid for any id. One delivery takes at most
`timeout_seconds` in all, reads at most 64 KiB of the answer, and a link-local target is
refused unless `allow_link_local` is set.
"""

from __future__ import annotations

import httpx

from aldebaran.channels import http_client as http
from aldebaran.channels.base import Alert
from aldebaran.settings import Settings, WebhookChannel


class WebhookSink:
    targets = ("",)

    def __init__(self, config: WebhookChannel) -> None:
        self._config = config
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._http = http.client(self._config.timeout_seconds)

    async def send(self, alert: Alert, target: str) -> None:
        assert self._http is not None
        headers = {**self._config.headers, "Content-Type": "application/json",
                   "Idempotency-Key": http.idempotency_key(alert.alert_id)}
        http.check(await http.post(self._http, self._config.url, self._config.timeout_seconds,
                                   allow_link_local=self._config.allow_link_local,
                                   content=alert.body, headers=headers))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def build(config: WebhookChannel, settings: Settings) -> WebhookSink:
    return WebhookSink(config)
