"""`make demo`'s command, end to end on the test's own vhost: every expected alert, nothing else.

The engine publishes alert batches on `Aldebaran.Alert` (CONTRACT §3); the demo's tap must
read both forms (it once read single alerts only and reported every alert missing).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ALDEBARAN = str(Path(sys.executable).with_name("aldebaran"))


def test_the_demo_finds_every_expected_alert_and_nothing_else(worker_env: dict[str, str]) -> None:
    result = subprocess.run([ALDEBARAN, "demo", "--orders", "150", "--book-ttl", "2", "--rows", "3"],
                            env=dict(worker_env, COLUMNS="200"), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 missing, 0 unexpected (engine mode)" in result.stdout, result.stdout[-3000:]
    assert "over_purchase:1 " in result.stdout  # the design document's order 1 comes first
