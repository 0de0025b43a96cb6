"""Settings: environment, TOML, environment over TOML, unknown keys, bad values, masking."""

from __future__ import annotations

from pathlib import Path

import pytest

from aldebaran.errors import ConfigError
from aldebaran.settings import load_settings, mask_url


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("ALDEBARAN_"):
            monkeypatch.delenv(key)


def test_defaults_follow_the_contract() -> None:
    settings = load_settings()
    assert settings.amqp_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.book_ttl_seconds == 60


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALDEBARAN_BOOK_TTL_SECONDS", "5")
    monkeypatch.setenv("ALDEBARAN_REDIS_URL", "redis://10.0.0.1:6380/2")
    settings = load_settings()
    assert settings.book_ttl_seconds == 5
    assert settings.redis_url == "redis://10.0.0.1:6380/2"


def test_toml_with_channels(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "aldebaran.toml"
    path.write_text(
        'book_ttl_seconds = 30\n'
        '[[channels]]\nname = "ops-webhook"\nkind = "webhook"\nurl = "http://127.0.0.1:9000/alerts"\n'
        '[[channels]]\nname = "pager"\nkind = "log"\n'
    )
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(path))
    settings = load_settings()
    assert settings.book_ttl_seconds == 30
    assert [(c.name, c.kind) for c in settings.channels] == [("ops-webhook", "webhook"), ("pager", "log")]
    assert settings.channel("ops-webhook").url == "http://127.0.0.1:9000/alerts"


def test_environment_wins_over_toml(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "aldebaran.toml"
    path.write_text("book_ttl_seconds = 30\n")
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(path))
    monkeypatch.setenv("ALDEBARAN_BOOK_TTL_SECONDS", "7")
    assert load_settings().book_ttl_seconds == 7


def test_unknown_toml_key_names_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "aldebaran.toml"
    path.write_text("book_tll_seconds = 30\n")
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(path))
    with pytest.raises(ConfigError, match="book_tll_seconds: unknown setting"):
        load_settings()


def test_unknown_channel_key_names_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "aldebaran.toml"
    path.write_text('[[channels]]\nname = "x"\nkind = "log"\ncolour = "red"\n')
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(path))
    with pytest.raises(ConfigError, match=r"channels\.0\.log\.colour: unknown setting"):
        load_settings()


def _two_channels(path: Path, second: str) -> None:
    path.write_text(f'[[channels]]\nname = "ops"\nkind = "log"\n\n[[channels]]\nname = "{second}"\nkind = "log"\n')


def test_a_channel_named_like_anothers_parking_queue_is_refused(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ops.Dead_Letter`'s queue would be `ops`'s parking queue (CONTRACT §2: one queue per channel)."""
    path = tmp_path / "aldebaran.toml"
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(path))
    _two_channels(path, "ops.Dead_Letter")
    with pytest.raises(ConfigError, match=r"channel 'ops.Dead_Letter' would take channel 'ops'.s parking queue "
                                          r"Aldebaran\.Channel\.ops\.Dead_Letter"):
        load_settings()
    _two_channels(path, "ops.Dead_Letters")
    assert [c.name for c in load_settings().channels] == ["ops", "ops.Dead_Letters"]


def test_unknown_environment_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALDEBARAN_BOOK_TLL_SECONDS", "5")
    with pytest.raises(ConfigError, match="ALDEBARAN_BOOK_TLL_SECONDS: unknown setting"):
        load_settings()


@pytest.mark.parametrize("name", ["aldebaran_book_tll_seconds", "Aldebaran_Book_Tll_Seconds", "aldebaran_config"])
def test_an_unknown_variable_in_another_case_is_named_too(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Settings are read in any case, so a misspelt one in lower case must not pass unseen;
    the config file's variable is read only as spelt, so another spelling of it is unknown."""
    monkeypatch.setenv(name, "5")
    with pytest.raises(ConfigError, match=f"{name}: unknown setting"):
        load_settings()


def test_a_setting_in_lower_case_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("aldebaran_book_ttl_seconds", "7")
    assert load_settings().book_ttl_seconds == 7


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("ALDEBARAN_BOOK_TTL_SECONDS", "-1", "book_ttl_seconds: Input should be greater than 0"),
        ("ALDEBARAN_BOOK_TTL_SECONDS", "soon", "book_ttl_seconds: Input should be a valid number"),
        ("ALDEBARAN_AMQP_URL", "http://x", "amqp_url: Value error, must start with one of amqp://"),
        ("ALDEBARAN_MODE", "fast", "mode: Input should be 'engine' or 'per-order'"),
    ],
)
def test_bad_values_name_the_key(monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings()


def test_missing_config_file_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="no such file"):
        load_settings()


def test_passwords_are_masked_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALDEBARAN_AMQP_URL", "http://user:hunter2@host/")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "hunter2" not in str(info.value)
    assert mask_url("amqps://a:b@h:5671/v and redis://:pw@r:6379/0") == "amqps://a:***@h:5671/v and redis://:***@r:6379/0"


def test_memory_bound_has_a_default_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().max_rss_mib == 2048
    monkeypatch.setenv("ALDEBARAN_MAX_RSS_MIB", "512")
    assert load_settings().max_rss_mib == 512
    monkeypatch.setenv("ALDEBARAN_MAX_RSS_MIB", "10")
    with pytest.raises(ConfigError, match="max_rss_mib"):
        load_settings()
