"""Spark's classes for the local audit JVM, archived once (AppCDS) instead of loaded afresh each run.

A local audit's JVM spends seconds before it reads a trace: it parses and verifies the same
thousands of classes of Spark, Hadoop and their libraries every time. Java 17 can dump the
classes one run loaded into an archive (`-XX:ArchiveClassesAtExit`) that later runs map
instead (`-XX:SharedArchiveFile`). Measured on this machine (docs/audit.md, "The class
archive"): a 300,000-event audit 17.4-18.7 s without it, 13.7-13.8 s with it; a 10M-event one
49.7-51.1 s, 46.9-47.7 s.

An archive fits one JVM build and one set of Spark jars, so its name carries both; it is built
once after installing (docs/operations.md; `make test`'s set-up does it), again after an upgrade
of either. A JVM handed an archive of another build refuses it and runs without; a JVM handed a
truncated archive crashes (SIGBUS in `FileMapInfo::relocate_pointers_in_core_regions`, seen on
17.0.15). So an archive is dumped under a temporary name, mapped by a fresh JVM that must use it
(`-Xshare:on`) and run a job, and only then renamed into place: a half-written or unusable one
is never where an audit looks.

    python -m spark_analytics.class_archive [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIX = "spark-classes-"
DUMP_TIMEOUT_S = 600  # a tiny audit in a fresh JVM, then the dump at its exit
CHECK_TIMEOUT_S = 300
# A mismatched archive is refused with a warning on the console; the run goes on without it.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def directory() -> Path:
    """Where this environment's archive lives: beside the interpreter's packages (it fits their jars)."""
    return Path(sys.prefix) / "var" / "aldebaran"


def _java() -> Path | None:
    """The `java` Spark's launcher runs: `$JAVA_HOME/bin/java`, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(where: Path | None = None) -> Path | None:
    """The archive that fits this JVM build and these Spark jars; None without a Java runtime."""
    import pyspark

    java = _java()
    if java is None:
        return None
    jvm_files = [java, *sorted(java.parent.parent.glob("lib/server/libjvm.so"))]
    identity = [pyspark.__version__, *(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jvm_files)]
    identity += sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return (where or directory()) / f"{PREFIX}{key}.jsa"


def java_options(where: Path | None = None) -> str:
    """The local JVM's options for the archive that fits, when one was built; empty otherwise."""
    path = archive_path(where)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None and path.is_file() else ""


def build(where: Path | None = None, force: bool = False) -> Path | None:
    """Build the archive that fits (unless there is one): dumped by a tiny audit in a child
    process, checked by another, then renamed into place; older archives are removed.
    None without a Java runtime; `subprocess.CalledProcessError` when the dump or the check fails."""
    path = archive_path(where)
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        partial.unlink(missing_ok=True)
        _child("--dump", partial, DUMP_TIMEOUT_S)
        if not partial.is_file():
            raise subprocess.CalledProcessError(0, "--dump", "", "its JVM exited without writing the archive")
        _child("--check", partial, CHECK_TIMEOUT_S)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    for old in path.parent.glob(f"{PREFIX}*.jsa"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def _child(mode: str, archive: Path, timeout: float) -> None:
    """A fresh interpreter (so a fresh JVM) for one step; its output is shown only when it fails."""
    done = subprocess.run([sys.executable, "-m", "spark_analytics.class_archive", mode, str(archive)],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, mode, done.stdout, done.stderr[-4000:])


def _dump(archive: Path) -> None:
    """Audit a small synthetic trace with every step and output, so the archive holds what an
    audit loads; then stop the JVM and wait for it: it writes the archive as it exits."""
    from pyspark import SparkContext

    from spark_analytics import job, synthetic
    from spark_analytics.options import AuditOptions
    from spark_analytics.session import spark_session

    with tempfile.TemporaryDirectory(prefix="aldebaran-classes-") as work:
        spark = spark_session(None, classes=f"-XX:ArchiveClassesAtExit={archive}")
        # Both shapes of trade data: single-event messages (JSON, text form, msgpack) and batches.
        for name, shape in (("single", synthetic.Shape()), ("batched", synthetic.Shape(batch=1000, alert_batch=100))):
            traces = str(Path(work) / name)
            synthetic.generate(traces, 3_000, start_ms=1_795_000_000_000, shape=shape)
            job.run(AuditOptions(traces_dir=traces), None, str(Path(work) / f"{name}-out"), spark=spark)
        spark.stop()
        gateway = SparkContext._gateway
        process = getattr(gateway, "proc", None)
        if process is None:
            raise RuntimeError("cannot wait for the JVM: this PySpark keeps no handle on it")
        process.stdin.close()  # the gateway JVM exits when its stdin closes
        process.wait(timeout=DUMP_TIMEOUT_S)


def _check(archive: Path) -> None:
    """A fresh JVM that must map the archive (`-Xshare:on`: one it cannot use stops it) runs a job;
    a truncated archive crashes it."""
    from spark_analytics.session import spark_session

    # A crash's report goes to the temporary directory, not the caller's working directory.
    crash = Path(tempfile.gettempdir()) / "aldebaran-class-check-%p.log"
    spark = spark_session(None, classes=f"-XX:SharedArchiveFile={archive} -Xshare:on -XX:ErrorFile={crash} "
                                        "-XX:-CreateCoredumpOnCrash")
    total = spark.range(100).selectExpr("sum(id) AS total").first()
    spark.stop()
    if total is None or total["total"] != 4950:
        raise RuntimeError(f"a JVM with the archive computed {total!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_analytics.class_archive", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="build it again even if it exists")
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--check", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        _dump(args.dump)
        return 0
    if args.check:
        _check(args.check)
        return 0
    wanted = archive_path()
    if wanted is not None and (args.force or not wanted.is_file()):
        print("archiving the audit JVM's classes (about a minute, once per Java and PySpark build)", file=sys.stderr)
    try:
        path = build(force=args.force)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"the class archive could not be built; audits start without it: {exc}", file=sys.stderr)
        print(getattr(exc, "stderr", None) or "", file=sys.stderr)
        return 1
    print(f"class archive: {path}" if path else "no Java runtime: nothing to archive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
