"""The alert-heavy bench's delivery side: the lookout and two channels, counted where alerts land.

A queue-api channel (the pull queue, exactly once by alert id) and an amqp channel (one
message per alert into a `downstream` queue of the same vhost; at most once, with 256
sends in flight, so a crash could leave up to 256 in doubt) run as their own
`aldebaran run` processes; the bench waits until both hold every alert the engine put
on `Aldebaran.Alert` and checks that each holds it once.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiormq

from aldebaran.api.pullqueue import PullQueue, Received
from aldebaran.bench.environment import Place
from aldebaran.io.redis import Keys
from aldebaran.io.redis import client as redis_client

DOWNSTREAM = "downstream"
PULL_QUEUE = "alerts"
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

    async def start(self) -> None:
        connection = await aiormq.connect(self.place.amqp_url)
        channel = await connection.channel()
        await channel.queue_declare(DOWNSTREAM, durable=True)
        await connection.close()
        for args in (["lookout"], ["channel", "pull"], ["channel", "bus"]):
            # The child writes through its own copy of the descriptor; ours closes after the start.
            with open(self.workdir / f"{'-'.join(args)}-{self.place.vhost}.log", "wb") as log:
                process = await asyncio.create_subprocess_exec(sys.executable, "-m", "aldebaran.cli", "run", *args,
                                                               env=self.env, stdout=log, stderr=log)
            self.processes.append(process)
            self.pids.append(process.pid)

    async def wait_landed(self, expected: set[str], timeout: float) -> float:
        """When both channels held every alert in `expected` (monotonic), or the timeout."""
        settings = self.place.settings()
        redis = redis_client(settings)
        pull = PullQueue(redis, Keys(settings.redis_key_prefix), PULL_QUEUE, checkout_lifetime_seconds=600,
                         max_receive_count=10)
        connection = await aiormq.connect(self.place.amqp_url)
        channel = await connection.channel()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self._read_pull(await pull.receive(1000))
                while (message := await channel.basic_get(DOWNSTREAM, no_ack=True)).delivery_tag is not None:
                    self.copies["bus"] += 1
                    self.landed["bus"].add(message.header.properties.message_id or "")
                if expected <= self.landed["pull"] and expected <= self.landed["bus"]:
                    return time.monotonic()
                await asyncio.sleep(0.05)
            return time.monotonic()
        finally:
            await connection.close()
            await redis.aclose()

    def _read_pull(self, received: list[Received]) -> None:
        import json

        for message in received:
            self.copies["pull"] += 1
            self.landed["pull"].add(json.loads(message.message)["alert_id"])

    def summary(self, expected: set[str]) -> str:
        parts = []
        for name, label in (("pull", "queue-api"), ("bus", "amqp")):
            got = self.landed[name]
            parts.append(f"{label}: {len(got & expected):,}/{len(expected):,} alerts, "
                         f"{self.copies[name] - len(got):,} repeated")
        return "; ".join(parts)

    async def stop(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                process.terminate()
        for process in self.processes:
            await process.wait()
