"""The pull queue's message keys: random version-4 UUIDs in their canonical text."""

from __future__ import annotations

import uuid

from aldebaran.api.pullqueue import new_keys


def test_every_key_is_a_canonical_version_4_uuid_and_none_repeats() -> None:
    keys = new_keys(5000)
    assert len(keys) == 5000 == len(set(keys))
    for key in keys:
        parsed = uuid.UUID(key)
        assert str(parsed) == key
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert new_keys(0) == []


def test_the_random_bits_vary_at_every_position() -> None:
    """No hex digit but the version's is fixed (a slicing slip would pin or shift some)."""
    keys = new_keys(2000)
    fixed = [i for i in range(36) if len({key[i] for key in keys}) == 1]
    assert fixed == [8, 13, 14, 18, 23]  # four dashes and the version digit
    assert {key[19] for key in keys} == set("89ab")  # the variant's two bits, the rest random
