"""How many open books one book-manager process holds (iteration-5 per-order mode).

Runs `aldebaran up --no-tracer` in a throwaway vhost with a long book lifetime, publishes
N purchase requests (no purchases: every book stays open), and samples the process's
`aldebaran_books_open` gauge and RSS until all N books are open.

    .venv/bin/python deploy/testbed/open_books.py 10000
"""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aldebaran.trades.events import PurchaseRequest
from tests.support import pipeline, services


def main(books: int) -> None:
    vhost, prefix = services.create_vhost("openbooks"), services.redis_prefix()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(ALDEBARAN_AMQP_URL=vhost.amqp_url, ALDEBARAN_REDIS_KEY_PREFIX=prefix, ALDEBARAN_LOG_FORMAT="json",
               ALDEBARAN_BOOK_TTL_SECONDS="900", ALDEBARAN_PER_ORDER__MAX_OPEN_BOOKS=str(books + 1000))
    try:
        pipeline.declare(env)
        broker = pipeline.Broker(vhost.amqp_url)
        up = pipeline.Pipeline(env, Path("/tmp/open_books.log"), "--metrics-port", str(port)).start()
        started = time.time()
        broker.publish([PurchaseRequest(f"r{i}", 100, "c", "s") for i in range(books)], batch=100)
        open_books, rss = 0, 0.0
        while time.time() - started < 600 and open_books < books:
            time.sleep(5)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            open_books = int(float(next(line.split()[1] for line in text.splitlines()
                                        if line.startswith("aldebaran_books_open "))))
            rss = psutil.Process(up.process.pid).memory_info().rss / 2**20
            print(f"{time.time() - started:6.1f} s  open books {open_books:7,d}  RSS {rss:7.1f} MiB", flush=True)
        print(f"one process held {open_books:,} open books at {rss:.0f} MiB RSS "
              f"({time.time() - started:.0f} s to open them, load {os.getloadavg()[0]:.1f})")
        up.stop()
        broker.close()
    finally:
        services.delete_vhost(vhost)
        services.clean_redis(prefix)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
