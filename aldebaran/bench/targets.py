"""The engine's targets (issue 17) judged from one bench run: met, or missed and by how much.

Every verdict comes from the run that printed the tables above it, never from an earlier one;
a target whose workload or system was not in the run says so. Latency verdicts carry the
broker's own floor from the same run, when `raw` was among the systems: a floor near the
target says more about the host than about the engine (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aldebaran.bench.drain import Drain
from aldebaran.bench.paced import Paced

EVENTS_PER_S = 250_000
JSON_EVENTS_PER_S = 150_000
JSON_VS_HANDWRITTEN = 0.6
JSON_VS_BYTEWAX = 1.5
ALERT_HEAVY_EVENTS_PER_S = 100_000
LAST_ALERT_S = 2.0
SUSTAINED_S = 60.0
PACED_EVENTS_PER_S = 100_000
BOOK_P99_MS = 5.0
ALERT_P99_MS = 25.0
MACHINE_US = 8.0
STEP_US = 3.0
HEADER = ("| target (issue 17) | measured in this run | verdict |\n"
          "|---|---|---|")
ABSENT = "not in this run"


@dataclass
class Results:
    """What one bench run measured, kept for judging: median runs per workload, paced medians."""

    drains: dict[str, list[Drain]] = field(default_factory=dict)  # workload key -> the median run of each system
    expected: dict[str, set[str]] = field(default_factory=dict)  # workload key -> the alert ids it must fire
    paced: dict[int, tuple[Paced | None, Paced | None]] = field(default_factory=dict)  # batch -> (floor, engine)
    step_us: tuple[float, float] | None = None  # the engine step alone: msgpack, JSON


def machine_us(run: Drain) -> float:
    """Machine CPU per event (µs): the system's own processes, RabbitMQ and Redis."""
    return sum(v for k, v in run.cpu_us_per_event().items() if k != "bench")


def alert_counts(run: Drain, expected: set[str]) -> tuple[int, int, int, int] | None:
    """Alerts at the tap against `expected`: ok, wrong, missing, repeated copies (None: none computed)."""
    if run.alerts is None:
        return None
    got = set(run.alerts)
    return (len(got & expected), len(got - expected), len(expected - got),
            sum(n - 1 for n in run.alerts.values() if n > 1))


def alerts_exact(run: Drain, expected: set[str]) -> bool:
    """Every expected alert once, nothing else (at the alert tap)."""
    counts = alert_counts(run, expected)
    return counts is not None and counts[1:] == (0, 0, 0)


def at_least(value: float | None, limit: float) -> str:
    if value is None:
        return ABSENT
    if value >= limit:
        return f"met ({value / limit:.2f}×)"
    return f"**missed** by {limit / value:.2f}×" if value > 0 else "**missed**"


def at_most(value: float | None, limit: float) -> str:
    if value is None:
        return ABSENT
    if value <= limit:
        return f"met ({limit / value:.2f}× under)" if value > 0 else "met"
    return f"**missed** by {value / limit:.2f}×"


def _system(runs: Sequence[Drain], prefix: str) -> Drain | None:
    return next((run for run in runs if run.name.startswith(prefix)), None)


def _rate(run: Drain | None) -> float | None:
    return run.rate if run is not None else None


def _with_alerts(verdict: str, exact: bool) -> str:
    """A throughput verdict is met only with every alert right."""
    if exact or verdict == ABSENT:
        return verdict
    if verdict.startswith("met"):
        return f"**missed**: the alerts were not exact (the rate {verdict})"
    return f"{verdict}; the alerts were not exact either"


def rows(results: Results) -> list[str]:
    """One row per target, in the issue's order."""
    out = _throughput(results) + _alert_heavy(results) + _paced(results) + _cpu(results)
    step = results.step_us
    out.append(_row(f"the engine step alone ≤ {STEP_US:g} µs of CPU per event",
                    f"{step[0]:.2f} µs (msgpack), {step[1]:.2f} µs (JSON)" if step else "–",
                    at_most(max(step) if step else None, STEP_US)))
    return out


def _row(target: str, measured: str, verdict: str) -> str:
    return f"| {target} | {measured} | {verdict} |"


