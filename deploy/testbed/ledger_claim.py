"""What an at-most-once deliverer's ledger costs its own process per alert: one claim and one
settle per chunk of 128 alerts, on the local Redis, as the `amqp` channel of the bench runs them.

Prints the client CPU per alert and the reply parser redis-py chose (hiredis when it is
installed: `pip uninstall hiredis` for the other side of a pair). Redis's own CPU is not counted.

    .venv/bin/python deploy/testbed/ledger_claim.py [rounds, default 1500]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.bench.environment import Place
from aldebaran.channels.ledger import DeliveryLedger
from aldebaran.io.redis import Keys, connect
from aldebaran.settings import Settings

CHUNK = 128


async def main(rounds: int) -> None:
    with Place(Settings()) as place:  # its key prefix, dropped at the end
        redis = await connect(place.settings())
        ledger = DeliveryLedger(redis, Keys(place.prefix), "bus", 600, "bench:1")
        batches = [[(f"over_purchase:order-{n}-{i}", "") for i in range(CHUNK)] for n in range(rounds)]
        connection = await redis.connection_pool.get_connection()
        parser = type(connection._parser).__name__
        await redis.connection_pool.release(connection)
        try:
            started = time.process_time()
            for ids in batches:
                claimed = await ledger.claim(ids, record_attempt=True)
                await ledger.settle(ids, attempt=claimed.attempt)
            spent = time.process_time() - started
        finally:
            await redis.aclose()
    print(f"{rounds * CHUNK:,} alerts in chunks of {CHUNK}, {parser}: "
          f"{spent / (rounds * CHUNK) * 1e6:.2f} µs of client CPU per alert (claim + settle)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500))
