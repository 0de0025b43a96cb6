"""Channels facing hostile recipients and hostile ids, over real HTTP, SMTP, RabbitMQ and Redis.

A recipient that answers without end or drips its answer cannot hold a delivery past
`timeout_seconds`; link-local and non-HTTP URLs are refused; ids with CR/LF, NUL or
non-ASCII characters reach the webhook (percent-encoded `Idempotency-Key`), SMS and
e-mail recipients instead of being parked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import unquote

import httpx
import pytest
from aiosmtpd.controller import Controller

from aldebaran.channels import http_client as http
from aldebaran.channels.base import NotDelivered
from aldebaran.settings import WebhookChannel
from tests.support.processes import free_port
from tests.test_channels import SmtpRecorder, deliver_one, http_peer, make_alert, with_channels

HOSTILE_ORDER = "é\r\nBcc: x@evil\x00&('\U0001F600"


@asynccontextmanager
async def hostile_server(drip: bool) -> AsyncIterator[tuple[str, list[int]]]:
    """An HTTP server that answers 200 and then either streams without end or drips a byte a second."""
    sent = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 400000000\r\n\r\n")
        chunk = b"x" if drip else b"x" * 65536
        try:
            while sent[0] < 400_000_000:
                writer.write(chunk)
                await writer.drain()
                sent[0] += len(chunk)
                if drip:
                    await asyncio.sleep(1)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook", sent
    finally:
        server.close()


async def test_an_endless_answer_is_read_only_to_the_cap() -> None:
    async with hostile_server(drip=False) as (url, sent), http.client(5) as client:
        answer = await http.post(client, url, 30, content=b"{}")
        assert answer.is_success and len(answer.body) == http.MAX_RESPONSE_BYTES
        await asyncio.sleep(0)  # let the server notice the closed connection
    assert sent[0] < 50_000_000  # kernel buffers at most, never the 400 MB on offer


async def test_a_dripping_answer_cannot_hold_a_delivery_past_its_timeout() -> None:
    async with hostile_server(drip=True) as (url, _), http.client(1.5) as client:
        with pytest.raises(RuntimeError, match=r"no complete answer from .* within 1.5 s"):
            await asyncio.wait_for(http.post(client, url, 1.5, content=b"{}"), timeout=30)


async def test_a_connection_idle_past_the_keepalive_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that drops a second request on a kept-alive connection (its idle timeout firing
    as the request arrives, made certain): after `KEEPALIVE_SECONDS` idle the client opens a new
    connection, so the second alert is answered instead of going in doubt."""
    connections = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the body, b"{}"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read(1)  # a second request on this connection, or the client's close
        writer.close()

    monkeypatch.setattr(http, "KEEPALIVE_SECONDS", 0.2)
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        async with http.client(5) as client:
            assert (await http.post(client, url, 5, content=b"{}")).is_success
            await asyncio.sleep(0.5)  # idle past the keep-alive expiry: the stimulus, not a wait
            assert (await http.post(client, url, 5, content=b"{}")).is_success
    finally:
        server.close()
    assert connections[0] == 2


async def test_link_local_targets_are_refused_at_send_unless_allowed() -> None:
    async with http.client(1) as client:
        with pytest.raises(NotDelivered, match="link-local") as refused:
            await http.post(client, "http://169.254.169.254/latest/meta-data?token=abc", 1)
        assert "abc" not in str(refused.value) and "token=***" in str(refused.value)
        assert refused.value.permanent  # nothing was sent, and trying again cannot help
        with pytest.raises(NotDelivered, match="link-local"):
            await http.post(client, "http://[fe80::1]/x", 1)
        try:  # allowed: tried (whatever answers there, if anything)
            outcome: object = await http.post(client, "http://169.254.0.1:9/x", 0.5, allow_link_local=True)
        except (httpx.HTTPError, RuntimeError, NotDelivered) as exc:
            outcome = exc
        assert "link-local" not in str(outcome)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://h/", "http:///nohost", "ftp://h/x"])
def test_only_http_urls_are_accepted_at_start(url: str) -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        WebhookChannel(name="w", kind="webhook", url=url)


def test_link_local_urls_are_refused_at_start_unless_allowed() -> None:
    for url in ("http://169.254.169.254/latest", "http://[fe80::1]/x"):
        with pytest.raises(ValueError, match="allow_link_local"):
            WebhookChannel(name="w", kind="webhook", url=url)
        assert WebhookChannel(name="w", kind="webhook", url=url, allow_link_local=True).url == url


async def test_a_hostile_id_reaches_the_webhook_with_a_percent_encoded_key(settings) -> None:
    alert = make_alert(HOSTILE_ORDER)
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url + "/alerts"})
        await deliver_one(s, "hook", alert, lambda: peer.accepted())
    [request] = peer.requests
    key = request["headers"]["idempotency-key"]
    assert key.isascii() and unquote(key) == alert["alert_id"]
    assert http.idempotency_key("over_purchase:1001") == "over_purchase:1001"


async def test_a_hostile_id_reaches_sms_recipients_in_one_line(settings) -> None:
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "sms", "kind": "sms", "base_url": peer.url, "account_sid": "AC1",
                                     "auth_token": "t", "from_number": "+1", "to_numbers": ["+2"]})
        await deliver_one(s, "sms", make_alert(HOSTILE_ORDER), lambda: peer.accepted())
    [request] = peer.requests
    body = request["form"]["Body"]
    assert "\r" not in body and "\n" not in body and "\x00" not in body
    assert "é\\r\\nBcc: x@evil\\x00&('\U0001F600" in body


async def test_a_hostile_id_reaches_email_recipients_without_a_header_injection(settings) -> None:
    recorder = SmtpRecorder()
    controller = Controller(recorder, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        s = with_channels(settings, {"name": "mail", "kind": "email", "host": "127.0.0.1", "port": controller.port,
                                     "recipients": ["ops@example.org"]})
        await deliver_one(s, "mail", make_alert(HOSTILE_ORDER), lambda: recorder.envelopes)
    finally:
        controller.stop()
    [envelope] = recorder.envelopes
    assert envelope.rcpt_tos == ["ops@example.org"]
    headers = envelope.content.split(b"\r\n\r\n", 1)[0].decode()
    assert "\nBcc:" not in headers
