"""What the audit reads, measured before Spark starts: the JIT of its local JVM follows it."""

from __future__ import annotations

from pathlib import Path

from aldebaran.io.trace_files import partition_dir
from spark_analytics.audit import input_bytes
from spark_analytics.options import AuditOptions
from spark_analytics.session import SMALL_INPUT_BYTES, local_java_options

HOUR_MS = 3_600_000
T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # an hour's start


def part(root: Path, ts: int, size: int, name: str = "part-test-1.jsonl.gz") -> None:
    directory = partition_dir(root, ts)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "wb") as fh:
        fh.truncate(size)  # sparse: only the size matters here


def test_input_bytes_counts_the_part_files_of_the_window_and_its_margin_only(tmp_path: Path) -> None:
    part(tmp_path, T0, 1000)
    part(tmp_path, T0 + 5 * HOUR_MS, 20)
    part(tmp_path, T0 + 5 * HOUR_MS, 300, "part-test-2.jsonl.gz")
    (partition_dir(tmp_path, T0) / "notes.txt").write_text("not a part file")
    assert input_bytes(AuditOptions(traces_dir=str(tmp_path))) == 1320
    window = AuditOptions(traces_dir=str(tmp_path), since_ms=T0 + 5 * HOUR_MS, until_ms=T0 + 6 * HOUR_MS)
    assert input_bytes(window) == 320
    assert input_bytes(AuditOptions(traces_dir=str(tmp_path / "none"))) == 0


def test_a_small_input_compiles_with_c1_alone_and_a_night_of_traffic_with_c2(tmp_path: Path) -> None:
    part(tmp_path, T0, SMALL_INPUT_BYTES - 1)
    small = local_java_options(input_bytes(AuditOptions(traces_dir=str(tmp_path))), classes="")
    part(tmp_path, T0 + HOUR_MS, 1)
    large = local_java_options(input_bytes(AuditOptions(traces_dir=str(tmp_path))), classes="")
    assert small == "-XX:+UseParallelGC -XX:TieredStopAtLevel=1"
    assert large == local_java_options(None, classes="") == "-XX:+UseParallelGC"
