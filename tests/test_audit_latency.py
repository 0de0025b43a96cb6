"""The audit's detection-latency figures: read off counts per latency, the same as Spark's
`percentile_disc` over every latency (the way they were computed before, kept here as the
reference)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_analytics import stats

pytestmark = pytest.mark.spark


def _percentile_disc(per_order: DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    judged = per_order.where(F.col("should_fire") & F.col("latency_ms").isNotNull()
                             & ~F.col("verdict").isin("unaudited", "uncertain", "pending"))
    pct = [F.expr(f"percentile_disc({q}) WITHIN GROUP (ORDER BY latency_ms)").alias(n) for n, q in
           (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))]
    rows = judged.cube("vhost", "kind").agg(F.count("*").alias("count"), *pct, F.min("latency_ms").alias("min"),
                                            F.max("latency_ms").alias("max")).collect()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        found = {"count": r["count"], **{k: float(r[k]) for k in ("p50", "p95", "p99", "max")}}
        if r["vhost"] is None and r["kind"] is None:
            found["min"] = float(r["min"])
        out.setdefault(r["vhost"] or "all", {})[r["kind"] or "all"] = found
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_latency_figures_are_spark_percentile_disc(spark: SparkSession, seed: int) -> None:
    rnd = random.Random(seed)
    rows = []
    for vhost, kind, n in (("prod", "over_purchase", rnd.randint(1, 400)), ("prod", "purchase_without_request", 1),
                           ("staging", "over_purchase", rnd.randint(2, 30))):
        for _ in range(n):
            rows.append((vhost, kind, rnd.randint(0, 50), True, "ok"))
    rows += [("prod", "over_purchase", 9_999, False, "spurious"), ("prod", "over_purchase", 8_888, True, "pending"),
             ("staging", "over_purchase", None, True, "missed")]  # not judged: no figure may move
    df = spark.createDataFrame(rows, "vhost string, kind string, latency_ms long, should_fire boolean, verdict string")
    assert stats.latency(df) == _percentile_disc(df)


def test_no_judged_alert_gives_no_figures(spark: SparkSession) -> None:
    df = spark.createDataFrame([("prod", "over_purchase", None, True, "missed")],
                               "vhost string, kind string, latency_ms long, should_fire boolean, verdict string")
    assert stats.latency(df) == {}
