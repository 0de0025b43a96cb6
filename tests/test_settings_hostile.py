"""Settings facing hostile values: non-finite numbers refused, secrets never echoed, URLs masked."""

from __future__ import annotations

import json

import pytest

from aldebaran.errors import ConfigError
from aldebaran.ops.health import check_redis
from aldebaran.settings import Settings, load_settings, mask_url


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_non_finite_numbers_are_refused_with_the_key(monkeypatch, value: str) -> None:
    monkeypatch.setenv("ALDEBARAN_CHECKOUT_LIFETIME_SECONDS", value)
    with pytest.raises(ConfigError, match="checkout_lifetime_seconds"):
        load_settings()


def test_non_finite_numbers_in_a_channel_table_are_refused(monkeypatch) -> None:
    channel = {"name": "h", "kind": "webhook", "url": "http://127.0.0.1:9/", "timeout_seconds": float("inf")}
    with pytest.raises(ConfigError, match=r"channels\.0\.webhook\.timeout_seconds"):
        load_settings(channels=[channel])


def test_a_bad_channel_table_names_the_key_never_the_secrets(monkeypatch) -> None:
    channels = [{"name": "h", "kind": "webhook", "url": "file:///x", "headers": {"Authorization": "Bearer TOPSECRET"}},
                {"name": "s", "kind": "sms", "account_sid": "AC1", "auth_token": "TWILIOSECRET", "from_number": 5,
                 "to_numbers": ["+1"]}]
    monkeypatch.setenv("ALDEBARAN_CHANNELS", json.dumps(channels))
    with pytest.raises(ConfigError) as error:
        load_settings()
    text = str(error.value)
    assert "channels.0.webhook.url" in text and "channels.1.sms.from_number" in text
    assert "TOPSECRET" not in text and "TWILIOSECRET" not in text


def test_a_bad_token_names_the_key_never_the_value() -> None:
    with pytest.raises(ConfigError, match="api_token") as error:
        load_settings(api_token=["hunter2-token"])
    assert "hunter2" not in str(error.value)


@pytest.mark.parametrize("url, secret", [
    ("redis://127.0.0.1:6379/0?password=hunter2", "hunter2"),
    ("https://hooks.example/x?a=1&token=t0k3n#frag", "t0k3n"),
    ("https://hooks.example/x?API_KEY=k3y", "k3y"),
    ("amqp://user:pa55@host/vh", "pa55"),
])
def test_mask_url_masks_passwords_and_secret_query_values(url: str, secret: str) -> None:
    masked = mask_url(f"connecting to {url} failed")
    assert secret not in masked and "***" in masked


def test_health_never_prints_a_password_from_the_redis_url(settings: Settings) -> None:
    # Real Redis, wrong database index form: the check fails or passes, the password never shows.
    check = check_redis(settings.model_copy(update={"redis_url": "redis://127.0.0.1:6379/0?password=hunter2"}), 5)
    assert "hunter2" not in check.target + check.detail and "password=***" in check.target
