"""`push`: POST {base_url}/v1/push per device, bearer token, JSON {to, title, body, data}."""

from __future__ import annotations

import httpx

from aldebaran.channels import http_client as http
from aldebaran.channels.base import Alert
from aldebaran.channels.text import one_line
from aldebaran.settings import PushChannel, Settings

PATH = "/v1/push"


class PushSink:
    def __init__(self, config: PushChannel) -> None:
        self._config = config
        self.targets = tuple(config.devices)
        self._url = config.base_url.rstrip("/") + PATH
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._http = http.client(self._config.timeout_seconds,
                                 headers={"Authorization": f"Bearer {self._config.token}"})

    async def send(self, alert: Alert, target: str) -> None:
        assert self._http is not None
        payload = {"to": target, "title": f"Aldebaran: {alert.fields.get('kind', 'alert')}",
                   "body": one_line(alert.summary()), "data": alert.fields}
        http.check(await http.post(self._http, self._url, self._config.timeout_seconds, json=payload,
                                   headers={"Idempotency-Key": http.idempotency_key(f"{alert.alert_id}/{target}")}))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def build(config: PushChannel, settings: Settings) -> PushSink:
    return PushSink(config)
