"""A segmented set behaves as one set (hypothesis against the builtin), its keys spread out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aldebaran.core.segments import MASK, SegmentedSet

keys = st.text(max_size=6) | st.integers()


@given(st.lists(st.tuples(st.booleans(), st.lists(keys, max_size=8)), max_size=60))
def test_a_segmented_set_is_a_set(batches: list[tuple[bool, list[object]]]) -> None:
    segmented: SegmentedSet[object] = SegmentedSet()
    model: set[object] = set()
    for adding, batch in batches:
        if adding:
            segmented.update(batch)
            model.update(batch)
        else:
            segmented.difference_update(batch)
            model.difference_update(batch)
        assert all((key in segmented) == (key in model) for key in batch)
        assert segmented.absent(batch) == [key for key in batch if key not in model]
    assert len(segmented) == len(model) and set(segmented) == model


def test_keys_are_spread_over_the_tables_so_no_one_table_holds_most_of_them() -> None:
    segmented: SegmentedSet[str] = SegmentedSet()
    segmented.update(f"order-{n}" for n in range(100_000))
    per_table = 100_000 / (MASK + 1)
    assert max(map(len, segmented.tables)) < 2 * per_table
    assert len(segmented) == 100_000
