"""Windows with no verdict: the recorder's gap markers and silences between heartbeats.

A recorder that crashed and never came back writes no marker; its silence is found by
heartbeat spacing (more than `silence_factor` intervals between consecutive signs of
life) and by the audit window's edges not being covered. Per deployment (vhost): each
has its own recorder. Heartbeats and gap markers written without a vhost (older
recorders) count for every deployment.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

Window = tuple[int, int, str]
BUCKET_MS = 1000  # signs of life are collected per whole second


def unaudited_windows(slim: DataFrame, vhosts: list[str], since_ms: int | None, until_ms: int | None,
                      silence_factor: float = 3.0, default_interval_s: float = 10.0) -> dict[str, list[Window]]:
    """Merged [start, end, reason] windows (epoch ms) inside [since, until], per vhost."""
    kind = F.col("kind")
    # One job: gap markers, heartbeat intervals, and signs of life (heartbeats and every
    # traced record) bucketed per second (small to collect).
    rows = (slim.where((kind != "corrupt") & (F.col("ts").isNotNull() | (kind == "gap")))
            .select("vhost", (kind == "gap").alias("gap"), F.when(kind != "gap", (F.col("ts") / BUCKET_MS).cast("long"))
                    .alias("s"), "start", "end", "reason", F.when(kind == "heartbeat", F.col("interval")).alias("i"))
            .distinct().collect())
    marked = [(r["vhost"], r["start"], r["end"], r["reason"] or "recorder gap") for r in rows if r["gap"]]
    beats: dict[str | None, float] = {}
    seconds: dict[str | None, list[int]] = defaultdict(list)
    for r in rows:
        if not r["gap"]:
            seconds[r["vhost"]].append(r["s"] * BUCKET_MS)
            if r["i"] is not None:
                beats[r["vhost"]] = max(beats.get(r["vhost"], 0.0), r["i"])
    out = {}
    for v in vhosts:
        life = sorted(set(seconds.get(v, [])) | set(seconds.get(None, [])))
        mine = [(s, e, why) for vv, s, e, why in marked if vv in (v, None)]
        interval_s = beats.get(v) or beats.get(None) or default_interval_s
        out[v] = silences(life, mine, silence_factor * interval_s * 1000, since_ms, until_ms)
    return out


def silences(life: list[int], marked: list[Window], allowed: float, since_ms: int | None,
             until_ms: int | None) -> list[Window]:
    """`marked` plus every stretch longer than `allowed` ms without a sign of life, merged.

    `life` holds whole seconds (ms, floored): two signs of life 1.01 s apart can land 2 s
    apart, so a silence counts only once it is longer than `allowed` plus that second."""
    allowed += BUCKET_MS
    windows = list(marked)
    for a, b in pairwise(life):
        covered = any(s - BUCKET_MS <= a and e + BUCKET_MS >= b for s, e, _ in marked)
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


def merge(windows: list[Window]) -> list[Window]:
    out: list[Window] = []
    for start, end, reason in sorted(windows):
        if out and start <= out[-1][1]:
            s, e, r = out[-1]
            out[-1] = (s, max(e, end), r if reason in r else f"{r}; {reason}")
        else:
            out.append((start, end, reason))
    return out


def overlaps_any(vhost: Column, start: Column, end: Column, windows: dict[str, list[Window]]) -> Column:
    """A Column: does [start, end] touch any of its deployment's windows? (windows are few)."""
    cond = F.lit(False)
    for v, spans in windows.items():
        touch = F.lit(False)
        for s, e, _ in spans:
            touch = touch | ((start <= F.lit(e)) & (end >= F.lit(s)))
        if spans:
            cond = cond | ((vhost == F.lit(v)) & touch)
    return cond
