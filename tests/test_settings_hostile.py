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


def test_up_never_prints_a_password_from_the_redis_url(worker_env) -> None:
    """Issue 19, row 11: `up` once logged `redis://…?password=…` in full when Redis was away."""
    import subprocess
    import sys

    from tests.support.processes import free_port

    env = dict(worker_env, ALDEBARAN_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0?password=hunter2&db=0",
               ALDEBARAN_LOG_LEVEL="debug")
    result = subprocess.run([sys.executable, "-m", "aldebaran.cli", "up", "--no-tracer"], env=env,
                            capture_output=True, text=True, timeout=120)
    text = result.stdout + result.stderr
    assert result.returncode == 69, text[-2000:]
    assert "hunter2" not in text and "password=***" in text


def test_the_api_refuses_an_infinite_lifetime_at_start_with_the_key(worker_env) -> None:
    """Issue 19, row 12: `inf` passed validation, then an OverflowError traceback, exit 3."""
    import subprocess
    import sys

    env = dict(worker_env, ALDEBARAN_CHECKOUT_LIFETIME_SECONDS="inf")
    result = subprocess.run([sys.executable, "-m", "aldebaran.cli", "api"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 78 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "aldebaran api: checkout_lifetime_seconds: Input should be a finite number (got 'inf')"]
