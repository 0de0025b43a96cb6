"""The aiormq methods the three AMQP shortcuts stand on, checked by their source."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from aldebaran.io import aiormq_sources


def test_this_aiormq_is_the_one_every_shortcut_was_written_against() -> None:
    """Fails on an aiormq release whose methods differ: read its changes, then the shortcuts."""
    assert {name: aiormq_sources.digest(name) for name in aiormq_sources.KNOWN} == aiormq_sources.KNOWN


def test_a_changed_method_turns_its_shortcut_off_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiormq_sources, "_warned", set())
    monkeypatch.setitem(aiormq_sources.KNOWN, "Channel._read_content", "0" * 16)
    names = ("Channel._on_deliver_frame", "Channel._read_content")
    with capture_logs() as logs:
        assert not aiormq_sources.known("inline_consumer", names)
        assert not aiormq_sources.known("inline_consumer", names)
        assert aiormq_sources.known("publish_many", ("Channel.basic_publish",))
    assert [(entry["log_level"], entry["shortcut"], entry["changed"]) for entry in logs] == [
        ("warning", "inline_consumer", ["Channel._read_content"])]


def test_a_method_aiormq_no_longer_has_is_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    class Release:  # a Channel without the private readers inline_consumer calls
        async def _on_deliver_frame(self) -> None: ...

    monkeypatch.setitem(aiormq_sources._CLASSES, "Channel", Release)
    monkeypatch.setattr(aiormq_sources, "_warned", set())
    aiormq_sources.digest.cache_clear()
    try:
        assert aiormq_sources.digest("Channel.__get_content_header") == ""
        with capture_logs() as logs:
            assert not aiormq_sources.known("inline_consumer", ("Channel.__get_content_header",))
        assert [entry["changed"] for entry in logs] == [["Channel.__get_content_header"]]
    finally:
        aiormq_sources.digest.cache_clear()  # the real aiormq's digests for the tests after
