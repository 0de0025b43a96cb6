"""Pipeline time: the clock books are stamped and closed on, flowing only while the stream does. Pure.

A book lives `book_ttl` seconds from its first event. Measured on the wall clock, an
outage (a broker restart, a crashed engine) would age every open book while its events
wait in the broker, and the first ones redelivered after it would be judged late: a
request would look like an orphan. Pipeline time stops while the engine cannot consume
(`pause`/`resume`) and restarts, after a crash, from the last stamp it recorded, so an
outage adds nothing to any book's age. Stamps are milliseconds and never go back.

Both modes use it: the engine stamps its cycles; in the per-order mode each aggregator
stamps the events it routes, and `StampsInFlight` gives the watermark the books close on.
"""

from __future__ import annotations


class PipelineClock:
    """Milliseconds of pipeline time, from a monotonic clock the caller passes in."""

    def __init__(self, start_ms: int, monotonic: float) -> None:
        self._offset_ms = start_ms - int(monotonic * 1000)
        self._last = start_ms
        self._paused_at: float | None = None

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def stamp(self, monotonic: float) -> int:
        """Now in pipeline time (ms): the ingest stamp of what is consumed now."""
        if self._paused_at is not None:
            return self._last
        now = self._offset_ms + int(monotonic * 1000)
        if now > self._last:
            self._last = now
        return self._last

    def pause(self, monotonic: float) -> None:
        """The stream stopped (connection lost): pipeline time stands still until `resume`."""
        if self._paused_at is None:
            self.stamp(monotonic)
            self._paused_at = monotonic

    def resume(self, monotonic: float) -> None:
        """The stream flows again: the pause is cut out of pipeline time."""
        if self._paused_at is not None:
            self._offset_ms -= int((monotonic - self._paused_at) * 1000)
            self._paused_at = None


class StampsInFlight:
    """Stamps handed out and not yet settled (published and confirmed, or failed).

    The per-order aggregator's watermark: every event stamped before it is in its book
    queue. A stamp is in flight from the moment an event gets it until its publish is
    confirmed; events not stamped yet will get a stamp at least the clock's current one.
    """

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def __len__(self) -> int:
        return sum(self._counts.values())

    def add(self, stamp: int) -> None:
        self._counts[stamp] = self._counts.get(stamp, 0) + 1

    def settle(self, stamp: int) -> None:
        left = self._counts.get(stamp, 0) - 1
        if left > 0:
            self._counts[stamp] = left
        else:
            self._counts.pop(stamp, None)

    def watermark(self, now_stamp: int) -> int:
        """Pipeline time before which every stamped event is settled (ms)."""
        return min(self._counts) - 1 if self._counts else now_stamp
