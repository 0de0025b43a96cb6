"""Reading the recorder's JSON lines: an explicit schema, hour pruning, damage counted.

The schema mirrors `aldebaran/io/trace_files.py`'s record format but is written out here on
purpose: the audit does not import the streaming code. Damage never stops the job: a
line that is not a JSON record (half-written, garbage, bytes that are not UTF-8) becomes a
`_corrupt_record` row that is counted and dropped, and a part file whose gzip stream
breaks off is read up to the break (`ignoreCorruptFiles`) and listed with the bytes lost.
The files are inflated a second time to find those bytes only when the first read failed
on one (`is_damaged_read`): intact traces are inflated once.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

CORRUPT = "_corrupt_record"

# Nested fields are strings: a type mismatch deep in a record must not void the record.
HEADERS = T.StructType([T.StructField(name, T.StringType()) for name in ("vhost", "connection", "channel")])

TRACE_SCHEMA = T.StructType([
    T.StructField("kind", T.StringType()),          # publish | deliver | heartbeat | gap
    T.StructField("ts", T.LongType()),              # epoch milliseconds
    T.StructField("vhost", T.StringType()),         # the deployment (recorder >= issue 21; else in headers)
    T.StructField("exchange", T.StringType()),
    T.StructField("queue", T.StringType()),
    T.StructField("redelivered", T.BooleanType()),
    T.StructField("trace_redelivered", T.BooleanType()),
    T.StructField("content_type", T.StringType()),
    T.StructField("message_id", T.StringType()),
    T.StructField("body_b64", T.StringType()),
    T.StructField("recorder", T.StringType()),
    T.StructField("start", T.LongType()),
    T.StructField("end", T.LongType()),
    T.StructField("interval", T.DoubleType()),
    T.StructField("reason", T.StringType()),
    T.StructField("headers", HEADERS),              # the firehose headers the audit uses
    T.StructField(CORRUPT, T.StringType()),
])


def hour_paths(root: str, since_ms: int | None, until_ms: int | None) -> list[str]:
    """Partition directories that can hold records in [since, until]; all when unbounded."""
    base = Path(root)
    dirs = sorted(p for p in base.glob("date=*/hour=*") if p.is_dir())
    if since_ms is None and until_ms is None:
        return [str(p) for p in dirs]
    low = datetime.fromtimestamp((since_ms or 0) / 1000, tz=UTC).replace(minute=0, second=0, microsecond=0)
    high = datetime.fromtimestamp((until_ms or 4102444800000) / 1000, tz=UTC)
    keep = []
    for p in dirs:
        try:
            hour = datetime.strptime(f"{p.parent.name[5:]} {p.name[5:]}", "%Y-%m-%d %H").replace(tzinfo=UTC)
        except ValueError:
            continue
        if low <= hour <= high or (hour < low and hour + timedelta(hours=1) > low):
            keep.append(str(p))
    return keep


def part_files(root: str, since_ms: int | None = None, until_ms: int | None = None) -> list[str]:
    """Every part file of the hours that can hold [since, until]."""
    return sorted(str(f) for p in hour_paths(root, since_ms, until_ms) for f in Path(p).glob("*.jsonl.gz"))


def read_raw(spark: SparkSession, files: list[str], since_ms: int | None = None,
             until_ms: int | None = None, damaged: bool = False) -> DataFrame:
    """Every record in [since, until] (gaps by overlap) plus every unreadable line (`_corrupt_record`).

    A part file whose gzip stream breaks off fails the read (`is_damaged_read`), unless
    `damaged`: then each such file is read up to the break (`ignoreCorruptFiles`)."""
    if not files:
        return spark.createDataFrame([], TRACE_SCHEMA)
    # A recorder killed in the middle of a write leaves a torn last gzip member; its records
    # were never acked, so the broker re-delivers them to the next recorder. ignoreCorruptFiles
    # keeps every row read before the break and skips only the rest of that file
    # (`torn_tails` counts what was skipped).
    df = (spark.read.schema(TRACE_SCHEMA).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
          .option("ignoreCorruptFiles", str(damaged).lower()).json(files))
    lo = F.lit(since_ms if since_ms is not None else -(2**62))
    hi = F.lit(until_ms if until_ms is not None else 2**62)
    is_gap = F.col("kind") == "gap"
    return df.where(F.col(CORRUPT).isNotNull()
                    | (is_gap & (F.col("end") >= lo) & (F.col("start") <= hi))
                    | (~is_gap & (F.col("ts") >= lo) & (F.col("ts") <= hi)))


def is_damaged_read(exc: Exception) -> bool:
    """Did a read fail on a part file's bytes (a torn or corrupt gzip stream)? Hadoop's gzip reader
    fails on anything after the last whole member, so a read without this error had no damage."""
    return "FAILED_READ_FILE" in str(exc)


@contextmanager
def quiet(spark: SparkSession) -> Iterator[None]:
    """No executor stack traces on the console while a read may fail on purpose (`is_damaged_read`)."""
    spark.sparkContext.setLogLevel("OFF")
    try:
        yield
    finally:
        spark.sparkContext.setLogLevel("ERROR")


def complete_length(path: str, chunk: int = 1 << 20) -> int:
    """How many leading bytes of a file are whole gzip members (streamed, nothing kept)."""
    good = offset = 0
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    with open(path, "rb") as fh:
        while True:
            if not pending:
                pending = fh.read(chunk)
                if not pending:
                    return good
            try:
                inflater.decompress(pending, 0)
            except zlib.error:
                return good
            if inflater.eof:
                offset += len(pending) - len(inflater.unused_data)
                good, pending = offset, inflater.unused_data
                inflater = zlib.decompressobj(wbits=31)
            else:
                offset += len(pending)
                pending = b""


def _tail(path: str) -> tuple[str, int, int]:
    size = Path(path).stat().st_size
    return path, complete_length(path), size


def torn_tails(spark: SparkSession, files: list[str], local_bytes: int = 64 << 20) -> list[tuple[str, int, int]]:
    """(file, bytes read, size) of each part file that does not end with a whole gzip member.

    Inflating is the cost, paid once per byte like Spark's own read: on the executors in
    parallel, or here when the files are small (no job to schedule).
    """
    if not files:
        return []
    if sum(Path(f).stat().st_size for f in files) <= local_bytes:
        tails = [_tail(f) for f in files]
    else:
        slices = max(1, min(len(files), spark.sparkContext.defaultParallelism * 2))
        tails = spark.sparkContext.parallelize(files, slices).map(_tail).collect()
    return [t for t in tails if t[1] < t[2]]


def fingerprint(df: DataFrame) -> DataFrame:
    """`fp1`, `fp2`: a 96-bit hash of what the broker sent; the same in a re-recorded copy.
    (`records` keeps them for alert publishes and deliveries only.)"""
    parts = [F.col(c) for c in ("kind", "exchange", "queue", "message_id", "redelivered", "body_b64")]
    parts += [F.col("headers.connection"), F.col("headers.channel"), F.col("headers.vhost")]
    return df.withColumn("fp1", F.xxhash64(*parts)).withColumn("fp2", F.hash(*parts))


def drop_rerecorded(df: DataFrame) -> DataFrame:
    """A trace message written but not acked before a recorder crash comes back redelivered
    and is written again; the copy has the same fingerprint, so keep one. Re-recorded rows
    are few: they are matched against the fresh ones with broadcast joins, not a shuffle."""
    fp = ["fp1", "fp2"]
    again_flag = F.coalesce(F.col("trace_redelivered"), F.lit(False)) & F.col("fp1").isNotNull()
    again = df.where(again_flag)
    rest = df.where(~again_flag)
    wanted = F.broadcast(again.select(*fp).distinct())
    fresh_seen = F.broadcast(rest.join(wanted, fp, "left_semi").select(*fp).distinct())
    # One copy per fingerprint among the re-recorded ones too: a trace message can come back
    # to more than one recorder, and when the first never wrote it there is no fresh copy.
    kept = again.join(fresh_seen, fp, "left_anti").dropDuplicates(fp)
    return rest.unionByName(kept)
