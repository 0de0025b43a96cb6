"""A small TCP proxy for fault tests: sits between workers and a broker (or Redis).

It runs an asyncio loop in a background thread. `cut()` closes every open connection
at once (both sides see a reset, as when a link drops); `block()` / `unblock()` keep
new connections out for a while (a partition); `latency` delays every chunk in both
directions (a slow link), preserving order. An optional `ssl` context turns it into a
TLS terminator (clients speak TLS to the proxy, the proxy speaks plain TCP upstream).
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", *,
                 ssl: ssl_module.SSLContext | None = None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.ssl = ssl
        self.port = 0
        self.latency = 0.0
        self.cuts = 0
        self.connections_seen = 0
        self._blocked = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    # -- life -------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.ssl))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    # -- faults -----------------------------------------------------------------------
    def cut(self) -> int:
        """Drop every open connection now; returns how many were cut."""
        async def _cut() -> int:
            writers = list(self._writers)
            for writer in writers:
                transport = writer.transport
                transport.abort()
            self._writers.clear()
            return len(writers)
        count = self._call(_cut())
        self.cuts += count
        return count

    def block(self) -> None:
        """Refuse new connections (accepted then dropped at once) and cut the open ones."""
        self._blocked = True
        self.cut()

    def unblock(self) -> None:
        self._blocked = False

    @contextmanager
    def partitioned(self, seconds: float) -> Iterator[None]:
        self.block()
        try:
            time.sleep(seconds)
            yield
        finally:
            self.unblock()

    @property
    def open_connections(self) -> int:
        return len(self._writers) // 2

    # -- plumbing ---------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._blocked:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.connections_seen += 1
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Chunks go through a queue so that latency delays each one without reordering.
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def pump() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.transport.abort()

        sender = asyncio.ensure_future(pump())
        try:
            while True:
                try:
                    data = await reader.read(65536)
                except (OSError, ConnectionError):
                    data = b""
                await queue.put((time.monotonic() + self.latency, data))
                if not data:
                    break
            await sender
        except (OSError, ConnectionError):
            pass
        finally:
            sender.cancel()


@contextmanager
def tcp_proxy(upstream_port: int, upstream_host: str = "127.0.0.1", **options) -> Iterator[TcpProxy]:
    proxy = TcpProxy(upstream_port, upstream_host, **options).start()
    try:
        yield proxy
    finally:
        proxy.close()
