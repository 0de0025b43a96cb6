"""The alert-heavy bench's delivery side: the lookout and two channels, counted where alerts land.

A queue-api channel (the pull queue, exactly once by alert id) and an amqp channel (one
message per alert into a `downstream` queue of the same vhost; at most once, with 256
sends in flight, so a crash could leave up to 256 in doubt) run as their own
`aldebaran run` processes; the bench waits until both hold every alert the engine put
on `Aldebaran.Alert` and checks that each holds it once. Both sinks are read while the run
goes on (the pull queue followed, not consumed; the downstream queue drained by a recipient
process of its own, `aldebaran/bench/downstream_reader.py`), so "last alert after last event"
is when the last alert arrived at a recipient.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import msgspec

from aldebaran.api.pullqueue import PullQueue
from aldebaran.bench.environment import Place, start_worker, stop_process
from aldebaran.io.redis import Keys
from aldebaran.io.redis import client as redis_client

DOWNSTREAM = "downstream"
PULL_QUEUE = "alerts"
READER_STOP_SECONDS = 5.0
CONFIG = f"""
[[channels]]
name = "pull"
kind = "queue-api"
queue = "{PULL_QUEUE}"

[[channels]]
name = "bus"
kind = "amqp"
routing_key = "{DOWNSTREAM}"
delivery = "at-most-once"
max_in_flight = 256
"""


class PulledAlert(msgspec.Struct):
    alert_id: str


class Landed(msgspec.Struct):
    """One report of the downstream recipient process (`downstream_reader`)."""

    new: list[tuple[str, float]]
    copies: int


class Delivery:
    """Lookout + channel processes for one place; `pids` for the CPU meter."""

    def __init__(self, place: Place, workdir: Path, env: dict[str, str]) -> None:
        self.place = place
        config = workdir / f"channels-{place.vhost}.toml"
        config.write_text(CONFIG)
        self.env = dict(env, ALDEBARAN_CONFIG=str(config))
        self.workdir = workdir
        self.processes: list[asyncio.subprocess.Process] = []
        self.pids: list[int] = []
        self.landed: dict[str, set[str]] = {"pull": set(), "bus": set()}
        self.copies = {"pull": 0, "bus": 0}
        self.last_new = {"pull": 0.0, "bus": 0.0}
        self.last_of_kind: dict[str, float] = {}  # alert kind -> when its last new alert landed anywhere
        self.readers: list[asyncio.Task[None]] = []
        self.recipient: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start the lookout and both channels, and read both sinks from now on: an alert's
        landing time is when it arrived, not when the bench got round to looking."""
        self.recipient = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aldebaran.bench.downstream_reader", self.place.amqp_url, DOWNSTREAM,
            stdout=asyncio.subprocess.PIPE)
        assert self.recipient.stdout is not None
        await self.recipient.stdout.readline()  # it consumes
        self.readers = [asyncio.create_task(self._read_bus(self.recipient.stdout)),
                        asyncio.create_task(self._read_pull())]
        for args in (["lookout"], ["channel", "pull"], ["channel", "bus"]):
            process = await start_worker(args, self.workdir / f"{'-'.join(args)}-{self.place.vhost}.log", self.env)
            self.processes.append(process)
            self.pids.append(process.pid)

    async def wait_landed(self, expected: set[str], timeout: float) -> float:
        """When the last alert of `expected` landed in the later of the two channels (monotonic);
        the time of the timeout when one never got them all."""
        deadline = time.monotonic() + timeout
        while True:
            if expected <= self.landed["pull"] and expected <= self.landed["bus"]:
                break
            for reader in self.readers:
                if reader.done():
                    reader.result()  # a reader failed: say why
            if time.monotonic() >= deadline:
                return time.monotonic()
            await asyncio.sleep(0.05)
        return max(self.last_new.values())

    async def _read_bus(self, lines: asyncio.StreamReader) -> None:
        """What the recipient process reports: each alert id when it first landed, and the repeats."""
        decode = msgspec.json.Decoder(Landed).decode
        while line := await lines.readline():
            report = decode(line)
            for alert_id, at in report.new:
                self._land("bus", alert_id, at)
            self.copies["bus"] += report.copies
        raise RuntimeError("the downstream recipient process ended")

    def _land(self, name: str, alert_id: str, at: float) -> None:
        self.copies[name] += 1
        if alert_id not in self.landed[name]:
            self.landed[name].add(alert_id)
            self.last_new[name] = max(at, self.last_new[name])
            kind = alert_id.partition(":")[0]
            self.last_of_kind[kind] = max(at, self.last_of_kind.get(kind, 0.0))

    async def _read_pull(self) -> None:
        """Follow the pull queue's ready list without checking messages out: a recipient's
        receives and deletes are its own work, not the pipeline's (nobody else consumes it here)."""
        settings = self.place.settings()
        redis = redis_client(settings)
        pull = PullQueue(redis, Keys(settings.redis_key_prefix), PULL_QUEUE, checkout_lifetime_seconds=600,
                         max_receive_count=10)
        decode = msgspec.json.Decoder(PulledAlert).decode
        seen = 0
        try:
            while True:
                messages = await pull.peek(seen, 5000)
                at = time.monotonic()
                for message in messages:
                    self._land("pull", decode(message).alert_id, at)
                seen += len(messages)
                if not messages:
                    await asyncio.sleep(0.02)
        finally:
            await redis.aclose()

    def once(self, expected: set[str]) -> bool:
        """Every alert of `expected` landed at both channels, none twice, nothing else."""
        return all(self.landed[name] == expected and self.copies[name] == len(expected) for name in self.landed)

    def summary(self, expected: set[str]) -> str:
        parts = []
        for name, label in (("pull", "queue-api"), ("bus", "amqp")):
            got = self.landed[name]
            parts.append(f"{label}: {len(got & expected):,}/{len(expected):,} alerts, "
                         f"{self.copies[name] - len(got):,} repeated")
        return "; ".join(parts)

    async def stop(self) -> None:
        """Stop the readers, then the processes. A reader that does not end within
        `READER_STOP_SECONDS` of its cancel (a client's close waiting on a socket) is left behind:
        it must not keep the lookout and channels running, nor hang the bench."""
        try:
            for reader in self.readers:
                reader.cancel()
            if self.readers:
                _, stuck = await asyncio.wait(self.readers, timeout=READER_STOP_SECONDS)
                if stuck:
                    print(f"    {len(stuck)} sink reader(s) did not stop; left behind", file=sys.stderr, flush=True)
        finally:
            recipient = [self.recipient] if self.recipient is not None else []
            await asyncio.gather(*(stop_process(process) for process in [*self.processes, *recipient]))
