"""One SparkSession set up the way this machine and a cluster both accept."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def spark_session(master: str | None = None, app_name: str = "aldebaran-audit") -> SparkSession:
    """Local runs bind to 127.0.0.1 (the hostname resolves oddly) and keep the UI off.

    `master=None` keeps whatever spark-submit configured (a cluster); locally it is
    `local[2]`.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must see the same packages as the driver (msgspec for msgpack).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        .config("spark.driver.memory", "2g")
    )
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: run locally
        builder = builder.master("local[2]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
