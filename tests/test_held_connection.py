"""The engine's held Redis connection (real Redis): a script's request leaves in the caller's
own turn of the loop, and whatever the connection cannot handle goes back to the client."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from aldebaran.io.held_connection import HeldConnection
from aldebaran.io.redis import connect, sync_client
from aldebaran.settings import Settings
from tests.support.waiting import wait_until

# A fresh script text per test: its sha is in no script cache yet, whatever ran before.
_COUNT = "-- {tag}\nreturn redis.call('INCR', KEYS[1])"
_FENCE = "-- {tag}\nreturn redis.error_reply('FENCED: not the engine owner')"


@pytest.fixture
async def redis(settings: Settings) -> aioredis.Redis:
    client = await connect(settings)
    yield client
    await client.aclose()


def _script(redis: aioredis.Redis, text: str):
    return redis.register_script(text.format(tag=uuid.uuid4().hex))


async def test_the_request_is_written_before_the_caller_awaits_anything_but_the_reply(
        redis: aioredis.Redis, settings: Settings) -> None:
    key = f"{settings.redis_key_prefix}held:count"
    count, held = _script(redis, _COUNT), HeldConnection(redis)
    assert await held.run_script(count, [key], []) == 1  # NOSCRIPT: the client loads it
    assert held.handed_back == 1
    task = asyncio.ensure_future(held.run_script(count, [key], []))
    await asyncio.sleep(0)  # one turn: the task runs until it waits for the reply
    watcher = sync_client(settings.redis_url, timeout=5)
    try:
        # A blocking wait: the loop does not turn again until Redis has run the request.
        wait_until(lambda: watcher.get(key) == b"2", "the request to reach Redis within one turn", timeout=5)
    finally:
        watcher.close()
    assert await task == 2
    assert held.handed_back == 1  # the held connection answered


async def test_a_dropped_connection_hands_the_request_back_and_the_next_takes_a_fresh_one(
        redis: aioredis.Redis, settings: Settings) -> None:
    key = f"{settings.redis_key_prefix}held:dropped"
    count, held = _script(redis, _COUNT), HeldConnection(redis)
    await held.run_script(count, [key], [])
    assert await held.run_script(count, [key], []) == 2 and held.handed_back == 1
    killed = await _client_id(held)
    await redis.client_kill_filter(_id=killed)
    assert await held.run_script(count, [key], []) == 3  # run once, by the client
    assert held.handed_back == 2
    assert await held.run_script(count, [key], []) == 4
    assert held.handed_back == 2 and await _client_id(held) != killed  # held again, on a new socket


async def _client_id(held: HeldConnection) -> int:
    """The Redis client id of the connection held now (reaching into it: the test kills it from outside)."""
    connection = held._connection
    assert connection is not None
    await connection.send_command("CLIENT", "ID")
    return int(await connection.read_response())


async def test_a_scripts_own_error_is_raised_and_the_connection_kept(
        redis: aioredis.Redis, settings: Settings) -> None:
    key = f"{settings.redis_key_prefix}held:fenced"
    count, fence, held = _script(redis, _COUNT), _script(redis, _FENCE), HeldConnection(redis)
    await redis.script_load(fence.script)
    await held.run_script(count, [key], [])  # NOSCRIPT: handed back once
    assert await held.run_script(count, [key], []) == 2
    kept = held._connection
    with pytest.raises(ResponseError, match="FENCED"):
        await held.run_script(fence, [key], [])
    assert held._connection is kept and held.handed_back == 1
    assert await held.run_script(count, [key], []) == 3


async def test_a_request_larger_than_the_socket_takes_at_once_arrives_whole(
        redis: aioredis.Redis, settings: Settings) -> None:
    """A drain's cycle record runs to megabytes: the transport keeps what the socket did not take."""
    length, held = _script(redis, "-- {tag}\nreturn string.len(ARGV[1])"), HeldConnection(redis)
    await held.run_script(length, [], [b"x"])  # NOSCRIPT: the client loads it
    record = bytes(range(256)) * (64 * 1024)  # 16 MB
    assert await held.run_script(length, [], [record]) == len(record)
    assert held.handed_back == 1  # answered on the held connection
