"""The AweQ-style pull API over real HTTP (uvicorn on loopback) and real Redis.

The seed document's curl sequence, the visibility timeout, the dead-letter list, the
bearer token, and a schemathesis run of the API's own OpenAPI spec.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from aldebaran.api.command import check_exposure, is_loopback
from aldebaran.api.dashboard import create_app
from aldebaran.errors import ConfigError
from aldebaran.settings import Settings
from tests.support.waiting import eventually

JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def api_server(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """`aldebaran api`'s app under uvicorn on a free loopback port, and a client for it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started or task.done(), "the API server to start")
    if task.done():
        task.result()
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await task


async def test_the_seed_documents_curl_sequence(settings: Settings) -> None:
    async with api_server(settings) as http:
        # send-message call which must fail...
        empty = await http.post("/send-message", content='{"message": ""}', headers=JSON)
        assert empty.status_code == 400
        assert empty.text == "Message content required."

        keys = []
        for n in range(1, 8):
            sent = await http.post("/send-message", content=f'{{"message": "job-details-0{n}"}}', headers=JSON)
            assert sent.status_code == 200
            body = sent.json()
            assert body["status"] == "okay" and set(body) == {"status", "key"}
            keys.append(body["key"])
        assert len({k for k in keys}) == 7 and all(len(k) == 36 and k.count("-") == 4 for k in keys)

        stats = (await http.get("/get-stats")).json()
        assert stats["status"] == "okay"
        assert {k: stats["stats"][k] for k in ("queue_length", "checkouts_count", "checkout_lifetime",
                                               "rescue_interval")} == {
            "queue_length": 7, "checkouts_count": 0, "checkout_lifetime": "120s", "rescue_interval": "2s"}

        batches = [(await http.get("/receive-message?count=3")).json() for _ in range(3)]
        assert [b["message"] for b in batches] == ["Requested batch-size available.",
                                                   "Requested batch-size available.",
                                                   "Fewer messages available than requested."]
        received = [m for b in batches for m in b["messages"]]
        assert [m["message"] for m in received] == [f"job-details-0{n}" for n in range(1, 8)]
        assert [m["key"] for m in received] == keys  # disjoint batches, FIFO
        assert all(set(m) == {"key", "timestamp", "retry_count", "message"} for m in received)
        assert all(m["retry_count"] == 0 and isinstance(m["timestamp"], int) for m in received)

        none = await http.get("/receive-message?count=4")
        assert none.json() == {"status": "okay", "message": "No messages available in queue.", "messages": []}
        default = await http.get("/receive-message")
        assert default.json()["messages"] == []

        stats = (await http.get("/get-stats")).json()["stats"]
        assert (stats["queue_length"], stats["checkouts_count"]) == (0, 7)

        deleted = await http.delete(f"/delete-message/{keys[3]}")
        assert deleted.status_code == 200 and deleted.json() == {"status": "okay"}
        again = await http.delete(f"/delete-message/{keys[3]}")
        assert again.status_code == 404 and again.json()["message"] == "Message not found."

        stats = (await http.get("/get-stats")).json()["stats"]
        assert (stats["queue_length"], stats["checkouts_count"]) == (0, 6)


async def test_concurrent_receivers_get_disjoint_batches_and_every_message(settings: Settings) -> None:
    async with api_server(settings) as http:
        sent = [(await http.post("/send-message", json={"message": f"m{n}"})).json()["key"] for n in range(40)]
        replies = await asyncio.gather(*(http.get("/receive-message?count=3") for _ in range(20)))
        keys = [m["key"] for r in replies for m in r.json()["messages"]]
        assert sorted(keys) == sorted(sent)  # each message handed out exactly once


async def test_receive_without_count_returns_one_message(settings: Settings) -> None:
    async with api_server(settings) as http:
        for text in ("a", "b"):
            await http.post("/send-message", json={"message": text})
        one = (await http.get("/receive-message")).json()
        assert [m["message"] for m in one["messages"]] == ["a"]
        assert one["message"] == "Requested batch-size available."


