"""The one settings object: environment (`ALDEBARAN_*`) over an optional TOML file.

Every knob Aldebaran has lives here, so a reader finds the whole configuration surface
in one place and a typo stops start-up with the key's name instead of being ignored.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from aldebaran.config_checks import default_key_prefix, describe_errors, http_url, is_link_local, mask_url
from aldebaran.errors import ConfigError
from aldebaran.redis_url import check_redis_url, is_sentinel_url

__all__ = ["Settings", "load_settings", "mask_url"]  # mask_url lives in config_checks; imported from here


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Guarantee = Literal["at-most-once", "at-least-once", "exactly-once"]


class _ChannelBase(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")]
    max_attempts: Annotated[int, Field(ge=1, le=1000)] = 8
    backoff_initial_seconds: Annotated[float, Field(gt=0)] = 0.2
    backoff_max_seconds: Annotated[float, Field(gt=0)] = 30.0
    timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    # Sends in flight at once. For an at-most-once channel it is also the most alerts one
    # crash can leave in doubt, hence 1 by default there (docs/delivery.md).
    max_in_flight: Annotated[int | None, Field(ge=1, le=4096)] = None

    @property
    def guarantee(self) -> Guarantee:
        """What a recipient of this channel gets across crashes (CONTRACT §5)."""
        return "at-least-once"

    @property
    def in_flight(self) -> int:
        return self.max_in_flight or 64


class _OutsideChannel(_ChannelBase):
    """A channel to a recipient outside Aldebaran: its delivery guarantee is chosen (CONTRACT §5)."""

    delivery: Literal["at-most-once", "at-least-once"] = "at-most-once"

    @property
    def guarantee(self) -> Guarantee:
        return self.delivery

    @property
    def in_flight(self) -> int:
        return self.max_in_flight or (1 if self.delivery == "at-most-once" else 64)


class WebhookChannel(_OutsideChannel):
    kind: Literal["webhook"]
    url: str
    headers: dict[str, str] = {}
    allow_link_local: bool = False  # 169.254.0.0/16 and fe80::/10 (cloud metadata) refused unless set

    @field_validator("url")
    @classmethod
    def _http_only(cls, value: str) -> str:
        return http_url(value)

    @model_validator(mode="after")
    def _no_link_local(self) -> WebhookChannel:
        host = (urlsplit(self.url).hostname or "").split("%")[0]
        if not self.allow_link_local and is_link_local(host):
            raise ValueError("url: a link-local address (169.254.0.0/16, fe80::/10) needs allow_link_local = true")
        return self


class AmqpChannel(_OutsideChannel):
    kind: Literal["amqp"]
    url: str | None = None  # None: the pipeline's own broker
    exchange: str = ""
    routing_key: str = ""


class EmailChannel(_OutsideChannel):
    kind: Literal["email"]
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 25
    starttls: bool = False
    use_tls: bool = False
    username: str | None = None
    password: str | None = None
    sender: str = "aldebaran@localhost"
    recipients: Annotated[list[str], Field(min_length=1)]


class SmsChannel(_OutsideChannel):
    kind: Literal["sms"]
    base_url: str = "https://api.twilio.com"

    @field_validator("base_url")
    @classmethod
    def _http_only(cls, value: str) -> str:
        return http_url(value)
    account_sid: str
    auth_token: str
    from_number: str
    to_numbers: Annotated[list[str], Field(min_length=1)]


class PushChannel(_OutsideChannel):
    kind: Literal["push"]
    base_url: str

    @field_validator("base_url")
    @classmethod
    def _http_only(cls, value: str) -> str:
        return http_url(value)
    token: str
    devices: Annotated[list[str], Field(min_length=1)]


class NagiosChannel(_OutsideChannel):
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

    @property
    def guarantee(self) -> Guarantee:
        return "exactly-once"  # the enqueue is keyed by alert_id

    @property
    def in_flight(self) -> int:
        # A round of enqueues is one Redis script call and a repeat enqueues nothing: there is
        # no outside recipient to spare and no doubt to bound, so whole rounds go at once.
        return self.max_in_flight or 1024


ChannelConfig = Annotated[
    WebhookChannel | AmqpChannel | EmailChannel | SmsChannel | PushChannel | NagiosChannel | LogChannel
    | QueueApiChannel,
    Field(discriminator="kind"),
]


class EngineSettings(_Strict):
    """The engine (the default mode): one process consumes the ingress and holds the books."""

    prefetch: Annotated[int, Field(ge=1, le=65535)] = 256  # ingress messages unacked at once
    max_cycle_messages: Annotated[int, Field(ge=1, le=65535)] = 64  # messages one cycle takes at most
    # Full cycles' worth of messages awaiting their confirms and ack (the output path's) before the next waits.
    max_cycles_in_flight: Annotated[int, Field(ge=1, le=64)] = 2
    tick_ms: Annotated[float, Field(gt=0, le=10_000)] = 50.0  # longest idle wait (sooner as books fall due)
    lease_seconds: Annotated[float, Field(gt=0, le=3600)] = 5.0  # a dead owner's books move after this
    compact_seconds: Annotated[float, Field(gt=0, le=3600)] = 1.0  # done markers stored, the log trimmed
    done_retention_seconds: Annotated[float, Field(gt=0)] = 600.0  # closed books remembered (late events)
    done_max_markers: Annotated[int, Field(ge=1)] = 4_000_000  # ... at most this many (oldest forgotten)
    latency_samples_dir: str = ""  # the bench's raw publish->book/alert samples ("" = off)
    # Engine processes sharing the books (each owns one partition of them; docs/engine.md,
    # "Scaling out"), and the partition this process owns.
    partitions: Annotated[int, Field(ge=1, le=64)] = 1
    partition: Annotated[int, Field(ge=0, le=63)] = 0

    @model_validator(mode="after")
    def _partition_in_range(self) -> EngineSettings:
        if self.partition >= self.partitions:
            raise ValueError(f"partition {self.partition} is not one of 0..{self.partitions - 1} "
                             f"(partitions = {self.partitions})")
        return self


class PerOrderSettings(_Strict):
    """The per-order reference mode (iteration 5): aggregators, one queue and book per order."""

    aggregator_prefetch: Annotated[int, Field(ge=1, le=65535)] = 64
    book_prefetch: Annotated[int, Field(ge=1, le=65535)] = 1000
    max_open_books: Annotated[int, Field(ge=1, le=1_000_000)] = 20_000
    declare_cache_size: Annotated[int, Field(ge=1)] = 100_000
    book_close_delay_seconds: Annotated[float, Field(ge=0, le=60)] = 1.0  # of pipeline time past a deadline
    # An aggregator silent this long (dead) no longer holds the watermark back.
    watermark_stale_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0


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
        env_prefix="ALDEBARAN_", extra="forbid", frozen=True, env_nested_delimiter="__", allow_inf_nan=False
    )

    # Where things are
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    amqp_urls: list[str] = []
    redis_url: str = "redis://127.0.0.1:6379/0"  # or redis+sentinel://... (aldebaran/redis_url.py)
    # Replicas that must hold a write before the broker message it stands for is acked
    # (Redis WAIT after the engine's commit, the lookout's fan-out record, a delivery
    # record, a pull-queue enqueue). None: 1 with a Sentinel URL, 0 with a plain one.
    redis_min_replicas_acked: Annotated[int, Field(ge=0, le=16)] | None = None
    redis_replica_ack_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 2.0  # then the step fails, unacked
    redis_key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")] = "aldebaran"  # default: per vhost
    management_url: str = "http://guest:guest@127.0.0.1:15672/"
    tls_ca_file: str | None = None  # PEM CA bundle trusted for amqps:// and rediss:// (None = system CAs)

    # Meaning
    book_ttl_seconds: Annotated[float, Field(gt=0, le=86400 * 7)] = 60.0
    apps: Annotated[list[str], Field(min_length=1)] = ["trade_limits"]
    # Per-application options, `[app_options.<app>]` in TOML; each app's `Options` model
    # validates its own table when the workers load it (aldebaran/apps/__init__.py).
    app_options: dict[str, dict[str, Any]] = {}

    # Pipeline shape: the engine (default) or the per-order reference mode, each with its own keys
    mode: Literal["engine", "per-order"] = "engine"
    engine: EngineSettings = EngineSettings()
    per_order: PerOrderSettings = PerOrderSettings()
    queue_type: Literal["classic", "quorum"] = "classic"
    delivery_limit: Annotated[int, Field(ge=1, le=1000)] = 20
    max_message_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 1024 * 1024
    ingress_max_length: Annotated[int, Field(ge=0)] = 0  # 0 = unbounded
    # Resident memory one Aldebaran process may use, in MiB: the systemd units' MemoryHigh
    # (MemoryMax a quarter above); a worker logs a warning while it is above it. The engine
    # is the one that grows: open books, and a done marker per closed order for
    # engine.done_retention_seconds, capped by engine.done_max_markers (docs/engine.md).
    max_rss_mib: Annotated[int, Field(ge=64, le=1_048_576)] = 2048

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

    @model_validator(mode="before")
    @classmethod
    def _key_prefix_per_deployment(cls, data: Any) -> Any:
        """No prefix given: derive it from the vhost (`default_key_prefix`), not one shared default."""
        if not isinstance(data, dict) or data.get("redis_key_prefix") is not None:
            return data
        urls = data.get("amqp_urls")
        url = urls[0] if isinstance(urls, list) and urls and isinstance(urls[0], str) else data.get("amqp_url")
        url = url if isinstance(url, str) else cls.model_fields["amqp_url"].default
        return {**data, "redis_key_prefix": default_key_prefix(url)}

    @field_validator("amqp_url")
    @classmethod
    def _has_scheme(cls, value: str) -> str:
        if not value.startswith(("amqp://", "amqps://")):
            raise ValueError("must start with one of amqp://, amqps://")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        return check_redis_url(value)

    @field_validator("channels")
    @classmethod
    def _unique_channel_names(cls, value: list[Any]) -> list[Any]:
        names = [c.name for c in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"channel names must be unique, repeated: {', '.join(dupes)}")
        from declare.topology import channel_dead_letter, channel_queue  # (the topology imports the settings)

        owners = {channel_queue(name): name for name in names}
        for name in names:
            if (other := owners.get(channel_dead_letter(name))) is not None:
                raise ValueError(f"channel {other!r} would take channel {name!r}'s parking queue "
                                 f"{channel_dead_letter(name)}: rename one")
        return value

    @model_validator(mode="after")
    def _options_name_configured_apps(self) -> Settings:
        stray = sorted(set(self.app_options) - set(self.apps))
        if stray:
            raise ValueError(f"app_options for applications not in apps: {', '.join(stray)}")
        return self

    @property
    def redis_replicas_required(self) -> int:
        """How many replicas a write must reach (WAIT) before what it stands for is acked."""
        if self.redis_min_replicas_acked is not None:
            return self.redis_min_replicas_acked
        return 1 if is_sentinel_url(self.redis_url) else 0

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


def _unknown_environment() -> list[str]:
    """Our variables that no setting reads: pydantic-settings ignores them silently. It reads
    the others in any case (`aldebaran_book_ttl_seconds` too); `ALDEBARAN_CONFIG` only as spelt."""
    fields = {f"ALDEBARAN_{name.upper()}" for name in Settings.model_fields}
    return sorted(k for k in os.environ
                  if k.upper().startswith("ALDEBARAN_") and k != "ALDEBARAN_CONFIG"
                  and k.upper().split("__")[0] not in fields)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning every validation problem into one `ConfigError`."""
    unknown = _unknown_environment()
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: unknown setting")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None
