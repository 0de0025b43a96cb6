"""One SparkSession set up the way this machine and a cluster both accept."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from spark_analytics import class_archive

# Under this many compressed trace bytes (~1M trade events in 1000-event batches) the local JVM
# compiles with C1 only: a short audit spends more on C2 compiling Spark than C2 gives back
# (docs/audit.md, "The JIT of a small audit").
SMALL_INPUT_BYTES = 16 << 20


def local_java_options(input_bytes: int | None, classes: str | None = None) -> str:
    """The local JVM's options. A batch job on a heap it keeps: the throughput collector, not G1
    (no concurrent marking, cheaper write barriers, less code for C2 to compile): ~10 s less CPU
    of ~150 at 10M events. A small input (`SMALL_INPUT_BYTES`): no C2 at all. `classes`: the
    class archive's options (None: the archive `class_archive` built for this JVM, if any)."""
    small = input_bytes is not None and input_bytes < SMALL_INPUT_BYTES
    archive = class_archive.java_options() if classes is None else classes
    return " ".join(filter(None, ["-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1" if small else "", archive]))


def spark_session(master: str | None = None, app_name: str = "aldebaran-audit", memory: str = "2g",
                  input_bytes: int | None = None, classes: str | None = None) -> SparkSession:
    """Local runs bind to 127.0.0.1 (the hostname resolves oddly) and keep the UI off.

    `master=None` keeps whatever spark-submit configured (a cluster); locally it is
    `local[2]`. `memory` is the driver's heap (in local mode, the executors' too).
    `input_bytes`: the compressed size of the traces to read, when known; `classes`: the class
    archive's JVM options (`local_java_options`).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must see the same packages as the driver (msgspec for msgpack).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        # One task per part file (gzip does not split): packed into partitions of ~100 MB, a night's
        # eleven hourly files were read by two tasks of unequal size, one core idle at the end.
        .config("spark.sql.files.maxPartitionBytes", str(1 << 20))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        .config("spark.driver.memory", memory)
        # An audit never stops on a value: every conversion here is checked explicitly, and
        # ANSI mode would turn a stray one into a failed job instead of a counted reject.
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Trade rows hold whole bodies (a 1000-event batch is ~90 kB): bound the Arrow batches
        # sent to the Python workers by bytes, not only by rows.
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(32 << 20))
        # The per-order walk's cost per Arrow batch is mostly fixed: fewer, larger batches.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
        # The cached record frame is read a few times and dropped: trying dictionary and
        # run-length encodings on every value while building it cost more than it saved.
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
    )
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: run locally
        master = "local[2]"
    if master:
        builder = builder.master(master)
    if master and master.startswith("local"):
        builder = builder.config("spark.driver.extraJavaOptions", local_java_options(input_bytes, classes))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
