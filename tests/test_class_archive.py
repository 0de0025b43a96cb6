"""The audit JVM's class archive: named for its JVM and jars, and installed only once a JVM ran with it."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from spark_analytics import class_archive
from spark_analytics.session import local_java_options


def _fake_java(root: Path) -> Path:
    java = root / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return root


def test_the_archive_is_named_for_its_jvm_and_used_only_once_built(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    here = class_archive.archive_path(tmp_path)
    assert here is not None and here.parent == tmp_path and here.name.startswith(class_archive.PREFIX)
    assert class_archive.java_options(tmp_path) == ""  # not built: the JVM starts without one
    here.write_bytes(b"built")
    assert class_archive.java_options(tmp_path) == f"-XX:SharedArchiveFile={here} {class_archive.QUIET}"

    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path / "other-jdk")))
    other = class_archive.archive_path(tmp_path)
    assert other is not None and other != here  # another JVM build: another archive
    assert class_archive.java_options(tmp_path) == ""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert class_archive.archive_path(tmp_path) is None and class_archive.java_options(tmp_path) == ""


def test_the_session_takes_the_built_archive_unless_told_otherwise(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(class_archive, "directory", lambda: tmp_path)
    assert local_java_options(None) == "-XX:+UseParallelGC"
    built = class_archive.archive_path()
    assert built is not None
    built.write_bytes(b"built")
    assert local_java_options(None) == f"-XX:+UseParallelGC -XX:SharedArchiveFile={built} {class_archive.QUIET}"
    assert local_java_options(None, classes="") == "-XX:+UseParallelGC"


def _check(archive: Path) -> int:
    return subprocess.run([sys.executable, "-m", "spark_analytics.class_archive", "--check", str(archive)],
                          capture_output=True, timeout=300, check=False).returncode


def test_an_unusable_or_truncated_archive_fails_its_check(tmp_path: Path) -> None:
    """What the check is for: a JVM refuses a file that is not an archive of its own build and runs
    without it, and crashes on a cut one; neither is ever installed."""
    (tmp_path / "zeros.jsa").write_bytes(b"\x00" * 4096)
    assert _check(tmp_path / "zeros.jsa") != 0
    archive = class_archive.archive_path()
    if archive is None or not archive.is_file():
        pytest.skip("no class archive built here to cut (deploy/setup.sh builds it)")
    with open(archive, "rb") as whole, open(tmp_path / "truncated.jsa", "wb") as cut:
        cut.write(whole.read(1 << 20))  # the header of a real archive, the rest missing
    assert _check(tmp_path / "truncated.jsa") != 0
    assert _check(archive) == 0


def test_building_dumps_checks_then_installs_and_drops_older_archives(tmp_path: Path) -> None:
    older = tmp_path / f"{class_archive.PREFIX}0000000000000000.jsa"
    older.write_bytes(b"an archive of a JVM since upgraded")
    built = class_archive.build(tmp_path)
    assert built == class_archive.archive_path(tmp_path)
    assert built.is_file() and built.stat().st_size > 10 << 20
    assert sorted(p.name for p in tmp_path.iterdir()) == [built.name]  # the older one and no partial left
    mtime = built.stat().st_mtime_ns
    assert class_archive.build(tmp_path) == built and built.stat().st_mtime_ns == mtime  # built once
