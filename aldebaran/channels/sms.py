"""`sms`: Twilio's Messages API shape (form POST, basic auth), one request per number.

Twilio has no idempotency key, so each number is its own target: after a partial
failure only the numbers that did not get the text are retried.
"""

from __future__ import annotations

import httpx

from aldebaran.channels import http_client as http
from aldebaran.channels.base import Alert
from aldebaran.channels.text import one_line
from aldebaran.settings import Settings, SmsChannel

MAX_BODY_CHARS = 1600  # Twilio's limit for one message


class SmsSink:
    def __init__(self, config: SmsChannel) -> None:
        self._config = config
        self.targets = tuple(config.to_numbers)
        self._url = f"{config.base_url.rstrip('/')}/2010-04-01/Accounts/{config.account_sid}/Messages.json"
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._http = http.client(self._config.timeout_seconds,
                                 auth=httpx.BasicAuth(self._config.account_sid, self._config.auth_token))

    async def send(self, alert: Alert, target: str) -> None:
        assert self._http is not None
        form = {"To": target, "From": self._config.from_number, "Body": one_line(alert.summary())[:MAX_BODY_CHARS]}
        http.check(await http.post(self._http, self._url, self._config.timeout_seconds, data=form,
                                   headers={"Idempotency-Key": http.idempotency_key(f"{alert.alert_id}/{target}")}))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def build(config: SmsChannel, settings: Settings) -> SmsSink:
    return SmsSink(config)
