"""SIGKILL of each worker kind at 20%, 50% and 80% of the stream, restarted each time.

Expected: every sink gets every expected alert exactly once (Kafka's and Flink's
hard-bounce tests: input = output, no duplicates).

`engine` runs the default mode (the engine) on quorum queues; `aggregator` and `books` run
the per-order reference mode.

`tracer` kills the firehose recorder and then runs the nightly PySpark audit on what it
wrote. Its files must stay readable (a torn write, simulated at the first kill, is cut
by the restarted recorder; a torn tail nobody cut must not fail the audit), nothing the
firehose carried may be missing from them, and every kill must lie in a gap marker that
the audit reports as unaudited. Once the restarted recorder has marked its outage, a
second, fault-free stream follows: the audit judges those orders and must agree with the
offline checker (every alert `ok`, the same alerts expected, 0 missed, 0 duplicated).
At full scale the `aggregator` case records traces too and its audit must be clean.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.faults import traces as tr
from tests.faults.conftest import BOOK_TTL_SECONDS, redis_url
from tests.faults.fleet import (
    FULL,
    ORDERS,
    TEST_TIMEOUT,
    Fleet,
    RetryingPublisher,
    describe,
    in_doubt_ids,
    pull_queue_deliveries,
    wait_for_sinks,
)
from tests.support.checker import fault_stream
from tests.support.tracing import wait_traced
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
POINTS = (0.2, 0.5, 0.8)
# In CI the delivery side (lookout and both channel deliverers) is killed together at each
# point ("lookout+hook+pull"), and the per-order reference's two kinds together, to keep the
# suite short; the recorded matrix (FAULTS_SCALE=full) kills each kind alone.
KINDS = (["engine", "aggregator", "books", "lookout", "hook", "pull", "tracer"] if FULL
         else ["engine", "aggregator+books", "lookout+hook+pull", "tracer"])
PER_ORDER_KINDS = {"aggregator", "books"}
ENGINE_ENV = {"ALDEBARAN_QUEUE_TYPE": "quorum", "ALDEBARAN_ENGINE__LEASE_SECONDS": "1"}
# Cases that record traces and audit them (a Spark audit costs ~30 s on a quiet 2-core box,
# minutes under load: CI audits one run).
TRACED = {"tracer", "aggregator"} if FULL else {"tracer"}
CHANNELS = ["hook", "pull"]
LABELS = {"engine": "SIGKILL engine (default mode, quorum queues)",
          "tracer": "SIGKILL tracer (torn write at the 1st kill), then a fault-free tail; PySpark audit",
          "aggregator": "SIGKILL aggregator, tracer on; PySpark audit" if FULL else "SIGKILL aggregator"}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.spark) if k in TRACED else k for k in KINDS])
def test_sigkill_each_worker_kind_three_times(kind, fault_env, webhook, redis_prefix, vhost, tmp_path: Path,
                                               record, request: pytest.FixtureRequest) -> None:
    stream = fault_stream(ORDERS, seed=len(kind))
    # The tracer case's fault-free tail, published once the recorder marked its outage.
    tail = fault_stream(max(20, ORDERS // 3), seed=99, prefix="t") if kind == "tracer" else None
    expected = stream.expected | (tail.expected if tail else set())
    events = len(stream.events) + (len(tail.events) if tail else 0)
    targets = kind.split("+")
    per_order = bool(PER_ORDER_KINDS & set(targets))
    traced = kind in TRACED
    env = dict(fault_env, ALDEBARAN_MODE="per-order") if per_order else dict(fault_env, **ENGINE_ENV)
    roles = ("aggregator", "books") if per_order else ("engine",)
    fleet = Fleet(env, tmp_path / "logs", kinds=(*roles, "lookout", "hook", "pull", *(("tracer",) if traced else ())))
    traces = Path(env["ALDEBARAN_TRACES_DIR"])
    killed_at: list[int] = []  # epoch ms of each tracer kill
    torn_bytes = 0
    log_mark = [0]  # size of the tracer's log when its latest process started
    fleet.start_all()
    publisher = RetryingPublisher(vhost.amqp_url)
    try:
        def kill_tracer() -> None:
            nonlocal torn_bytes
            fleet.wait_ready("tracer")
            pid = fleet.processes["tracer"].pid
            fleet.kill("tracer")
            killed_at.append(int(time.time() * 1000))
            if len(killed_at) == 1:  # as if the kill landed in the middle of a write
                part = tr.newest_part(traces, f"{socket.gethostname()}-{pid}")
                assert part is not None, "the killed recorder wrote no part file"
                torn_bytes = tr.tear(part, redelivered=False)
            log_mark[0] = fleet.log_path("tracer").stat().st_size
            fleet.start("tracer", wait=False)

        def bounce() -> None:
            for target in targets:
                if target == "tracer":
                    kill_tracer()
                else:
                    fleet.bounce(target)

        publisher.publish_stream(stream.events, at={p: bounce for p in POINTS})
        for target in targets:
            fleet.wait_ready(target)
        if tail is not None:
            wait_outage_marked(fleet, log_mark[0])
            publisher.publish_stream(tail.events)
        reports = wait_for_sinks(expected, {
            "webhook": webhook.deliveries,
            "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix),
        }, timeout=120 + events / 50 + BOOK_TTL_SECONDS,
            in_doubt={"webhook": lambda: in_doubt_ids(redis_url(), redis_prefix)})
        if traced:  # everything the firehose carried is on disk (the graceful stop writes no more)
            wait_traced(publisher.publish_raw, traces)
        alive = fleet.alive()
        queue_types = {name: q.get("type") for name, q in vhost.queues().items()}
    finally:
        publisher.close()
        codes = fleet.stop_all()
    kills = fleet.kills.get(targets[0], 0)
    print(f"\nSIGKILL {kind} x{kills}: {events} events, {stream.orders + (tail.orders if tail else 0)} orders")
    print(describe(reports.values()))
    extra: dict = {}
    failure: AssertionError | None = None  # of the traces or the audit; raised after the row is recorded
    if traced:
        try:
            all_events = stream.events + (tail.events if tail else [])
            records = check_traces(kind, traces, all_events, expected, killed_at, torn_bytes, fleet)
            extra["trace_records"] = len(records)
            if kind == "tracer":
                # And a recorder killed mid-write that is never restarted: its torn tail stays.
                final = tr.newest_part(traces, f"{socket.gethostname()}-{fleet.processes['tracer'].pid}")
                assert final is not None
                tr.tear(final, redelivered=True)
            code, info = tr.run_audit(request.getfixturevalue("spark"), traces, tmp_path / "audit",
                                      BOOK_TTL_SECONDS, CHANNELS)
            print(f"audit: exit {code}, {info['verdict']}, counts {json.dumps(info['counts'])}, "
                  f"unaudited {json.dumps(info['unaudited_windows'])}")
            extra["audit"] = {"verdict": info["verdict"], "exit": code,
                              "unaudited_windows": info["unaudited_windows"], **info["counts"]}
            judged = check_audit(kind, info, code, expected, tail.expected if tail else set(), killed_at,
                                 request.getfixturevalue("spark"), tmp_path / "audit")
            extra["audit"]["checked_ok"] = judged  # alerts whose `ok` verdict the test checked
        except AssertionError as exc:
            failure = exc
            extra["failure"] = str(exc)[:500]
    record(LABELS.get(kind, f"SIGKILL {kind}"), kills, events, reports,
           f"FAULTS_SCALE=full .venv/bin/python -m pytest -m faults -q -s "
           f"'tests/faults/test_kill.py::test_sigkill_each_worker_kind_three_times[{kind}]'", **extra)
    assert all(fleet.kills[target] == len(POINTS) for target in targets), fleet.kills
    assert all(code is None for code in alive.values()), alive
    assert all(r.ok for r in reports.values()), describe(reports.values()) + "\n" + fleet.tail(targets[0])
    # The webhook is at-most-once with one send in flight: a kill of its deliverer leaves at most one
    # attempt in doubt, and nothing else may (docs/delivery.md).
    assert len(reports["webhook"].in_doubt) <= fleet.kills.get("hook", 0), reports["webhook"].in_doubt
    assert not reports["queue-api"].in_doubt
    assert all(code == 0 for code in codes.values()), (codes, fleet.all_logs()[-5000:])
    if not per_order:  # the run really was the engine on quorum queues
        durable = {"Aldebaran.Trade_Data", "Aldebaran.Alert", "Aldebaran.Channel.hook", "Aldebaran.Channel.pull"}
        assert {queue_types.get(name) for name in durable} == {"quorum"}, queue_types
    if failure is not None:
        raise failure


def wait_outage_marked(fleet: Fleet, since: int, timeout: float = 120) -> None:
    """The latest recorder (its log starts at byte `since`) wrote its gap marker: it drained
    the backlog the kills left, so from now on its receive times are event times and the
    audit can judge what follows."""
    def marked() -> bool:
        with open(fleet.log_path("tracer"), "rb") as fh:
            fh.seek(since)
            return b'"event": "unrecorded window"' in fh.read()

    wait_until(marked, lambda: f"the restarted recorder to mark its gap:\n{fleet.tail('tracer')}", timeout, pause=0.2)


def check_traces(kind: str, traces: Path, events, expected: set[str], killed_at: list[int], torn_bytes: int,
                 fleet: Fleet) -> list[dict]:
    """What the recorder left on disk, read strictly (as zcat or Python's gzip would)."""
    torn = tr.torn_files(traces)
    assert not torn, f"part files with a torn tail after the run: {torn}"
    records = tr.read_strict(traces)
    missing = {e.id for e in events} - tr.traced_event_ids(records)
    assert not missing, f"{len(missing)} trade events never traced, e.g. {sorted(missing)[:5]}"
    alerts = tr.traced_alerts(records)
    assert alerts == {alert_id: 1 for alert_id in expected}, (
        sorted(expected - set(alerts))[:5], sorted(set(alerts) - expected)[:5],
        sorted((a, n) for a, n in alerts.items() if n > 1)[:5])
    for channel in CHANNELS:
        undelivered = expected - tr.traced_deliveries(records, channel)
        assert not undelivered, (channel, sorted(undelivered)[:5])
    gaps = tr.gaps(records)
    if kind == "tracer":
        # Each kill lies in a gap marker (a restart before the backlog drained extends the
        # open gap rather than starting a new one, so one marker may cover several kills).
        assert len(killed_at) == len(POINTS)
        assert all(tr.covered(at, gaps) for at in killed_at), (killed_at, gaps)
        log = fleet.log_path("tracer").read_text(errors="replace")
        cut = [json.loads(line) for line in log.splitlines() if "torn tail truncated" in line]
        # The restarted recorder cut the simulated torn write (and possibly a real one).
        assert any(c["cut_bytes"] >= torn_bytes for c in cut), (torn_bytes, cut)
        assert list((traces / "_state" / "torn").iterdir()), "the cut bytes are kept for forensics"
    else:
        assert not gaps, gaps
    again = sum(1 for r in records if r.get("trace_redelivered"))
    print(f"traces: {len(records)} records ({again} re-recorded after a kill) in "
          f"{len(tr.part_files(traces))} files, gaps {gaps}")
    return records


def check_audit(kind: str, info: dict, code: int, expected: set[str], judged: set[str], killed_at: list[int],
                spark, out: Path) -> int:
    """The audit's verdicts against the offline checker; returns how many alerts it judged ok."""
    counts = info["counts"]
    findings = {k: counts[k] for k in ("missed", "duplicate", "spurious", "channel_missed",
                                        "channel_duplicate", "channel_spurious")}
    assert not any(findings.values()), findings
    assert code == 0, info
    windows = tr.audit_windows(info)
    orders = {r["alert_id"]: r for r in spark.read.parquet(str(out / "orders.parquet"))
              .select("alert_id", "order_id", "n_publishes", "should_fire", "verdict").collect()}
    # Judged or not, every alert was traced as published once: the copies a killed recorder
    # wrote and its successors wrote again were recognised as one.
    published = {a: r["n_publishes"] for a, r in orders.items() if r["n_publishes"]}
    assert published == {a: 1 for a in expected}, \
        sorted((a, n) for a, n in published.items() if n != 1 or a not in expected)[:10]
    if kind == "tracer":
        # The recorder's outages are no verdict at all, never a false all-clear ...
        assert info["verdict"] == "unaudited", info["verdict"]
        assert all(tr.covered(at, windows) for at in killed_at), (killed_at, info["unaudited_windows"])
        # ... and what came after them is judged, and agrees with the offline checker.
        derived = {a for a, r in orders.items() if r["should_fire"] and (r["order_id"] or "").startswith("t")}
        assert derived == judged, (sorted(judged - derived)[:5], sorted(derived - judged)[:5])
        verdicts = {a: orders[a]["verdict"] for a in judged}
        assert judged and set(verdicts.values()) == {"ok"}, \
            sorted((a, v) for a, v in verdicts.items() if v != "ok")[:10]
        return len(judged)
    assert info["verdict"] == "clean" and not windows, info
    assert counts["expected_alerts"] == len(expected), counts
    assert counts.get("verdict_ok", 0) + counts.get("verdict_uncertain", 0) == len(expected), counts
    return counts.get("verdict_ok", 0)
