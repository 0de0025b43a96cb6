"""The operator's list of alerts in doubt, as the audit reads it (`--in-doubt FILE`).

The file is what `aldebaran delivery in-doubt --json` prints: one JSON object per line with
at least `vhost`, `channel` and `alert_id` (also `target`, `reason`, `since`). That format
is the interface: the audit never reads Redis or imports the channel code, so a list taken
on another machine, or written by hand, works the same. Entries per recipient (SMS
numbers, push devices) collapse to one per (vhost, channel, alert), which is what the
traces can judge. Unreadable lines are counted, never fatal, like junk in the traces.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Entry = tuple[str, str, str]  # (vhost, channel, alert_id)


@dataclass
class InDoubtList:
    """Every entry read, and what could not be read."""

    files: list[str] = field(default_factory=list)
    entries: set[Entry] = field(default_factory=set)
    unreadable_lines: int = 0

    def listed(self, vhost: str) -> int:
        """How many (channel, alert) pairs the list holds for one deployment."""
        return sum(1 for v, _, _ in self.entries if v == vhost)


def _entry(line: str) -> Entry | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    values = (data.get("vhost"), data.get("channel"), data.get("alert_id"))
    if not all(isinstance(v, str) and v for v in values):
        return None
    vhost, channel, alert_id = values
    return str(vhost), str(channel), str(alert_id)


def parse(lines: Iterable[str], into: InDoubtList) -> None:
    """Add every readable line to `into`; blank lines are skipped, others counted unreadable."""
    for line in lines:
        if not line.strip():
            continue
        entry = _entry(line)
        if entry is None:
            into.unreadable_lines += 1
        else:
            into.entries.add(entry)


def read(paths: Sequence[str]) -> InDoubtList:
    """Read each file (`-` is standard input); a missing file is an OSError, before Spark starts."""
    found = InDoubtList(files=list(paths))
    for path in paths:
        if path == "-":
            parse(sys.stdin, found)
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            parse(fh, found)
    return found