async def test_an_unacknowledged_message_comes_back_with_one_more_retry(settings: Settings) -> None:
    s = settings.model_copy(update={"checkout_lifetime_seconds": 0.3, "rescue_interval_seconds": 0.05})
    async with api_server(s) as http:
        key = (await http.post("/send-message", json={"message": "job-details-88"})).json()["key"]
        [first] = (await http.get("/receive-message?count=5")).json()["messages"]
        assert (first["key"], first["retry_count"]) == (key, 0)
        assert (await http.get("/get-stats")).json()["stats"]["checkouts_count"] == 1

        again: list[dict] = []

        async def came_back() -> bool:
            again.extend((await http.get("/receive-message")).json()["messages"])
            return bool(again)

        await eventually(came_back, "the unacknowledged message to come back")
        [second] = again
        assert second["key"] == key
        assert second["retry_count"] == 1
        assert second["timestamp"] == first["timestamp"]
        assert second["message"] == "job-details-88"
        assert (await http.delete(f"/delete-message/{key}")).json() == {"status": "okay"}
        stats = (await http.get("/get-stats")).json()["stats"]
        assert (stats["queue_length"], stats["checkouts_count"], stats["dead_letter_count"]) == (0, 0, 0)
        assert stats["checkout_lifetime"] == "0.3s"


async def test_a_message_received_max_receive_count_times_moves_to_the_dead_letter_list(
        settings: Settings) -> None:
    s = settings.model_copy(update={"checkout_lifetime_seconds": 0.2, "rescue_interval_seconds": 0.05,
                                    "max_receive_count": 2})
    async with api_server(s) as http:
        await http.post("/send-message", json={"message": "poison"})
        receipts: list[dict] = []

        async def dead_lettered() -> dict | None:
            stats = (await http.get("/get-stats")).json()["stats"]
            if stats["dead_letter_count"]:
                return stats
            receipts.extend((await http.get("/receive-message")).json()["messages"])
            return None

        stats = await eventually(dead_lettered, "the message moved to the dead-letter list")
        assert [m["retry_count"] for m in receipts] == [0, 1]
        assert (stats["queue_length"], stats["checkouts_count"], stats["dead_letter_count"]) == (0, 0, 1)
        assert (await http.get("/receive-message")).json()["messages"] == []


async def test_bearer_token_when_configured(settings: Settings) -> None:
    s = settings.model_copy(update={"api_token": "s3cret"})
    async with api_server(s) as http:
        assert (await http.get("/get-stats")).status_code == 401
        wrong = await http.get("/get-stats", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert (await http.get("/get-stats", headers={"Authorization": "Bearer s3cret"})).status_code == 200
        assert (await http.get("/docs")).status_code == 200
        spec = (await http.get("/openapi.json")).json()
        assert {"/send-message", "/receive-message", "/delete-message/{key}", "/get-stats"} <= set(spec["paths"])


async def test_bad_requests_are_4xx_with_a_message(settings: Settings) -> None:
    async with api_server(settings) as http:
        assert (await http.post("/send-message", content="{not json", headers=JSON)).status_code == 422
        assert (await http.post("/send-message", json={})).text == "Message content required."
        assert (await http.get("/receive-message?count=0")).status_code == 422
        assert (await http.get("/receive-message?count=abc")).status_code == 422
        too_big = await http.post("/send-message", json={"message": "x" * (settings.max_message_bytes + 1)})
        assert too_big.status_code == 413


def test_a_non_loopback_bind_requires_a_token(settings: Settings) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    check_exposure("127.0.0.1", settings)
    with pytest.raises(ConfigError, match="api_token"):
        check_exposure("0.0.0.0", settings)
    check_exposure("0.0.0.0", settings.model_copy(update={"api_token": "t"}))


async def test_schemathesis_finds_no_server_error_in_the_openapi_spec(settings: Settings, tmp_path) -> None:
    s = settings.model_copy(update={"checkout_lifetime_seconds": 0.5})
    async with api_server(s) as http:
        cli = Path(sys.executable).with_name("schemathesis")
        process = await asyncio.create_subprocess_exec(
            str(cli), "run", str(http.base_url).rstrip("/") + "/openapi.json", "--checks", "not_a_server_error",
            "--max-examples", "30", "--phases", "examples,coverage,fuzzing", "--no-color",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path)  # its cache dir
        output, _ = await asyncio.wait_for(process.communicate(), 300)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text
    assert "Tested: 4" in text, text  # all four operations were exercised