def _throughput(results: Results) -> list[str]:
    msgpack, json = results.drains.get("msgpack", []), results.drains.get("json", [])
    engine, engine_json = _system(msgpack, "engine, 1 process"), _system(json, "engine, 1 process")
    hand, bytewax = _system(json, "hand-written"), _system(json, "Bytewax")
    out = [_row(f"≥ {EVENTS_PER_S:,} events/s, low-alert 1000-event msgpack, every alert right",
                f"{engine.rate:,.0f} events/s" if engine else "–",
                _with_alerts(at_least(_rate(engine), EVENTS_PER_S),
                             engine is not None and alerts_exact(engine, results.expected.get("msgpack", set()))))]
    sustained = _system(results.drains.get("sustained", []), "engine")
    if sustained is None:
        out.append(_row(f"the same sustained for {SUSTAINED_S:g} s", "–", ABSENT))
    else:
        verdict = _with_alerts(at_least(sustained.rate, EVENTS_PER_S),
                               alerts_exact(sustained, results.expected.get("sustained", set())))
        if sustained.seconds < SUSTAINED_S and verdict.startswith("met"):
            verdict = f"not judged: {sustained.seconds:.0f} s of draining, under {SUSTAINED_S:g}"
        out.append(_row(f"the same sustained for {SUSTAINED_S:g} s",
                        f"{sustained.rate:,.0f} events/s over {sustained.seconds:.0f} s", verdict))
    json_exact = engine_json is not None and alerts_exact(engine_json, results.expected.get("json", set()))
    out.append(_row(f"≥ {JSON_EVENTS_PER_S:,} events/s, 100-event JSON",
                    f"{engine_json.rate:,.0f} events/s" if engine_json else "–",
                    _with_alerts(at_least(_rate(engine_json), JSON_EVENTS_PER_S), json_exact)))
    for peer, ratio, label in ((hand, JSON_VS_HANDWRITTEN, "the hand-written consumer"),
                               (bytewax, JSON_VS_BYTEWAX, "Bytewax")):
        value = engine_json.rate / peer.rate if engine_json and peer and peer.rate else None
        out.append(_row(f"JSON: ≥ {ratio:g}× {label}", f"{value:.2f}×" if value is not None else "–",
                        at_least(value, ratio)))
    return out


def _alert_heavy(results: Results) -> list[str]:
    engine = _system(results.drains.get("alert-heavy", []), "engine, 1 process")
    exact = (engine is not None and engine.delivered_once is True
             and alerts_exact(engine, results.expected.get("alert-heavy", set())))
    delivered = ("every alert once at both channels" if exact else "alerts not exactly once at both channels")
    last = engine.last_alert_after if engine is not None else None
    return [
        _row(f"alert-heavy: ≥ {ALERT_HEAVY_EVENTS_PER_S:,} events/s, every alert once at a queue-api and an "
             "amqp channel", f"{engine.rate:,.0f} events/s; {delivered}" if engine else "–",
             _with_alerts(at_least(_rate(engine), ALERT_HEAVY_EVENTS_PER_S), exact)),
        _row(f"alert-heavy: the last alert out ≤ {LAST_ALERT_S:g} s after the last event",
             f"{last:.2f} s (the last over_purchase)" if last is not None else "–", at_most(last, LAST_ALERT_S)),
    ]


def _paced(results: Results) -> list[str]:
    out = []
    for batch in sorted(results.paced, reverse=True):
        floor, engine = results.paced[batch]
        floor_p99 = floor.latency.get("book", {}).get("p99") if floor else None
        floor_note = f"; the broker's floor p99 {floor_p99:.1f} ms" if floor_p99 is not None else ""
        for stage, limit, label in (("book", BOOK_P99_MS, "publish→book"), ("alert", ALERT_P99_MS, "publish→alert")):
            p99 = engine.latency.get(stage, {}).get("p99") if engine else None
            verdict = at_most(p99, limit)
            if engine is not None and engine.offered != PACED_EVENTS_PER_S and verdict != ABSENT:
                verdict = f"not judged: offered {engine.offered:,.0f} events/s, the target's load is " \
                          f"{PACED_EVENTS_PER_S:,}"
            out.append(_row(f"paced at {PACED_EVENTS_PER_S:,} events/s, {batch}-event messages: "
                            f"p99 {label} ≤ {limit:g} ms",
                            f"{p99:.1f} ms{floor_note if stage == 'book' else ''}" if p99 is not None else "–",
                            verdict))
    return out or [_row(f"paced: p99 publish→book ≤ {BOOK_P99_MS:g} ms, publish→alert ≤ {ALERT_P99_MS:g} ms",
                        "–", ABSENT)]


def _cpu(results: Results) -> list[str]:
    out = []
    for key, label in (("msgpack", "low-alert msgpack"), ("alert-heavy", "alert-heavy, with the lookout and channels")):
        engine = _system(results.drains.get(key, []), "engine, 1 process")
        value = machine_us(engine) if engine is not None and engine.events else None
        out.append(_row(f"≤ {MACHINE_US:g} µs of machine CPU per event ({label})",
                        f"{value:.2f} µs at {engine.rate:,.0f} events/s" if engine and value is not None else "–",
                        at_most(value, MACHINE_US)))
    return out
