"""The suite's one switch for heavier runs: `FAULTS_SCALE=full` (docs/reliability.md).

`make test` runs the CI scale, kept under ten minutes of pytest; the full scale runs the
recorded fault matrix and the slower cases and examples the CI scale leaves out."""

from __future__ import annotations

import os

FULL = os.environ.get("FAULTS_SCALE", "ci") == "full"
