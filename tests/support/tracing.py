"""A barrier through the firehose recorder: everything traced before it is on disk.

The recorder (`workers/tracer.py`) is the one consumer of its queue, writes what it
received in order and acks only after the fsync. So once a trade event published after
everything else is in its part files, every trace queued before it is there too. The
event is a purchase request alone: it fires nothing, so no alert count changes.
"""

from __future__ import annotations

import base64
import gzip
import json
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

from tests.support.waiting import wait_until


def _traced_bodies(root: Path) -> list[bytes]:
    """Bodies of traced publishes; a part file's unfinished tail (being appended) is skipped."""
    bodies = []
    for part in sorted(root.glob("date=*/hour=*/part-*.jsonl.gz")):
        try:
            with gzip.open(part, "rt") as fh:
                for line in fh:
                    record = json.loads(line) if line.strip() else {}
                    if record.get("kind") == "publish" and record.get("body_b64"):
                        bodies.append(base64.b64decode(record["body_b64"]))
        except (EOFError, OSError, zlib.error, ValueError):
            continue
    return bodies


def wait_traced(publish_raw: Callable[[bytes], None], traces: Path, timeout: float = 120) -> None:
    """Publish the barrier with `publish_raw` (onto `Aldebaran.Trade_Data`) and wait until the
    recorder wrote it under `traces`."""
    order = f"trace-barrier-{uuid.uuid4().hex[:12]}"
    publish_raw(json.dumps({"id": order, "#shares": 1, "client": "barrier", "stock": "barrier"}).encode())
    wait_until(lambda: any(order.encode() in body for body in _traced_bodies(traces)),
               f"the recorder to write the barrier {order} (everything traced before it is on disk)",
               timeout, pause=0.2)
