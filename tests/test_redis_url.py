"""`ALDEBARAN_REDIS_URL` in its Sentinel form: parsed in one place, validated by the settings,
masked wherever it is printed, and turned into clients that find the master through the
sentinels. No server is needed: nothing here connects."""

from __future__ import annotations

import pytest

from aldebaran.errors import ConfigError
from aldebaran.io.redis import (
    DiscoveringConnection,
    DiscoveringSSLConnection,
    HiredisPacking,
    Replicas,
    client,
    describe,
    sync_client,
)
from aldebaran.redis_url import SentinelTarget, is_sentinel_url, parse_sentinel_url
from aldebaran.settings import load_settings, mask_url

URL = "redis+sentinel://:s3cr%2Ft@h1:26380,h2,[::1]:5000/mymaster/2?sentinel_password=sentpw"


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_credentials() -> None:
    target = parse_sentinel_url(URL)
    assert target == SentinelTarget(sentinels=(("h1", 26380), ("h2", 26379), ("::1", 5000)),
                                    service_name="mymaster", db=2, password="s3cr/t",
                                    sentinel_password="sentpw")
    assert parse_sentinel_url("rediss+sentinel://app:pw@h/svc").tls
    assert parse_sentinel_url("rediss+sentinel://app:pw@h/svc").username == "app"
    assert parse_sentinel_url("redis+sentinel://h/svc/").db == 0
    assert is_sentinel_url(URL) and is_sentinel_url("REDIS+SENTINEL://h/s") and not is_sentinel_url("redis://h/0")


@pytest.mark.parametrize("url, problem", [
    ("redis+sentinel:///svc", "at least one sentinel host"),
    ("redis+sentinel://h1:26379", "names the monitored service"),
    ("redis+sentinel://h1:26379/", "names the monitored service"),
    ("redis+sentinel://h1:99999/svc", "sentinel 1 of the URL: the port"),
    ("redis+sentinel://h1,h2:x/svc", "sentinel 2 of the URL: the port"),
    ("redis+sentinel://h1,,h2/svc", "sentinel 2 of the URL is not host"),
    ("redis+sentinel://h1/svc/zero", "only a database number"),
    ("redis+sentinel://h1/svc/0/extra", "only a database number"),
    ("redis+sentinel://h1/my%20master", "service name may hold"),
    ("redis+sentinel://h1/svc?socket_timeout=1", "unknown Sentinel URL parameter socket_timeout"),
])
def test_a_malformed_sentinel_url_says_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_sentinel_url(url)


@pytest.mark.parametrize("url", [
    "redis+sentinel://:hunter2@h1:26379/svc/notanumber",
    "redis+sentinel://:hunter2@h1:bad/svc",
    "redis+sentinel://:hun/ter2@h1:26379/svc",  # an unencoded `/` defeats any masking: never echoed
    "redis+sentinel://h1/svc?sentinel_password=hunter2&x=1",
    "redis+sentinel://h1/svc?sentinel_password=hunter2&x",
])
def test_settings_reject_a_malformed_sentinel_url_naming_the_key_never_the_password(
        monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", url)
    with pytest.raises(ConfigError, match="redis_url") as error:
        load_settings()
    assert "hunter2" not in str(error.value) and "ter2" not in str(error.value)


def test_settings_take_a_sentinel_url_and_require_one_replica_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", URL)
    settings = load_settings()
    assert settings.redis_url == URL
    assert settings.redis_replicas_required == 1
    assert Replicas.of(settings) == Replicas(1, 2000)
    monkeypatch.setenv("ALDEBARAN_REDIS_MIN_REPLICAS_ACKED", "0")
    monkeypatch.setenv("ALDEBARAN_REDIS_REPLICA_ACK_TIMEOUT_SECONDS", "0.5")
    assert Replicas.of(load_settings()) == Replicas(0, 500)
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.delenv("ALDEBARAN_REDIS_MIN_REPLICAS_ACKED")
    assert load_settings().redis_replicas_required == 0  # a lone Redis has no replica to wait for
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", "http://x")
    with pytest.raises(ConfigError, match="redis_url: Value error, must start with one of redis://"):
        load_settings()


def test_passwords_of_a_sentinel_url_are_masked_wherever_it_is_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    masked = mask_url(f"cannot connect to {URL}")
    assert "s3cr" not in masked and "sentpw" not in masked
    assert masked == ("cannot connect to redis+sentinel://:***@h1:26380,h2,[::1]:5000/mymaster/2"
                      "?sentinel_password=***")
    assert mask_url("rediss+sentinel://app:pw@h/svc") == "rediss+sentinel://app:***@h/svc"
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", URL)
    text = describe(load_settings())
    assert text == "sentinel mymaster via h1:26380,h2:26379,[::1]:5000 db 2" and "s3cr" not in text


async def test_every_client_of_a_sentinel_url_finds_the_master_through_the_sentinels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", URL)
    settings = load_settings()
    async_client = client(settings)
    try:
        pool = async_client.connection_pool
        assert pool.service_name == "mymaster" and pool.is_master
        assert issubclass(pool.connection_class, DiscoveringConnection)
        assert issubclass(pool.connection_class, HiredisPacking)  # and its commands packed by hiredis
        assert pool.connection_kwargs["password"] == "s3cr/t" and pool.connection_kwargs["db"] == 2
        sentinels = [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"],
                      c.connection_pool.connection_kwargs["password"]) for c in async_client.discovery.sentinels]
        assert sentinels == [("h1", 26380, "sentpw"), ("h2", 26379, "sentpw"), ("::1", 5000, "sentpw")]
    finally:
        await async_client.aclose()
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", "rediss+sentinel://:pw@h1/svc")
    tls_client = client(load_settings())
    assert issubclass(tls_client.connection_pool.connection_class, DiscoveringSSLConnection)
    await tls_client.aclose()
    blocking = sync_client(URL, timeout=1)
    try:
        assert blocking.connection_pool.service_name == "mymaster"
        assert ([c.connection_pool.connection_kwargs["port"] for c in blocking.discovery.sentinels]
                == [26380, 26379, 5000])
    finally:
        blocking.close()
