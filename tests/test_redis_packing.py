"""Every async Redis client packs its commands with hiredis, into the bytes redis-py would send."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from aldebaran.io.redis import LARGE_ARGUMENT, HiredisPacking, Keys, client
from aldebaran.settings import Settings


class _Packing(HiredisPacking, Connection):
    pass


ARGUMENT = st.one_of(st.text(), st.binary(), st.integers(), st.floats(allow_nan=True, allow_infinity=True))
NAME = st.sampled_from(["EVALSHA", "SET", "CONFIG GET", b"SCRIPT LOAD", b"GET", "client  list"])


@given(NAME, st.lists(ARGUMENT, max_size=40))
def test_hiredis_packs_the_bytes_redis_py_packs(name: str | bytes, arguments: list[Any]) -> None:
    try:
        expected = b"".join(Connection().pack_command(name, *arguments))
    except UnicodeEncodeError:  # a lone surrogate: neither packs it
        with pytest.raises(UnicodeEncodeError):
            _Packing().pack_command(name, *arguments)
        return
    assert b"".join(_Packing().pack_command(name, *arguments)) == expected


@given(st.lists(ARGUMENT, max_size=6), st.lists(ARGUMENT, max_size=6), st.integers(0, 2))
def test_a_large_argument_goes_as_a_chunk_of_its_own_uncopied(before: list[Any], after: list[Any], twice: int) -> None:
    large = bytes(range(256)) * (LARGE_ARGUMENT // 256 + 1)
    arguments = [*before, large, *after, *([large] * twice)]
    chunks = _Packing().pack_command("EVALSHA", *arguments)
    assert b"".join(chunks) == b"".join(Connection().pack_command("EVALSHA", *arguments))
    assert sum(chunk is large for chunk in chunks) == 1 + twice


def test_what_hiredis_does_not_pack_goes_the_way_it_went() -> None:
    packed = b"".join(_Packing().pack_command("SET", "k", bytearray(b"v")))
    assert packed == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
    for refused in (True, None):
        with pytest.raises(DataError):
            _Packing().pack_command("SET", "k", refused)


async def test_the_client_sends_packed_commands_and_pipelines(settings: Settings) -> None:
    redis = client(settings)
    keys = Keys(settings.redis_key_prefix)
    try:
        assert issubclass(redis.connection_pool.connection_class, HiredisPacking)
        names = [keys.alert(f"é-{n}") for n in range(300)]
        script = redis.register_script("for i, key in ipairs(KEYS) do redis.call('SET', key, ARGV[i]) end "
                                       "return #KEYS")
        assert await script(keys=names, args=[n * 1.5 for n in range(300)]) == 300
        large = b"\xff" * (LARGE_ARGUMENT * 4)
        assert await redis.set(names[0], large) and await redis.strlen(names[0]) == len(large)
        async with redis.pipeline(transaction=True) as pipe:
            pipe.get(names[3])
            pipe.mget(names[:2])
            pipe.delete(*names)
            assert await pipe.execute() == [b"4.5", [large, b"1.5"], 300]
    finally:
        await redis.aclose()
