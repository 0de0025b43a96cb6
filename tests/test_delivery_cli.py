"""The shipped commands: `aldebaran run lookout`, `run channel NAME`, `api` and `delivery in-doubt` as processes."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from aldebaran.channels.ledger import DeliveryLedger
from aldebaran.errors import ExitCode
from aldebaran.io.redis import Keys
from aldebaran.settings import Settings
from declare.declarer import declare
from spark_analytics.in_doubt import InDoubtList, parse
from tests.support import services
from tests.support.waiting import eventually
from tests.test_channels import http_peer, make_alert, publish, with_channels

ALDEBARAN = str(Path(sys.executable).with_name("aldebaran"))


async def start(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(ALDEBARAN, *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)


async def stop(process: asyncio.subprocess.Process) -> tuple[int, str]:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, output.decode(errors="replace")


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str]:
    """A command that ends on its own: its exit status and output."""
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def test_lookout_and_channel_processes_deliver_once_and_stop_cleanly(
        settings: Settings, worker_env: dict[str, str], tmp_path) -> None:
    async with http_peer() as peer:
        config = tmp_path / "aldebaran.toml"
        config.write_text(f'[[channels]]\nname = "ops-webhook"\nkind = "webhook"\nurl = "{peer.url}/alerts"\n')
        env = {**worker_env, "ALDEBARAN_CONFIG": str(config)}
        declare(with_channels(settings, {"name": "ops-webhook", "kind": "webhook", "url": peer.url}),
                echo=lambda _: None)
        publish(settings, make_alert("cli"), times=3)
        processes = [await start(env, "run", "lookout"), await start(env, "run", "channel", "ops-webhook")]
        try:
            await eventually(lambda: peer.accepted() or any(p.returncode is not None for p in processes),
                             "the webhook delivery", timeout=60)
        finally:
            results = [await stop(p) for p in processes]
    for code, output in results:
        assert code == ExitCode.OK, output
    assert len(peer.requests) == 1
    assert peer.requests[0]["headers"]["idempotency-key"] == "over_purchase:cli"


async def test_api_command_serves_and_refuses_an_open_bind_without_token(worker_env: dict[str, str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = await start(worker_env, "api", "--port", str(port))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            replies: list[httpx.Response] = []

            async def answered() -> bool:
                if process.returncode is not None:
                    return True  # it exited: the assertion below shows its output
                try:
                    replies.append(await http.get("/get-stats"))
                except httpx.TransportError:
                    return False
                return True

            await eventually(answered, "the API to answer", timeout=60, pause=0.1, required=False)
    finally:
        code, output = await stop(process)
    assert replies and replies[0].json()["stats"]["checkout_lifetime"] == "120s", output
    assert code == 0, output

    refused = await start(worker_env, "api", "--host", "0.0.0.0", "--port", str(port))
    raw, _ = await asyncio.wait_for(refused.communicate(), 60)
    output = raw.decode(errors="replace")
    assert refused.returncode == ExitCode.CONFIG, output
    assert "requires api_token" in output


async def test_in_doubt_json_lines_carry_their_deployment_and_are_what_the_audit_reads(
        settings: Settings, vhost: services.Vhost, worker_env: dict[str, str], tmp_path) -> None:
    """`delivery in-doubt --json`: one object per entry with its vhost (the audit's `--in-doubt`
    input); the table stays the default."""
    config = tmp_path / "aldebaran.toml"
    config.write_text('[[channels]]\nname = "hook"\nkind = "webhook"\nurl = "http://127.0.0.1:9/alerts"\n')
    env = {**worker_env, "ALDEBARAN_CONFIG": str(config)}
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        ledger = DeliveryLedger(client, Keys(settings.redis_key_prefix), "hook", ttl_seconds=600)
        await ledger.settle(in_doubt=[("over_purchase:1", "", "timeout after the request left", b"{}"),
                                      ("over_purchase:2", "+15550100", "worker crashed mid-send", b"{}")])
    finally:
        await client.aclose()

    code, output = await finish(await start(env, "delivery", "in-doubt", "--json"))
    assert code == ExitCode.OK, output
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert sorted((d["vhost"], d["channel"], d["alert_id"], d["target"], d["reason"]) for d in lines) == [
        (vhost.name, "hook", "over_purchase:1", None, "timeout after the request left"),
        (vhost.name, "hook", "over_purchase:2", "+15550100", "worker crashed mid-send")]
    for d in lines:
        assert datetime.fromisoformat(d["since"]) == datetime.fromtimestamp(d["since_ms"] / 1000, UTC)
    read = InDoubtList()
    parse(output.splitlines(), read)  # the audit's reader, on exactly what the command printed
    assert read.entries == {(vhost.name, "hook", "over_purchase:1"), (vhost.name, "hook", "over_purchase:2")}

    code, output = await finish(await start(env, "delivery", "in-doubt"))
    assert code == ExitCode.OK and "Alerts in doubt" in output and "over_purchase:2" in output, output
    assert not any(line.startswith("{") for line in output.splitlines()), output
