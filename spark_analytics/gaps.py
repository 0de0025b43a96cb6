"""Windows with no verdict: the recorder's gap markers and silences between heartbeats.

A recorder that crashed and never came back writes no marker; its silence is found by
heartbeat spacing (more than `silence_factor` intervals between consecutive signs of
life) and by the audit window's edges not being covered.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def unaudited_windows(traces: DataFrame, since_ms: int | None, until_ms: int | None,
                      silence_factor: float = 3.0, default_interval_s: float = 10.0) -> list[tuple[int, int, str]]:
    """Merged [start, end, reason] windows (epoch ms) inside [since, until]."""
    marked = [(r["start"], r["end"], r["reason"] or "recorder gap")
              for r in traces.where(F.col("kind") == "gap").select("start", "end", "reason").collect()]
    beats = traces.where(F.col("kind") == "heartbeat")
    interval_s = beats.agg(F.max("interval")).first()[0] or default_interval_s
    # Signs of life: heartbeats and every traced record, bucketed per second (small to collect).
    life = sorted(r[0] * 1000 for r in traces.where(F.col("kind").isin("heartbeat", "publish", "deliver"))
                  .select((F.col("ts") / 1000).cast("long").alias("s")).distinct().collect())
    windows = list(marked)
    allowed = silence_factor * interval_s * 1000
    for a, b in zip(life, life[1:]):
        covered = any(s - 1000 <= a and e + 1000 >= b for s, e, _ in marked)
        if b - a > allowed and not covered:
            windows.append((a, b, "no heartbeat"))
    if life:
        if since_ms is not None and life[0] - since_ms > allowed:
            windows.append((since_ms, life[0], "not recording at the window's start"))
        if until_ms is not None and until_ms - life[-1] > allowed:
            windows.append((life[-1], until_ms, "not recording at the window's end"))
    elif since_ms is not None and until_ms is not None:
        windows.append((since_ms, until_ms, "no traces"))
    return merge(windows)


def merge(windows: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for start, end, reason in sorted(windows):
        if out and start <= out[-1][1]:
            s, e, r = out[-1]
            out[-1] = (s, max(e, end), r if reason in r else f"{r}; {reason}")
        else:
            out.append((start, end, reason))
    return out


def overlaps_any(start, end, windows: list[tuple[int, int, str]]):  # noqa: ANN001, ANN201 - Columns
    """A Column: does [start, end] touch any window? (windows are few; an OR chain is fine)."""
    cond = F.lit(False)
    for s, e, _ in windows:
        cond = cond | ((start <= F.lit(e)) & (end >= F.lit(s)))
    return cond
