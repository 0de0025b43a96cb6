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


def test_the_built_archive_maps_and_an_unusable_or_truncated_one_fails_the_check(tmp_path: Path) -> None:
    """What the check is for: a JVM refuses a file that is not an archive of its own build and runs
    without it, and crashes on a cut one; neither is ever installed. The archive itself is built
    by `deploy/setup.sh` (`make test`), with the real dump this checks."""
    archive = class_archive.archive_path()
    assert archive is not None and archive.is_file(), "no class archive: run deploy/setup.sh"
    assert _check(archive) == 0
    (tmp_path / "zeros.jsa").write_bytes(b"\x00" * 4096)
    assert _check(tmp_path / "zeros.jsa") != 0
    with open(archive, "rb") as whole, open(tmp_path / "truncated.jsa", "wb") as cut:
        cut.write(whole.read(1 << 20))  # the header of a real archive, the rest missing
    assert _check(tmp_path / "truncated.jsa") != 0


class _Children:
    """The dump and the check, as `build` runs them, played without a JVM."""

    def __init__(self, check_passes: bool = True) -> None:
        self.check_passes = check_passes
        self.modes: list[str] = []

    def __call__(self, mode: str, archive: Path, timeout: float) -> None:
        self.modes.append(mode)
        if mode == "--dump":
            archive.write_bytes(b"dumped")
        elif not self.check_passes:
            raise subprocess.CalledProcessError(134, mode, "", "SIGBUS")


def test_a_dump_is_installed_only_once_checked_and_then_replaces_older_archives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    older = tmp_path / f"{class_archive.PREFIX}0000000000000000.jsa"
    older.write_bytes(b"an archive of a JVM since upgraded")
    children = _Children(check_passes=False)
    monkeypatch.setattr(class_archive, "_child", children)
    with pytest.raises(subprocess.CalledProcessError):
        class_archive.build(tmp_path)
    assert children.modes == ["--dump", "--check"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [older.name]  # nothing installed, no partial left

    children = _Children()
    monkeypatch.setattr(class_archive, "_child", children)
    built = class_archive.build(tmp_path)
    assert built == class_archive.archive_path(tmp_path) and built is not None
    assert built.read_bytes() == b"dumped" and children.modes == ["--dump", "--check"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [built.name]  # the older one gone
    assert class_archive.build(tmp_path) == built and children.modes == ["--dump", "--check"]  # built once
    assert class_archive.build(tmp_path, force=True) == built and len(children.modes) == 4
