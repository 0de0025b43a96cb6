"""What Redis holds of an engine's done markers, modelled in memory: the compaction's Lua step
(a hash of groups by seq, replaced on a rewrite) for the pure tests."""

from __future__ import annotations

from aldebaran.core.engine import Compaction, Engine
from aldebaran.core.wal import DoneImage, encode_group, image_of


class StoredDone:
    def __init__(self) -> None:
        self.groups: dict[int, bytes] = {}
        self.clock_ms = 0

    def compact(self, engine: Engine) -> Compaction:
        """Take the engine's compaction, store it as the script does, and tell the engine."""
        compaction = engine.compaction()
        done = compaction.done
        if done.rewrite:
            self.groups.clear()
        self.groups.update({group.seq: encode_group(group) for group in done.changed})
        for seq in done.dropped:
            self.groups.pop(seq, None)
        self.clock_ms = compaction.clock_ms
        engine.compacted(compaction)
        return compaction

    def image(self) -> DoneImage:
        return image_of(self.clock_ms, self.groups.values())
