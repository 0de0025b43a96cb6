"""The firehose recorder's files: the record format the audit reads, hourly gzip part files,
and the repair of a torn last member a killed recorder leaves behind.

Records are JSON lines in gzip members (one member per flushed batch), partitioned by UTC
date and hour (`date=YYYY-MM-DD/hour=HH`), so the audit prunes whole hours by path.
`workers/tracer.py` decides when to write; this module only knows how.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STATE_DIR = "_state"


def now_ms() -> int:
    return int(time.time() * 1000)


def partition_dir(root: Path, ts_ms: int) -> Path:
    """`root/date=YYYY-MM-DD/hour=HH`: the audit prunes whole hours by path."""
    moment = datetime.fromtimestamp(ts_ms / 1000, tz=UTC)
    return root / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"


def _plain(value: Any) -> Any:
    """Firehose headers hold bytes, datetimes and nested tables; make them JSON."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def trace_record(routing_key: str, headers: dict[str, Any], body: bytes, ts_ms: int,
                 recorder: str, trace_redelivered: bool = False) -> dict[str, Any]:
    """One firehose message as one JSON-able record (the wire format the audit reads)."""
    plain = _plain(headers or {})
    kind, _, name = routing_key.partition(".")
    props = plain.get("properties") or {}
    return {
        "kind": kind,  # publish | deliver
        "ts": ts_ms,
        "exchange": plain.get("exchange_name", name if kind == "publish" else None),
        "queue": name if kind == "deliver" else None,
        "routing_keys": plain.get("routing_keys") or [],
        "redelivered": bool(plain.get("redelivered", 0)),
        "content_type": props.get("content_type"),
        "message_id": props.get("message_id"),
        "node": plain.get("node"), "vhost": plain.get("vhost"),  # the deployment: audited on its own
        "headers": plain,
        "body_b64": base64.b64encode(body).decode("ascii"),
        "recorder": recorder,
        "trace_redelivered": trace_redelivered,  # written before, not acked before a crash
    }


@dataclass
class PartWriter:
    """Appends gzip members to hourly part files; one member per flushed batch."""

    root: Path
    recorder: str
    max_part_bytes: int = 256 * 1024 * 1024
    _counter: int = 0
    _current: dict[Path, Path] = field(default_factory=dict)

    def write(self, records: list[dict[str, Any]]) -> None:
        groups: dict[Path, list[str]] = {}
        for record in records:
            ts = record.get("ts") or record.get("end") or now_ms()
            groups.setdefault(partition_dir(self.root, ts), []).append(
                json.dumps(record, separators=(",", ":"), default=str))
        for directory, lines in groups.items():
            path = self._part(directory)
            member = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=5)
            with open(path, "ab") as fh:
                fh.write(member)
                fh.flush()
                os.fsync(fh.fileno())

    def _part(self, directory: Path) -> Path:
        path = self._current.get(directory)
        if path is None or (path.exists() and path.stat().st_size >= self.max_part_bytes):
            directory.mkdir(parents=True, exist_ok=True)
            self._counter += 1
            path = directory / f"part-{self.recorder}-{self._counter:05d}.jsonl.gz"
            self._current[directory] = path
        return path


def complete_length(path: Path, chunk: int = 1 << 20) -> int:
    """How many leading bytes of a part file are whole gzip members.

    A recorder killed in the middle of `write` leaves a torn last member (the kernel
    stops a large write at a page boundary on SIGKILL); everything after the last whole
    member is that tail. Streams the file one chunk at a time (nothing inflated is kept).
    """
    good = 0      # end offset of the last whole member
    offset = 0    # offset of the first byte of `pending`
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    with open(path, "rb") as fh:
        while True:
            if not pending:
                pending = fh.read(chunk)
                if not pending:
                    return good
            try:
                inflater.decompress(pending)
            except zlib.error:
                return good
            if inflater.eof:
                offset += len(pending) - len(inflater.unused_data)
                good = offset
                pending = inflater.unused_data
                inflater = zlib.decompressobj(wbits=31)
            else:
                offset += len(pending)
                pending = b""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def repair_torn_parts(root: Path, hostname: str, own_pid: int, since_s: float) -> list[tuple[Path, int, int]]:
    """Truncate the torn tail of part files left by dead recorders of this host.

    Only files named for a recorder of `hostname` whose process is gone (or is this very
    pid, reused: a container's PID 1) and modified since `since_s` are touched: a live
    recorder, here or on another host, may be in the middle of a write. The torn records
    were never acked (acks follow the fsync), so the broker delivers them again and this
    recorder writes them anew; the torn bytes are kept under `_state/torn/` for forensics.
    Without this, the next gzip member appended to such a file (the same recorder name
    after a PID reuse) would be unreadable, and so would every reader's view of the file.
    Returns (path, bytes kept, bytes cut) per repaired file.
    """
    repaired = []
    for path in sorted(root.glob("date=*/hour=*/part-*.jsonl.gz")):
        stem = path.name[len("part-"):-len(".jsonl.gz")]
        recorder, _, _counter = stem.rpartition("-")
        host, _, pid_text = recorder.rpartition("-")
        if host != hostname or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        try:
            stat = path.stat()
        except OSError:
            continue
        if stat.st_mtime < since_s or (pid != own_pid and _pid_alive(pid)):
            continue
        good = complete_length(path)
        if good >= stat.st_size:
            continue
        torn_dir = root / STATE_DIR / "torn"
        torn_dir.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b") as fh:
            fh.seek(good)
            (torn_dir / f"{path.parent.parent.name}-{path.parent.name}-{path.name}.{good}").write_bytes(fh.read())
            fh.truncate(good)
            fh.flush()
            os.fsync(fh.fileno())
        repaired.append((path, good, stat.st_size - good))
    return repaired
