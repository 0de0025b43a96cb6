"""Redis Sentinel: the master SIGKILLed mid-stream, the sentinels fail over, nothing is lost.

A private deployment (`tests/faults/sentinel.py`): a master, one replica and three
sentinels on free ports, AOF on. The whole default fleet (engine, lookout, both
deliverers) runs on `ALDEBARAN_REDIS_URL=redis+sentinel://...`, which makes every
write a worker acks on wait for one replica (`redis_min_replicas_acked`, 1 by default
with a Sentinel URL). The master is SIGKILLed while the stream flows; the test waits
until the sentinels name a new master, then until a worker has refused to count a write
that no replica acknowledged (with one replica, the new master has none), then brings
the killed node back as its replica (as an operator would), and checks that both sinks
got every expected alert exactly once and that the engine went on on the new master.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from aldebaran.io.redis import NotReplicated, Replicas, run_script, set_replicated
from aldebaran.settings import Settings
from tests.faults.fleet import ORDERS, TEST_TIMEOUT, Fleet, describe, in_background, pull_queue_deliveries
from tests.faults.sentinel import SentinelGroup, wait_for
from tests.faults.test_restarts import _run
from tests.support.checker import fault_stream

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
REFUSED = "Redis replicas acknowledged"  # NotReplicated's message, in a worker's log
CMD = "FAULTS_SCALE=full .venv/bin/python -m pytest -m faults -q -s 'tests/faults/test_sentinel.py::{}'"


def _last_op(group: SentinelGroup, port: int, prefix: str) -> tuple[str, int]:
    """The engine's last applied operation on one node: (its process token, its number)."""
    raw = group.node(port).client().get(f"{prefix}:engine:last-op") or b"#0="
    token, _, rest = raw.decode().rpartition("#")
    return token, int(rest.split("=", 1)[0])


def _failover(group: SentinelGroup, fleet: Fleet, prefix: str, timings: dict[str, float],
              ops: dict[str, tuple[str, int]]) -> None:
    """SIGKILL the master and wait for the sentinels' new master. It has no replica: wait
    until a worker refused to count a write for want of one, then bring the killed node
    back as the new master's replica and wait for its link."""
    old = group.master_port()
    ops["at_kill"] = _last_op(group, old, prefix)
    killed = time.monotonic()
    group.kill(old)
    new = group.wait_for_failover(old)
    timings.update(old=old, new=new, killed_at=killed, failover_s=time.monotonic() - killed)
    wait_for("a worker refused a write no replica acknowledged",
             lambda: REFUSED in fleet.all_logs(), timeout=60, every=0.2)
    timings["first_refusal_s"] = time.monotonic() - killed
    group.restart(old, replica_of=new)
    group.wait_replicas(new, 1)
    timings["replica_back_s"] = time.monotonic() - killed


def _first_after(arrivals: list[tuple[float, str]], killed_at: float) -> float:
    """Seconds from the kill to the first alert the webhook received after it."""
    after = [at for at, _ in arrivals if at >= killed_at]
    return min(after) - killed_at if after else float("nan")


def test_sentinel_failover_mid_stream(fault_env, webhook, redis_prefix, vhost, tmp_path: Path, record) -> None:
    group = SentinelGroup(tmp_path / "redis").start()
    timings: dict[str, float] = {}
    ops: dict[str, tuple[str, int]] = {}
    try:
        env = {**fault_env, "ALDEBARAN_REDIS_URL": group.url}
        stream = fault_stream(ORDERS, seed=25)
        fleet = Fleet(env, tmp_path / "logs").start_all()
        try:
            reports = _run(fleet, stream, vhost.amqp_url, {
                "webhook": webhook.deliveries,
                "queue-api": lambda: pull_queue_deliveries(group.url, redis_prefix)},
                at={0.4: in_background(lambda: _failover(group, fleet, redis_prefix, timings, ops))},
                redis=group.url, prefix=redis_prefix)
        finally:
            codes = fleet.stop_all()
        logs = fleet.all_logs()
        ops["at_end"] = _last_op(group, int(timings["new"]), redis_prefix)
    finally:
        group.close()
    figures = {k: round(v, 2) for k, v in timings.items() if k.endswith("_s")}
    figures.update(first_alert_after_kill_s=round(_first_after(webhook.timeline(), timings["killed_at"]), 2),
                   engine_commits_after_kill=ops["at_end"][1] - ops["at_kill"][1],
                   refused_steps=logs.count(REFUSED))
    print(f"\nSentinel failover: {len(stream.events)} events, {figures}\n{describe(reports.values())}")
    record("Redis Sentinel failover (private master + 1 replica + 3 sentinels, master SIGKILLed at 40%; "
           "WAIT 1: writes refused until the old node is back as replica)", 1, len(stream.events), reports,
           CMD.format("test_sentinel_failover_mid_stream"), **figures)
    assert timings["new"] != timings["old"]
    # The same engine process went on committing, on the new master (its op ids continue).
    assert ops["at_end"][0] == ops["at_kill"][0] and ops["at_end"][1] > ops["at_kill"][1], ops
    assert all(r.ok for r in reports.values()), describe(reports.values())
    assert all(code == 0 for code in codes.values()), codes


async def test_a_write_counts_only_once_a_replica_has_it(tmp_path: Path, redis_prefix: str) -> None:
    """The building block: a replicated write returns once the replica acknowledged it, and
    fails (`NotReplicated`, its input stays unacked) while the replica does not answer."""
    from aldebaran.io.redis import connect

    group = SentinelGroup(tmp_path / "redis").start()
    try:
        redis = await connect(Settings(redis_url=group.url, redis_key_prefix=redis_prefix))
        replica = next(n for n in group.nodes if n.port != group.master_port())
        replicas = Replicas(1, 300)
        try:
            script = redis.register_script("return redis.call('INCR', KEYS[1])")
            assert await run_script(redis, script, ["counter"], [], replicas) == 1
            await set_replicated(redis, "mark", "1", 60, replicas)
            assert wait_for("the replica holds both writes",
                            lambda: replica.client().get("counter") == b"1" and replica.client().get("mark"), 5)
            assert replica.process is not None
            replica.process.send_signal(signal.SIGSTOP)  # alive, connected, silent
            try:
                with pytest.raises(NotReplicated, match="0 of 1 Redis replicas"):
                    await run_script(redis, script, ["counter"], [], replicas)
                with pytest.raises(NotReplicated):
                    await set_replicated(redis, "mark", "2", 60, replicas)
                assert await run_script(redis, script, ["counter"], [], Replicas(0)) == 3  # not waiting: no error
            finally:
                replica.process.send_signal(signal.SIGCONT)
        finally:
            await redis.aclose()
    finally:
        group.close()
