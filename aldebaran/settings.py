"""The one settings object: environment (`ALDEBARAN_*`) over an optional TOML file.

Every knob Aldebaran has lives here, so a reader finds the whole configuration surface
in one place and a typo stops start-up with the key's name instead of being ignored.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from aldebaran.errors import ConfigError

_PASSWORD_IN_URL = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>[^@/\s]+)@")


def mask_url(text: str) -> str:
    """Replace the password of every URL in `text` with `***` (logs and errors only)."""
    return _PASSWORD_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ChannelBase(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")]
    max_attempts: Annotated[int, Field(ge=1, le=1000)] = 8
    backoff_initial_seconds: Annotated[float, Field(gt=0)] = 0.2
    backoff_max_seconds: Annotated[float, Field(gt=0)] = 30.0
    timeout_seconds: Annotated[float, Field(gt=0)] = 10.0


class WebhookChannel(_ChannelBase):
    kind: Literal["webhook"]
    url: str
    headers: dict[str, str] = {}


class AmqpChannel(_ChannelBase):
    kind: Literal["amqp"]
    url: str | None = None  # None: the pipeline's own broker
    exchange: str = ""
    routing_key: str = ""


class EmailChannel(_ChannelBase):
    kind: Literal["email"]
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 25
    starttls: bool = False
    use_tls: bool = False
    username: str | None = None
    password: str | None = None
    sender: str = "aldebaran@localhost"
    recipients: Annotated[list[str], Field(min_length=1)]


class SmsChannel(_ChannelBase):
    kind: Literal["sms"]
    base_url: str = "https://api.twilio.com"
    account_sid: str
    auth_token: str
    from_number: str
    to_numbers: Annotated[list[str], Field(min_length=1)]


class PushChannel(_ChannelBase):
    kind: Literal["push"]
    base_url: str
    token: str
    devices: Annotated[list[str], Field(min_length=1)]


class NagiosChannel(_ChannelBase):
    kind: Literal["nagios"]
    command_file: str = "/var/lib/nagios4/rw/nagios.cmd"
    host_name: str = "aldebaran"
    service_description: str = "Aldebaran alerts"
    return_code: Annotated[int, Field(ge=0, le=3)] = 2


class LogChannel(_ChannelBase):
    kind: Literal["log"]


class QueueApiChannel(_ChannelBase):
    kind: Literal["queue-api"]
    queue: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")] = "alerts"


ChannelConfig = Annotated[
    Union[
        WebhookChannel,
        AmqpChannel,
        EmailChannel,
        SmsChannel,
        PushChannel,
        NagiosChannel,
        LogChannel,
        QueueApiChannel,
    ],
    Field(discriminator="kind"),
]


class _TomlSource(PydanticBaseSettingsSource):
    """Reads the TOML file named by ALDEBARAN_CONFIG (or an explicit path)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        if path is not None:
            try:
                with path.open("rb") as fh:
                    self._data = tomllib.load(fh)
            except FileNotFoundError as exc:
                raise ConfigError(f"ALDEBARAN_CONFIG: no such file {path}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path}: not valid TOML: {exc}") from exc

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class Settings(BaseSettings):
    """All configuration of one Aldebaran process.

    Environment variables are the field names upper-cased with the `ALDEBARAN_` prefix;
    the TOML file uses the field names as keys. The environment wins.
    """

    model_config = SettingsConfigDict(
        env_prefix="ALDEBARAN_", extra="forbid", frozen=True, env_nested_delimiter="__"
    )

    # Where things are
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    amqp_urls: list[str] = []
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")] = "aldebaran"
    management_url: str = "http://guest:guest@127.0.0.1:15672/"
    tls_ca_file: str | None = None  # PEM CA bundle trusted for amqps:// and rediss:// (None = system CAs)

    # Meaning
    book_ttl_seconds: Annotated[float, Field(gt=0, le=86400 * 7)] = 60.0
    book_close_delay_seconds: Annotated[float, Field(ge=0, le=60)] = 1.0
    apps: Annotated[list[str], Field(min_length=1)] = ["trade_limits"]
    # Per-application options, `[app_options.<app>]` in TOML; each app's `Options` model
    # validates its own table when the workers load it (aldebaran/apps/__init__.py).
    app_options: dict[str, dict[str, Any]] = {}

    # Pipeline shape
    mode: Literal["per-order", "sharded"] = "per-order"
    shards: Annotated[int, Field(ge=1, le=4096)] = 16
    queue_type: Literal["classic", "quorum"] = "classic"
    delivery_limit: Annotated[int, Field(ge=1, le=1000)] = 20
    max_message_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 1024 * 1024
    ingress_max_length: Annotated[int, Field(ge=0)] = 0  # 0 = unbounded

    # Bounds
    aggregator_prefetch: Annotated[int, Field(ge=1, le=65535)] = 64
    book_prefetch: Annotated[int, Field(ge=1, le=65535)] = 1000
    max_open_books: Annotated[int, Field(ge=1, le=1_000_000)] = 20_000
    declare_cache_size: Annotated[int, Field(ge=1)] = 100_000
    batch_max_events: Annotated[int, Field(ge=1, le=100_000)] = 1000
    batch_linger_ms: Annotated[float, Field(ge=0, le=1000)] = 1.0
    # Resident memory one Aldebaran process may use, in MiB: the figure the overload bench
    # checks every worker against, the systemd units' MemoryHigh (MemoryMax a quarter above),
    # and a worker logs a warning while it is above it. The shard book worker is the one
    # that grows: open books plus a done marker per order for shard_done_retention_seconds
    # (0.85 GiB after 2.7M orders in 20 min in the overload bench; docs/backpressure.md).
    max_rss_mib: Annotated[int, Field(ge=64, le=1_048_576)] = 2048

    # Sharded mode (docs/sharding.md)
    router_prefetch: Annotated[int, Field(ge=1, le=65535)] = 32  # trade messages in flight per router
    # A shard queue holding more messages than this pauses the routers (0 = never): a surge
    # then waits in the ingress, unstamped, not in the shard queues (docs/backpressure.md).
    router_max_shard_backlog: Annotated[int, Field(ge=0)] = 200
    shard_checkpoint_ms: Annotated[float, Field(gt=0, le=60_000)] = 200.0  # delta + multiple-ack period
    shard_checkpoint_messages: Annotated[int, Field(ge=1, le=65535)] = 200  # ... or after this many messages
    # Shard messages a worker holds unacked per shard: more than a checkpoint's worth, and no
    # more, because a router sees only what is ready, not what a worker prefetched.
    shard_prefetch: Annotated[int, Field(ge=2, le=65535)] = 300
    shard_compact_seconds: Annotated[float, Field(gt=0)] = 30.0  # full snapshot, deltas trimmed
    shard_done_retention_seconds: Annotated[float, Field(gt=0)] = 600.0  # closed books remembered (late events)
    # ... but at most this many per shard book worker (170-210 bytes each): past it the oldest
    # are forgotten early, counted and logged, so memory stays bounded at any order rate.
    shard_done_max_markers: Annotated[int, Field(ge=1)] = 4_000_000
    shard_workers: Annotated[int, Field(ge=1, le=4096)] = 1  # book worker processes sharing the shards
    shard_worker_index: Annotated[int, Field(ge=0, le=4095)] = 0  # this process's preferred shards: n % workers
    shard_standby_seconds: Annotated[float, Field(ge=0)] = 2.0  # before subscribing to others' shards as standby
    shard_heartbeat_ms: Annotated[float, Field(ge=10, le=10_000)] = 250.0  # router -> every shard: its ingest clock
    shard_clock_margin_seconds: Annotated[float, Field(ge=0, le=3600)] = 30.0  # no router heard: close on clock minus this
    latency_samples_dir: str = ""  # bench only: workers append raw latency samples here ("" = off)

    # Alerts
    alert_dedup_ttl_seconds: Annotated[int, Field(ge=60)] = 7 * 86400
    channels: list[ChannelConfig] = []

    # Pull API
    api_host: str = "127.0.0.1"
    api_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    api_token: str | None = None
    api_queue: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")] = "alerts"  # the queue-api queue served
    checkout_lifetime_seconds: Annotated[float, Field(gt=0)] = 120.0
    rescue_interval_seconds: Annotated[float, Field(gt=0)] = 2.0
    max_receive_count: Annotated[int, Field(ge=1)] = 10

    # Traces and audit
    traces_dir: str = "traces"

    # Operations
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0  # 0 = no metrics server
    shutdown_grace_seconds: Annotated[float, Field(gt=0)] = 10.0

    @field_validator("amqp_url", "redis_url")
    @classmethod
    def _has_scheme(cls, value: str, info: Any) -> str:
        schemes = {"amqp_url": ("amqp://", "amqps://"), "redis_url": ("redis://", "rediss://", "unix://")}
        if not value.startswith(schemes[info.field_name]):
            raise ValueError(f"must start with one of {', '.join(schemes[info.field_name])}")
        return value

    @field_validator("channels")
    @classmethod
    def _unique_channel_names(cls, value: list[Any]) -> list[Any]:
        names = [c.name for c in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"channel names must be unique, repeated: {', '.join(dupes)}")
        return value

    @model_validator(mode="after")
    def _prefetch_covers_a_checkpoint(self) -> "Settings":
        if self.shard_prefetch <= self.shard_checkpoint_messages:
            raise ValueError(f"shard_prefetch ({self.shard_prefetch}) must exceed shard_checkpoint_messages "
                             f"({self.shard_checkpoint_messages}): a shard worker would wait for the "
                             f"checkpoint timer with its prefetch full")
        return self

    @model_validator(mode="after")
    def _options_name_configured_apps(self) -> "Settings":
        stray = sorted(set(self.app_options) - set(self.apps))
        if stray:
            raise ValueError(f"app_options for applications not in apps: {', '.join(stray)}")
        return self

    @property
    def broker_urls(self) -> list[str]:
        """The AMQP URLs to try in order: a cluster's nodes, or the single URL."""
        return list(self.amqp_urls) or [self.amqp_url]

    def channel(self, name: str) -> Any:
        for channel in self.channels:
            if channel.name == name:
                return channel
        known = ", ".join(c.name for c in self.channels) or "none configured"
        raise ConfigError(f"channels: no channel named {name!r} ({known})")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = os.environ.get("ALDEBARAN_CONFIG")
        toml = _TomlSource(settings_cls, Path(path) if path else None)
        return (init_settings, env_settings, toml)


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "settings"
        if item["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown setting")
        else:
            lines.append(f"{key}: {item['msg']} (got {mask_url(repr(item.get('input')))})")
    return "; ".join(lines)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning every validation problem into one `ConfigError`."""
    # pydantic-settings ignores env vars that match no field; we want them reported.
    known = {f"ALDEBARAN_{name.upper()}" for name in Settings.model_fields} | {"ALDEBARAN_CONFIG"}
    unknown = sorted(
        k for k in os.environ if k.startswith("ALDEBARAN_") and k.split("__")[0] not in known
    )
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: unknown setting")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
