"""The keys of closed books, remembered so their late events change nothing. Pure.

The engine closes thousands of books a second under load and must remember each for
`engine.done_retention_seconds` of pipeline time, so the store is what bounds the
engine's memory. It keeps one set of key strings per application (the string the book
already held: no tuple, no float, no heap entry per key; split into small tables,
`aldebaran.core.segments`, so no rebuild of millions of keys stalls a cycle) and the keys in groups that
expire together, oldest first. A cap bounds it whatever the order rate: past it the
oldest keys are forgotten before their expiry and counted, so the effective retention
shrinks visibly instead of the memory growing. A forgotten key's very late event opens a
fresh book, exactly as after the retention (docs/engine.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from aldebaran.core.segments import SegmentedSet


class DoneGroup(msgspec.Struct, array_like=True, gc=False):
    """Keys of one application closed together, forgotten together: one array, not one per key."""

    app: str
    expires_at: float
    keys: list[str]
    seq: int = 0  # creation order in this process: what a stored copy of the group is filed under


class DoneDelta(msgspec.Struct, gc=False):
    """What changed since the last stored copy: groups new or changed, groups gone. With
    `rewrite`, `changed` is every group and the stored copy is replaced (after a restore).
    `generation` tells the changes it holds from those made while it was being stored."""

    rewrite: bool
    changed: list[DoneGroup]
    dropped: list[int]
    generation: int = 0

# Keys closed within this many seconds of their group's first key share it (expiring up to this late).
GROUP_SECONDS = 1.0


class DoneMarkers:
    """Closed (app, key)s with their expiry, in expiry order; at most `cap` of them."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.evicted = 0  # keys forgotten before their expiry because of the cap (cumulative)
        self._evicted_taken = 0
        self._keys: dict[str, SegmentedSet[str]] = {}
        self._groups: deque[DoneGroup] = deque()  # oldest expiry first; the last one may grow
        self._count = 0
        # What a compaction must store (`delta`): only what changed, not every marker each time.
        # A delta is stored while the cycles go on, so each change is filed under the generation
        # of the next delta (seq -> generation): a group that grows again meanwhile stays changed.
        self._seq = 0
        self._generation = 0
        self._changed: dict[int, int] = {}
        self._dropped: set[int] = set()
        self._rewrite = True  # nothing stored by this process yet
        self._last_start = 0.0  # the first expiry of the newest group

    def __len__(self) -> int:
        return self._count

    def __contains__(self, bid: tuple[str, str]) -> bool:
        keys = self._keys.get(bid[0])
        return keys is not None and bid[1] in keys

    def of(self, app: str) -> SegmentedSet[str]:
        """The live set of `app`'s done keys, for a hot loop's membership tests (do not modify)."""
        keys = self._keys.get(app)
        if keys is None:
            keys = self._keys[app] = SegmentedSet()
        return keys

    def add(self, app: str, keys: list[str], expires_at: float) -> None:
        """Remember `keys` (not already done) until `expires_at`; expiries must not go back."""
        if not keys:
            return
        self.of(app).update(keys)
        last = self._groups[-1] if self._groups else None
        # Measured from the group's first expiry, not its latest: under steady closing a group
        # compared with its latest would grow forever and never expire (nor stop being rewritten).
        if last is not None and last.app == app and expires_at - self._last_start < GROUP_SECONDS \
                and last.expires_at <= expires_at:
            last.keys.extend(keys)
            last.expires_at = expires_at
            self._changed[last.seq] = self._generation
        else:
            self._seq += 1
            self._last_start = expires_at
            self._groups.append(DoneGroup(app, expires_at, list(keys), self._seq))
            self._changed[self._seq] = self._generation
        self._count += len(keys)
        if self._count > self.cap:
            self._forget(self._count - self.cap)

    def expire(self, now_ts: float) -> None:
        """Forget every key whose expiry is at or before `now_ts`."""
        groups = self._groups
        while groups and groups[0].expires_at <= now_ts:
            group = groups.popleft()
            self._keys[group.app].difference_update(group.keys)
            self._count -= len(group.keys)
            self._gone(group)

    def next_expiry(self) -> float | None:
        """When the oldest group expires (epoch s), or None when no key is remembered."""
        return self._groups[0].expires_at if self._groups else None

    @property
    def remembered_seconds(self) -> float:
        """How far back late events are still recognised: the retention, or less past the cap."""
        return self._groups[-1].expires_at - self._groups[0].expires_at if self._groups else 0.0

    def take_evicted(self) -> int:
        """Keys the cap forgot since the last take (for a counter: this store's own tally)."""
        fresh, self._evicted_taken = self.evicted - self._evicted_taken, self.evicted
        return fresh

    def groups(self) -> list[DoneGroup]:
        """Every group, oldest first (for a snapshot: encoded as they are, no copy per key)."""
        return list(self._groups)

    def delta(self) -> DoneDelta:
        """What to store now, as it stands (encode it before the markers change again; `written`
        once it is stored). Changes made from now on belong to the next delta."""
        generation = self._generation
        self._generation += 1
        if self._rewrite:
            return DoneDelta(True, list(self._groups), [], generation)
        changed = [group for group in self._groups if group.seq in self._changed]
        return DoneDelta(False, changed, sorted(self._dropped), generation)

    def written(self, delta: DoneDelta) -> None:
        """`delta` is stored: later deltas leave out what it held, not what changed since."""
        if delta.rewrite:
            self._rewrite = False
        self._changed = {seq: made for seq, made in self._changed.items() if made > delta.generation}
        self._dropped.difference_update(delta.dropped)

    def restore(self, groups: Iterable[DoneGroup], now_ts: float) -> None:
        """Add groups read back from images, in the order written; expired ones are skipped.
        They are regrouped here, so the next delta rewrites the stored copy."""
        for group in groups:
            if group.expires_at > now_ts:
                self.add(group.app, self.of(group.app).absent(group.keys), group.expires_at)
        self._rewrite = True

    def _gone(self, group: DoneGroup) -> None:
        self._changed.pop(group.seq, None)
        self._dropped.add(group.seq)

    def _forget(self, excess: int) -> None:
        groups = self._groups
        self.evicted += excess
        while excess and groups:
            group = groups[0]
            if len(group.keys) <= excess:
                groups.popleft()
                forgotten = group.keys
                self._gone(group)
            else:
                forgotten = group.keys[:excess]
                del group.keys[:excess]
                self._changed[group.seq] = self._generation
            self._keys[group.app].difference_update(forgotten)
            self._count -= len(forgotten)
            excess -= len(forgotten)
