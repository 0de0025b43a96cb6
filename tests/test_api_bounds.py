"""The pull API's request body limit over real HTTP: 413 before a huge body is read, token or not."""

from __future__ import annotations

import asyncio

import pytest

from aldebaran.api.app import body_limit
from aldebaran.settings import Settings
from tests.test_pull_api import api_server


async def _raw(base: str, request: bytes, then: bytes = b"") -> bytes:
    """Send `request` (headers and a little body), then `then`; the server's whole answer."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        if then:
            writer.write(then)
            await writer.drain()
        return await asyncio.wait_for(reader.read(65536), timeout=30)
    finally:
        writer.close()


@pytest.mark.parametrize("token", [None, "s3cret"])
async def test_a_declared_huge_body_gets_413_before_it_is_sent(settings: Settings, token: str | None) -> None:
    async with api_server(settings.model_copy(update={"api_token": token})) as http:
        head = (b"POST /send-message HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 200000000\r\n\r\n{\"message\": \"")
        answer = await _raw(str(http.base_url), head)  # 13 bytes of a 200 MB body sent: answered anyway
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"Request body over" in answer
        # the API still serves
        assert (await http.get("/get-stats", headers={"Authorization": f"Bearer {token}"})).status_code == 200


async def test_a_chunked_body_is_cut_off_at_the_limit(settings: Settings) -> None:
    limit = body_limit(settings)
    chunk = b"x" * 65536
    async with api_server(settings) as http:
        head = (b"POST /send-message HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limit // len(chunk) + 2))
        answer = await _raw(str(http.base_url), head, body)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        small = await http.post("/send-message", json={"message": "y" * (settings.max_message_bytes - 10)})
        assert small.status_code == 200  # the limit never refuses a message send-message accepts


def test_the_api_never_imports_the_dashboard() -> None:
    """One-way layering: the dashboard builds on the API, never the reverse."""
    import aldebaran.api.app as app_module

    with open(app_module.__file__, encoding="utf-8") as f:
        source = f.read()
    assert "dashboard" not in "".join(line for line in source.splitlines() if "import" in line)
