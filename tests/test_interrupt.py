"""Ctrl-C stops `aldebaran up` as SIGTERM does (CONTRACT §4: "until SIGTERM or Ctrl-C"):
the same drain and exit status, not a KeyboardInterrupt through the workers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.pipeline import Broker, alerts_before_barrier

ALDEBARAN = str(Path(sys.executable).with_name("aldebaran"))


def test_ctrl_c_stops_up_gracefully_with_exit_0(broker: Broker, worker_env: dict[str, str], tmp_path: Path) -> None:
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        up = subprocess.Popen([ALDEBARAN, "up", "--no-tracer"], env=worker_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert alerts_before_barrier(broker) == []  # working: an order in, its alert out
            up.send_signal(signal.SIGINT)
            code = up.wait(timeout=60)
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert code == 0, log_path.read_text()[-3000:]
    assert any(line.get("event") == "stopping" and line.get("signal") == "SIGINT" for line in lines)
    # The workers' own end, which a KeyboardInterrupt through the event loop would skip.
    assert [line.get("exit_code") for line in lines if line.get("event") == "stopped"] == [0]
