"""The recorder's files in a fault run: strict reading, a simulated torn write, and the audit.

A recorder (`workers/tracer.py`) appends one gzip member of JSON lines per flushed batch
and acks the batch only after the fsync. SIGKILL in the middle of a large `write` leaves
a torn last member; the harness simulates one at a chosen point (`tear`) because a real
kill lands inside a write only by chance.
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from aldebaran.io.trace_files import complete_length

TRADE_EXCHANGE = "Aldebaran.Trade_Data"
ALERT_EXCHANGE = "Aldebaran.Alert"
CHANNEL_PREFIX = "Aldebaran.Channel."


def part_files(root: Path) -> list[Path]:
    return sorted(root.glob("date=*/hour=*/part-*.jsonl.gz"))


def torn_files(root: Path) -> list[tuple[Path, int, int]]:
    """Part files that do not end on a whole gzip member: (path, whole bytes, size)."""
    out = []
    for path in part_files(root):
        size = path.stat().st_size
        good = complete_length(path)
        if good != size:
            out.append((path, good, size))
    return out


def read_strict(root: Path) -> list[dict[str, Any]]:
    """Every record; raises on a torn member or a line that is not JSON (what any reader,
    zcat or Python's gzip, would trip over)."""
    records = []
    for path in part_files(root):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                if line.strip():
                    records.append(json.loads(line))
    return records


def newest_part(root: Path, recorder: str) -> Path | None:
    parts = [p for p in part_files(root) if p.name.startswith(f"part-{recorder}-")]
    return max(parts, key=lambda p: (p.stat().st_mtime, p.name)) if parts else None


def tear(path: Path, redelivered: bool) -> int:
    """Append the first half of one more gzip member to `path`, as a SIGKILL in the middle of
    the recorder's write leaves it; returns the bytes appended.

    The member holds copies of the file's last records. `redelivered=False` makes them look
    like a first write (what a torn write really holds): a reader that kept them would count
    them twice, so they must be cut by the restarted recorder. `redelivered=True` marks them
    as re-recorded copies, which the audit drops by fingerprint: what matters then is only
    that the torn bytes do not fail the job and the members before them are still read.
    """
    lines = []
    try:
        with gzip.open(path, "rt") as fh:
            for line in fh:
                lines.append(json.loads(line))
    except (EOFError, OSError, ValueError, zlib.error):  # the kill itself tore the last write
        pass
    copies = [dict(r, trace_redelivered=redelivered) for r in lines[-400:]]
    member = gzip.compress(("\n".join(json.dumps(r, separators=(",", ":")) for r in copies) + "\n").encode())
    torn = member[:len(member) // 2]
    with open(path, "ab") as fh:
        fh.write(torn)
    return len(torn)


def _events_of(body: bytes) -> list[dict[str, Any]]:
    try:
        obj = json.loads(body)
    except ValueError:
        return []
    items = obj if isinstance(obj, list) else [obj]
    return [i for i in items if isinstance(i, dict)]


def traced_event_ids(records: Iterable[dict[str, Any]]) -> set[str]:
    """Every trade event id in a traced publish to Aldebaran.Trade_Data (requests and purchases)."""
    ids = set()
    for r in records:
        if r.get("kind") == "publish" and r.get("exchange") == TRADE_EXCHANGE:
            ids |= {str(e.get("id")) for e in _events_of(base64.b64decode(r["body_b64"]))}
    return ids


def _fingerprint(r: dict[str, Any]) -> tuple:
    return (r.get("kind"), r.get("exchange"), r.get("queue"), r.get("message_id"), r.get("redelivered"),
            r.get("body_b64"), json.dumps(r.get("headers"), sort_keys=True))


def traced_alerts(records: Iterable[dict[str, Any]]) -> Counter[str]:
    """Alert publishes by alert id, a re-recorded copy counted once.

    A trace message the recorder received but had not acked when it was killed comes back
    `trace_redelivered` to its successor: the only copy when the first was never written,
    a second one (same broker-side fingerprint) when it was.
    """
    pubs = [r for r in records if r.get("kind") == "publish" and r.get("exchange") == ALERT_EXCHANGE]
    counted = [r for r in pubs if not r.get("trace_redelivered")]
    seen = {_fingerprint(r) for r in counted}
    for r in pubs:
        if r.get("trace_redelivered") and _fingerprint(r) not in seen:
            seen.add(_fingerprint(r))
            counted.append(r)
    return Counter(alert_id for r in counted for alert_id in _alert_ids(r))


def _alert_ids(record: dict[str, Any]) -> list[str]:
    """The alert ids one traced message carried: a single alert (its message_id) or a batch."""
    try:
        value = json.loads(base64.b64decode(record.get("body_b64") or b""))
    except ValueError:
        value = None
    if isinstance(value, list):
        return [str(item.get("alert_id")) for item in value if isinstance(item, dict)]
    return [str(record.get("message_id"))]


def traced_deliveries(records: Iterable[dict[str, Any]], channel: str) -> set[str]:
    """The alert ids delivered from a channel's queue (the lookout hands it batches too)."""
    return {alert_id for r in records if r.get("kind") == "deliver" and r.get("queue") == CHANNEL_PREFIX + channel
            for alert_id in _alert_ids(r)}


def gaps(records: Iterable[dict[str, Any]]) -> list[tuple[int, int, str]]:
    return sorted((r["start"], r["end"], r.get("reason", "")) for r in records if r.get("kind") == "gap")


def covered(instant_ms: int, windows: Iterable[tuple[int, int, Any]]) -> bool:
    return any(start <= instant_ms <= end for start, end, *_ in windows)


def audit_windows(info: dict[str, Any]) -> list[tuple[int, int, str]]:
    """The audit summary's unaudited windows as epoch milliseconds."""
    def ms(text: str) -> int:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    return [(ms(w["start"]), ms(w["end"]), w["reason"]) for w in info["unaudited_windows"]]


def run_audit(spark: Any, traces: Path, out: Path, book_ttl_s: float, channels: list[str]) -> tuple[int, dict]:
    """The nightly audit (`aldebaran audit`) on a run's traces, in this process's Spark session.

    Lateness is a speed judgement, which the fault suite does not make (a restarted worker
    on a loaded 2-core machine delays alerts by seconds): `late_after_s` is set out of reach.
    """
    from spark_analytics.job import run
    from spark_analytics.options import AuditOptions

    opts = AuditOptions(traces_dir=str(traces), book_ttl_s=book_ttl_s, late_after_s=3600, channels=channels)
    return run(opts, None, str(out), allow_gaps=True, spark=spark)
