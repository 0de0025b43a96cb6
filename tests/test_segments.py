"""A segmented set and dict behave as one set and one dict (hypothesis against the builtins), their keys spread out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aldebaran.core.segments import MASK, SegmentedDict, SegmentedSet

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


@given(st.lists(st.tuples(st.sampled_from(["set", "pop", "del"]), keys, st.integers()), max_size=80))
def test_a_segmented_dict_is_a_dict(steps: list[tuple[str, object, int]]) -> None:
    segmented: SegmentedDict[object, int] = SegmentedDict()
    model: dict[object, int] = {}
    for action, key, value in steps:
        if action == "set":
            segmented[key] = value
            model[key] = value
        elif action == "pop":
            assert segmented.pop(key, None) == model.pop(key, None)
        elif key in model:
            del segmented[key]
            del model[key]
        assert (key in segmented) == (key in model)
        assert segmented.get(key) == model.get(key)
        # a hot loop's own probe finds what the mapping methods put there
        assert segmented.tables[hash(key) & MASK].get(key) == model.get(key)
    assert len(segmented) == len(model) and dict(segmented.items()) == model
