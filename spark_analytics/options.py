"""The audit's knobs, importable without pyspark (so `aldebaran --help` stays instant)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AuditOptions:
    traces_dir: str
    since_ms: int | None = None
    until_ms: int | None = None
    book_ttl_s: float = 60.0
    grace_s: float = 30.0            # how long an alert may take before it counts as missed
    late_after_s: float = 5.0        # detection latency above this is a `late` finding
    delivery_grace_s: float = 120.0  # how long a channel may take to take its copy
    ttl_tolerance_s: float = 2.0
    channels: list[str] = field(default_factory=list)
    max_message_bytes: int = 1 << 20
    vhosts: list[str] = field(default_factory=list)  # judge only these deployments (default: every one traced)
    in_doubt_files: list[str] = field(default_factory=list)  # `aldebaran delivery in-doubt --json` output(s)
