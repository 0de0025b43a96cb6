"""`read_alerts`: a batch read in two C passes gives what reading it alert by alert gives.

The reference below is how the lookout and the deliverers read a message before the fast
path: split the message (CONTRACT §3), then `Alert.parse` each part, its reason kept.
"""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from aldebaran.channels.base import Alert, UnreadableAlert, read_alerts
from aldebaran.io.alert_bus import split_alerts


def _reference(body: bytes, message_id: str | None) -> tuple[list[Alert], list[tuple[bytes, str]]]:
    try:
        parts = split_alerts(body)
    except (msgspec.DecodeError, ValueError) as exc:
        return [], [(body, f"unreadable alert: not JSON: {exc}")]
    alerts, unreadable = [], []
    for raw in parts:
        try:
            alerts.append(Alert.parse(raw, message_id if len(parts) == 1 else None))
        except UnreadableAlert as exc:
            unreadable.append((raw, f"unreadable alert: {exc}"))
    return alerts, unreadable


_ids = st.one_of(
    st.text(max_size=8), st.text(min_size=60, max_size=70), st.just("é" * 64), st.just("x" * 256),
    st.integers(), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
_objects = st.fixed_dictionaries({}, optional={"alert_id": _ids, "kind": st.text(max_size=5),
                                               "purchase_ids": st.lists(st.text(max_size=3), max_size=2)})
_elements = st.one_of(_objects, _objects, _objects, st.integers(), st.text(max_size=4), st.lists(_objects, max_size=2))


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    shape = draw(st.sampled_from(["batch", "batch", "batch", "object", "junk", "cut"]))
    if shape == "object":
        return json.dumps(draw(_objects)).encode()
    if shape == "junk":
        return draw(st.binary(max_size=30))
    text = json.dumps(draw(st.lists(_elements, max_size=6)),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    body = (" " * draw(st.integers(0, 2)) + text).encode()
    return body[:draw(st.integers(0, len(body)))] if shape == "cut" else body


@settings(max_examples=400, deadline=None)
@given(_bodies(), st.one_of(st.none(), st.just("batch:1"), st.just("over_purchase:o1")))
def test_the_same_alerts_and_reasons_as_alert_by_alert(body: bytes, message_id: str | None) -> None:
    assert read_alerts(body, message_id) == _reference(body, message_id)


def test_a_batch_with_bad_elements_keeps_its_good_alerts() -> None:
    good = [{"alert_id": f"over_purchase:o{i}", "kind": "over_purchase"} for i in range(3)]
    body = json.dumps([good[0], 7, {"kind": "no id"}, good[1], {"alert_id": "x" * 256}, good[2]]).encode()
    alerts, unreadable = read_alerts(body, "batch:9")
    assert [a.alert_id for a in alerts] == ["over_purchase:o0", "over_purchase:o1", "over_purchase:o2"]
    assert [json.loads(a.body) for a in alerts] == good
    assert [reason for _, reason in unreadable] == [
        "unreadable alert: not a JSON object", "unreadable alert: no alert_id",
        "unreadable alert: alert_id over 255 bytes"]


def test_a_one_alert_batch_takes_the_message_id_and_a_longer_one_does_not() -> None:
    assert read_alerts(b'[{"kind": "k"}]', "over_purchase:o1")[0] == [Alert("over_purchase:o1", b'{"kind": "k"}')]
    alerts, unreadable = read_alerts(b'[{"kind": "k"}, {"alert_id": "a:1"}]', "batch:2")
    assert alerts == [Alert("a:1", b'{"alert_id": "a:1"}')]
    assert unreadable == [(b'{"kind": "k"}', "unreadable alert: no alert_id")]
