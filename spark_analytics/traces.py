"""Reading the recorder's JSON lines: an explicit schema, hour pruning, re-recorded copies.

The schema mirrors `workers/tracer.py`'s record format but is written out here on
purpose: the audit does not import the streaming code.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

TRACE_SCHEMA = T.StructType([
    T.StructField("kind", T.StringType()),          # publish | deliver | heartbeat | gap
    T.StructField("ts", T.LongType()),              # epoch milliseconds
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
    T.StructField("headers", T.StringType()),       # the firehose headers, as JSON text
])


def hour_paths(root: str, since_ms: int | None, until_ms: int | None) -> list[str]:
    """Partition directories that can hold records in [since, until]; all when unbounded."""
    base = Path(root)
    dirs = sorted(p for p in base.glob("date=*/hour=*") if p.is_dir())
    if since_ms is None and until_ms is None:
        return [str(p) for p in dirs]
    low = datetime.fromtimestamp((since_ms or 0) / 1000, tz=timezone.utc).replace(minute=0, second=0, microsecond=0)
    high = datetime.fromtimestamp((until_ms or 4102444800000) / 1000, tz=timezone.utc)
    keep = []
    for p in dirs:
        try:
            hour = datetime.strptime(f"{p.parent.name[5:]} {p.name[5:]}", "%Y-%m-%d %H").replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        if low <= hour <= high or (hour < low and hour + timedelta(hours=1) > low):
            keep.append(str(p))
    return keep


def read_traces(spark: SparkSession, root: str, since_ms: int | None = None,
                until_ms: int | None = None) -> DataFrame:
    """Every record in [since, until] (gaps by overlap), copies re-recorded after a crash removed."""
    paths = [p for p in hour_paths(root, since_ms, until_ms) if any(Path(p).glob("*.jsonl.gz"))]
    if not paths:
        return spark.createDataFrame([], TRACE_SCHEMA)
    # A recorder killed in the middle of a write leaves a torn last gzip member. Its records
    # were never acked (the recorder acks after fsync), so the broker re-delivers them to the
    # next recorder; a torn tail must not fail the whole job ("FAILED_READ_FILE"), and the
    # members before it must still be read: ignoreCorruptFiles keeps every row read before
    # the error and skips only the rest of that one file. (A restarted recorder truncates
    # torn tails of its dead predecessors' files: workers/tracer.py, repair_torn_parts.)
    df = (spark.read.schema(TRACE_SCHEMA).option("mode", "PERMISSIVE").option("ignoreCorruptFiles", "true")
          .json([f"{p}/*.jsonl.gz" for p in paths]))
    lo = F.lit(since_ms if since_ms is not None else -(2**62))
    hi = F.lit(until_ms if until_ms is not None else 2**62)
    is_gap = F.col("kind") == "gap"
    df = df.where((is_gap & (F.col("end") >= lo) & (F.col("start") <= hi))
                  | (~is_gap & (F.col("ts") >= lo) & (F.col("ts") <= hi)))
    return drop_rerecorded(df)


def drop_rerecorded(df: DataFrame) -> DataFrame:
    """A trace message written but not acked before a recorder crash comes back redelivered
    and is written again; the copy has the same broker-side fingerprint, so keep one."""
    fingerprint = ["kind", "exchange", "queue", "message_id", "redelivered", "body_b64", "headers"]
    traced = df.where(F.col("kind").isin("publish", "deliver"))
    fresh = traced.where(~F.coalesce(F.col("trace_redelivered"), F.lit(False)))
    again = traced.where(F.coalesce(F.col("trace_redelivered"), F.lit(False)))
    if not again.take(1):
        return df
    def fp(frame: DataFrame) -> DataFrame:
        parts = [F.coalesce(F.col(c).cast("string"), F.lit("\u0000")) for c in fingerprint]
        return frame.withColumn("_fp", F.sha2(F.concat_ws("\u0001", *parts), 256))
    seen = fp(fresh).select("_fp").distinct()
    # One copy per fingerprint among the re-recorded ones too: a trace message can come back
    # to more than one recorder (the successor killed again before its ack), and when the
    # first recorder never wrote it there is no fresh copy to drop them against.
    again = fp(again).join(seen, on="_fp", how="left_anti").dropDuplicates(["_fp"]).drop("_fp")
    return df.where(~F.col("kind").isin("publish", "deliver")).unionByName(fresh).unionByName(again)
