"""`aldebaran run KIND` refuses a worker of the other mode: beside this mode's consumers it
would take a share of the trade ingress, and every order's events would be split between them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aldebaran.errors import ExitCode


@pytest.mark.parametrize(("kind", "mode", "wanted"), [("aggregator", "engine", "per-order"),
                                                       ("books", "engine", "per-order"),
                                                       ("engine", "per-order", "engine")])
def test_a_worker_of_the_other_mode_is_refused_before_it_connects(kind: str, mode: str, wanted: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ALDEBARAN_")}
    # Nothing answers there: a worker that tried to connect would end with 69, not 78.
    env.update(ALDEBARAN_MODE=mode, ALDEBARAN_AMQP_URL="amqp://guest:guest@127.0.0.1:1/",
               ALDEBARAN_REDIS_URL="redis://127.0.0.1:1/0")
    done = subprocess.run([sys.executable, "-m", "aldebaran.cli", "run", kind], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.CONFIG, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"aldebaran run: run {kind}: a worker of the {wanted} mode, and the settings say mode = {mode!r}; "
        f"set ALDEBARAN_MODE={wanted} where {kind} workers run")
