"""Fixtures with real services: a RabbitMQ vhost and a Redis key prefix per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from aldebaran.io import frame_reader
from aldebaran.settings import Settings
from tests.support import services
from tests.support.pipeline import Broker, declare

RECORDED_RUNS = {"test_audit", "test_audit_pipeline", "test_kill"}  # modules whose audits judge real runs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), the tests of the in-process SparkSession (those
    that ask for `spark`, and those marked `spark` that ask for it late) run in two groups, one
    JVM each: the audits of real recorded runs, and those of hand-made traces. One JVM for all
    of them made a path longer than the rest of the suite; one per worker, three JVMs warming
    up on two cores."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) or item.get_closest_marker("spark"):
            recorded = item.path.stem in RECORDED_RUNS
            item.add_marker(pytest.mark.xdist_group("spark-recorded" if recorded else "spark-traces"))


@pytest.fixture(scope="session", autouse=True)
def _real_services() -> None:
    services.check_services()
    frame_reader.install()  # as every worker process reads its frames (workers/runtime.py)


@pytest.fixture
def vhost() -> Iterator[services.Vhost]:
    created = services.create_vhost()
    yield created
    services.delete_vhost(created)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = services.redis_prefix()
    yield prefix
    services.clean_redis(prefix)


@pytest.fixture
def settings(vhost: services.Vhost, redis_prefix: str, tmp_path) -> Settings:
    """Settings pointing at this test's own vhost and key prefix."""
    return Settings(
        amqp_url=vhost.amqp_url,
        redis_url=services.REDIS_URL,
        redis_key_prefix=redis_prefix,
        management_url=services.MANAGEMENT_URL,
        traces_dir=str(tmp_path / "traces"),
        book_ttl_seconds=60,
    )


@pytest.fixture
def worker_env(vhost: services.Vhost, redis_prefix: str, tmp_path) -> dict[str, str]:
    """Environment for `aldebaran` subprocesses bound to this test's vhost and prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(
        ALDEBARAN_AMQP_URL=vhost.amqp_url,
        ALDEBARAN_REDIS_URL=services.REDIS_URL,
        ALDEBARAN_REDIS_KEY_PREFIX=redis_prefix,
        ALDEBARAN_MANAGEMENT_URL=services.MANAGEMENT_URL,
        ALDEBARAN_TRACES_DIR=str(tmp_path / "traces"),
        ALDEBARAN_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def broker(vhost: services.Vhost, worker_env: dict[str, str]) -> Iterator[Broker]:
    """The test's vhost with the topology declared and an alert tap, as a publisher."""
    declare(worker_env)
    connection = Broker(vhost.amqp_url)
    connection.tap_alerts()
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] SparkSession per pytest worker for its audit tests: it costs ~7 s to start."""
    from spark_analytics.session import spark_session

    session = spark_session("local[2]", input_bytes=0)  # tests audit kilobytes: C1 alone (SMALL_INPUT_BYTES)
    session.conf.set("spark.sql.shuffle.partitions", "2")  # tiny inputs: fewer, cheaper tasks
    yield session
    session.stop()
