"""The walk's shuffle: rows handed to their order's partition as Arrow IPC blobs.

Ten million trade elements as Spark rows cost the JVM more than everything the Python
workers do with them (Arrow to rows after the split, the shuffle's serialisation, a sort of
eight columns, rows back to Arrow for the walk: ~5.5 µs per element on 2 cores). Here the
workers that split the bodies (`bodies`) also cut their rows by a hash of (vhost, order)
into buckets (`bucket_count`: more for more input, so that a bucket, the walk's unit of memory,
stays ~`BUCKET_BYTES` of trade bodies) and write each bucket's rows as one Arrow record batch (`pack`):
Spark shuffles a few thousand binary rows by bucket, and the walk's workers read each
bucket back (`buckets`), sorted by Arrow exactly as Spark sorted the rows before (by the
hash, then vhost, order, type, id, time, position, shares; nulls first).

Every row of an order lands in one bucket: its hash is a function of (vhost, order) only
(rows that are no event, with no order, are spread by time). Any Spark shuffle carries the
blobs, so the job runs on a cluster unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_analytics import bodies

MIN_BUCKETS = 256
BUCKET_BYTES = 8 << 20  # of trade bodies per bucket: ~100,000 elements, a few tens of MB in a worker
BLOB_SCHEMA = "bucket int, blob binary"
ROWS = pa.schema([("vhost", pa.string()), ("order_id", pa.string()), ("etype", pa.string()),
                  ("event_id", pa.string()), ("ts", pa.int64()), ("idx", pa.int32()), ("shares", pa.int64()),
                  ("valid", pa.bool_()), ("junk", pa.int8()), ("kind", pa.string()),
                  ("published_order_id", pa.string()), ("h", pa.uint64())])
# Spark's former sort within a partition: the hash first (cheap), then the exact key.
_SORT = [(k, "ascending", "at_start") for k in
         ("h", "vhost", "order_id", "etype", "event_id", "ts", "idx", "shares")]
# Odd 64-bit weights by byte position (mod 32): a polynomial hash, summed with wrap-around.
_WEIGHTS = (np.arange(1, 33, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)


def _string_hash(values: pa.Array) -> np.ndarray:
    """A 64-bit hash of each string's UTF-8 bytes (null hashes as ""), vectorised over the array."""
    values = pc.fill_null(values.cast(pa.string()), "")
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset: values.offset + len(values) + 1]
    rel = offsets - offsets[0]
    data = values.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    pos = np.arange(len(raw)) - np.repeat(rel[:-1], np.diff(rel))
    sums = np.zeros(len(raw) + 1, dtype=np.uint64)
    np.cumsum((raw.astype(np.uint64) + np.uint64(1)) * _WEIGHTS[pos & 31], out=sums[1:])
    return sums[rel[1:]] - sums[rel[:-1]]


def _mixed(h: np.ndarray) -> np.ndarray:
    """A finaliser (splitmix64's) so that every bit of the sum reaches the bucket."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def bucket_count(trade_bytes: int) -> int:
    """Buckets for `trade_bytes` of trade bodies: a power of two, at least `MIN_BUCKETS`."""
    wanted = max(MIN_BUCKETS, -(-trade_bytes // BUCKET_BYTES))
    return 1 << (wanted - 1).bit_length()


def pack(rows: pa.Table, buckets: int) -> pa.RecordBatch:
    """Walk rows (ROWS without `h`) to one blob per bucket: (bucket, Arrow record batch message)."""
    order = rows["order_id"].combine_chunks()
    h = _mixed(_string_hash(order) * np.uint64(31) + _string_hash(rows["vhost"].combine_chunks()))
    no_order = order.is_null().to_numpy(zero_copy_only=False)
    bucket = np.where(no_order, rows["ts"].to_numpy(zero_copy_only=False) % buckets, h % np.uint64(buckets))
    bucket = bucket.astype(np.int32)
    by_bucket = np.argsort(bucket, kind="stable")
    table = rows.append_column("h", pa.array(h)).select(ROWS.names).cast(ROWS).take(pa.array(by_bucket))
    cuts = np.flatnonzero(np.r_[True, np.diff(bucket[by_bucket]) != 0, True])
    batch = table.combine_chunks().to_batches()
    whole = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=ROWS)
    blobs = [whole.slice(a, b - a).serialize() for a, b in pairwise(cuts)]
    offsets = np.r_[0, np.cumsum([b.size for b in blobs])].astype(np.int32)
    data = pa.py_buffer(b"".join(blobs))
    column = pa.Array.from_buffers(pa.binary(), len(blobs), [None, pa.py_buffer(offsets), data])
    return pa.RecordBatch.from_arrays([pa.array(bucket[by_bucket][cuts[:-1]], pa.int32()), column],
                                      names=["bucket", "blob"])


def _elements(split: pa.RecordBatch) -> pa.Table:
    """`bodies.split_batch` rows as walk rows (no publish fields; `spark_text` stays behind)."""
    n = split.num_rows
    t = pa.Table.from_batches([split]).drop_columns(["spark_text"])
    return t.append_column("kind", pa.nulls(n, pa.string())).append_column(
        "published_order_id", pa.nulls(n, pa.string()))


def split_and_pack(buckets: int, max_bytes: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For `mapInArrow` over trade messages (vhost, ts, b64, msgpack): split by `bodies`, packed by bucket."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield pack(_elements(bodies.split_batch(batch, max_bytes)), buckets)
    return run


def packed(buckets: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For `mapInArrow` over walk rows already in Spark (publishes, elements read by Spark's parser)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield pack(pa.Table.from_batches([batch]), buckets)
    return run


def _sorted(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    t = pa.Table.from_batches(parts, schema=ROWS).combine_chunks()
    t = t.take(pc.sort_indices(t, sort_keys=_SORT))
    return t.drop_columns(["h"]).combine_chunks().to_batches()[0]


def buckets(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Blob rows sorted by bucket to one batch per bucket, its rows in the walk's order."""
    current: int | None = None
    parts: list[pa.RecordBatch] = []
    for batch in batches:
        blobs = batch.column("blob")
        for bucket, blob in zip(batch.column("bucket").to_pylist(), blobs, strict=True):
            if bucket != current and parts:
                yield _sorted(parts)
                parts = []
            current = bucket
            parts.append(pa.ipc.read_record_batch(blob.as_buffer(), ROWS))
    if parts:
        yield _sorted(parts)


def walker(walk: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
           ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """`walk` (over whole orders in the walk's order) over a partition of blobs sorted by bucket."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return walk(buckets(batches))
    return run
