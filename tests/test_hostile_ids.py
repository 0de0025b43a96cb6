"""Any order id works (CONTRACT §1, §2): queue names, alert ids and work items for hostile ids.

The names are checked as data (injective, at most 255 bytes, never an internal name);
then hostile ids and a forged work item go through the real per-order pipeline, next to
ordinary orders, and every order alerts exactly once.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aldebaran.trades.codec import dead_letters, decode_message, encode_json
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent
from declare.topology import ALERT, CHANNEL_PREFIX, DEAD_LETTER, TRADE_DATA, WORK_QUEUE, book_queue
from tests.support.pipeline import alert_counts, collect_alerts, running

HOSTILE = ["shard-0", "shard-3", "/#*.", "é", "a\r\nb", "nul\x00id", "&", "(", "'", "%41", "@41", "#x",
           "\U0001F600" * 50, "z" * 200, "-", " padded ", "book-1", "Aldebaran.Alert"]
INTERNAL = {TRADE_DATA, WORK_QUEUE, ALERT, DEAD_LETTER, "aldebaran.tracer", *(f"book-shard-{n}" for n in range(4096))}


QUEUE_NAME = re.compile(r"[a-zA-Z0-9-_.:@#,/+ ]*")  # what the AMQP client (pamqp) accepts


def _decoded_name(name: str) -> str:
    return unquote(name.removeprefix("book-").replace("@", "%"), errors="strict")


def test_book_queue_names_are_short_distinct_and_never_internal() -> None:
    names = {key: book_queue("book-", key) for key in HOSTILE}
    assert len(set(names.values())) == len(HOSTILE)
    for key, name in names.items():
        assert len(name.encode()) <= 255 and name not in INTERNAL and not name.startswith(CHANNEL_PREFIX)
        assert QUEUE_NAME.fullmatch(name), name
        if "#" not in name:
            assert _decoded_name(name) == key  # the readable form decodes back: no two keys meet
    assert names["shard-0"] == "book-shard@2D0" and book_queue("book-", "1001") == "book-1001"
    assert names["z" * 200] == "book-" + "z" * 200  # 200 safe bytes: still readable
    assert names["\U0001F600" * 50].startswith("book-#")  # 600 bytes percent-encoded: hashed
    assert len(book_queue("book-", "/" * 200).encode()) <= 255


def test_app_queue_prefixes_can_neither_meet_nor_spell_an_internal_name() -> None:
    from types import SimpleNamespace

    from aldebaran.apps import check_queue_prefixes, load_rule
    from aldebaran.errors import ConfigError

    trade, daily = load_rule("trade_limits"), load_rule("client_daily_limit", {"max_shares": 1})
    check_queue_prefixes([trade, daily])  # "book-" and "daily-": apart
    for prefix, why in (("book-", "could meet"), ("book-x", "could meet"), ("b", "could meet"),
                        ("Aldebaran.", "internal"), ("aldebaran.t", "internal"), ("", "1-50 bytes")):
        with pytest.raises(ConfigError, match=why):
            check_queue_prefixes([trade, SimpleNamespace(name="fake", queue_prefix=prefix)])


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_book_queue_is_injective(a: str, b: str) -> None:
    name_a, name_b = book_queue("book-", a), book_queue("book-", b)
    assert len(name_a.encode()) <= 255 and QUEUE_NAME.fullmatch(name_a)
    assert (name_a == name_b) == (a == b)
    assert name_a not in INTERNAL


def test_ids_are_limited_to_200_bytes_of_utf8_on_both_paths() -> None:
    ok = "\U0001F600" * 50  # 200 bytes
    too_long = "\U0001F600" * 51  # 51 characters, 204 bytes
    for fast in (True, False):
        body = encode_json([PurchaseRequest(ok, 10, "c", "s"), Purchase(too_long, ok, 1, "c", "s"),
                            Purchase("p", too_long, 1, "c", "s"), PurchaseRequest("x" * 201, 1, "c", "s")])
        decoded = decode_message(body, fast=fast)
        assert [e.id for e in decoded.events] == [ok]
        assert [r.reason for r in decoded.rejects] == [
            "id must be at most 200 bytes of UTF-8, got 204",
            "initial_order_id must be at most 200 bytes of UTF-8, got 204",
            "id must be at most 200 bytes of UTF-8, got 201"]


def _order(key: str, n: int) -> list[TradeEvent]:
    return [PurchaseRequest(key, 10, "c", "s"), Purchase(f"p{n}a", key, 6, "c", "s"),
            Purchase(f"p{n}b", key, 5, "c", "s")]


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_hostile_ids_and_a_forged_work_item_alert_exactly_once(mode, broker, worker_env, tmp_path) -> None:
    """Every hostile id alerts once in both modes; the per-order reference also refuses forged
    work items (the engine has no work queue: nothing consumes them there)."""
    env = dict(worker_env, ALDEBARAN_BOOK_TTL_SECONDS="4", ALDEBARAN_DELIVERY_LIMIT="3", ALDEBARAN_MODE=mode)
    forged_items = 4 if mode == "per-order" else 0
    orphan = "\U0001F4A5" * 50  # purchase_without_request:<200 bytes>: a 225-byte message_id
    with running(env, tmp_path / "up.log") as pipeline:
        for forged in (TRADE_DATA, DEAD_LETTER, "book-other", "book-shard-0")[:forged_items]:
            item = {"app": "trade_limits", "key": "k", "queue": forged}
            broker.channel.basic_publish("", WORK_QUEUE, json.dumps(item).encode())
        for n, key in enumerate(HOSTILE):
            broker.publish(_order(key, n), batch=3)
            broker.publish(_order(f"plain-{n}", n + 100), batch=3)
        broker.publish([Purchase("orphan-1", orphan, 3, "c", "s")])
        broker.publish([PurchaseRequest("y" * 201, 10, "c", "s")])
        broker.publish_raw(b"[" + b",".join([b"0"] * 3000) + b"]", "application/json")  # 3,000 junk elements
        expected = ({f"over_purchase:{key}" for key in HOSTILE}
                    | {f"over_purchase:plain-{n}" for n in range(len(HOSTILE))})
        expected.add(f"purchase_without_request:{orphan}")
        alerts = collect_alerts(broker, expected=len(expected), timeout=90, settle=2)
        dead = broker.drain_until(DEAD_LETTER, 2 + forged_items)
        log = pipeline.log()
    assert alert_counts(alerts) == {alert_id: 1 for alert_id in expected}
    reasons = sorted(p.headers["x-aldebaran-reason"] for p, _ in dead)
    assert sum("not the book queue of its key" in r for r in reasons) == forged_items, reasons
    assert "id must be at most 200 bytes of UTF-8, got 201" in reasons
    assert "Traceback" not in log and "PRECONDITION_FAILED" not in log
    assert len(dead) == 2 + forged_items  # the 3,000 junk elements are one summary dead letter
    assert ("3000 of 3000 batch elements rejected: 3000 x an event must be an object, got int (first at index 0)"
            in reasons)
    assert log.count('"event": "dead-lettered"') <= 4  # rate-limited: one line per kind


def test_a_work_item_must_name_its_own_book_queue() -> None:
    from aldebaran.apps import load_rules
    from aldebaran.settings import Settings
    from workers.books import BookManager

    manager = BookManager(Settings(), load_rules(Settings()))
    good = {"app": "trade_limits", "key": "é\x00", "queue": book_queue("book-", "é\x00")}
    assert manager._read_work(json.dumps(good).encode())[2] is None
    for bad, why in (({**good, "queue": "book-é\x00"}, "not the book queue"), ({**good, "app": "nope"}, "unknown"),
                     ({**good, "key": ""}, "empty key"), ({"app": 1}, "unreadable")):
        problem = manager._read_work(json.dumps(bad).encode())[2]
        assert problem is not None and why in problem, problem


def test_many_rejects_in_one_message_become_one_summary() -> None:
    few = b"[" + b",".join([b"0"] * 10) + b"]"
    assert len(dead_letters(decode_message(few), few)) == 10  # each alone, with its index
    good = encode_json([PurchaseRequest("g", 1, "c", "s")])[1:-1]
    many = b"[" + good + b"," + b",".join([b"0", b'"x"'] * 20) + b"]"
    decoded = decode_message(many)
    [summary] = dead_letters(decoded, many)
    assert [e.id for e in decoded.events] == ["g"] and summary.raw == many
    assert summary.reason == ("40 of 41 batch elements rejected: 20 x an event must be an object, got int "
                              "(first at index 1); 20 x an event must be an object, got str (first at index 2)")


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_a_conflicting_duplicate_is_counted_and_logged_once(mode, broker, worker_env, tmp_path) -> None:
    import httpx

    from tests.support.processes import free_port

    port = free_port()
    env = dict(worker_env, ALDEBARAN_MODE=mode)
    with running(env, tmp_path / "up.log", "--metrics-port", str(port)) as pipeline:
        broker.publish([PurchaseRequest("conf", 100, "c", "s"), Purchase("p1", "conf", 60, "c", "s")])
        for _ in range(3):  # the same id with other content: the first copy counts
            broker.publish([Purchase("p1", "conf", 50, "c", "s")])
        broker.publish([Purchase("p1", "conf", 60, "c", "s")])  # a true redelivery: no conflict
        broker.publish([PurchaseRequest("other", 10, "c", "s"), Purchase("o1", "other", 11, "c", "s")])
        broker.publish([Purchase("p2", "conf", 41, "c", "s")])
        alerts = collect_alerts(broker, expected=2, timeout=60, settle=2)
        samples = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        log = pipeline.log()
    assert alert_counts(alerts) == {"over_purchase:conf": 1, "over_purchase:other": 1}
    conf = next(a for a in alerts if a["order_id"] == "conf")
    assert conf["purchased_shares"] == 101 and sorted(conf["purchase_ids"]) == ["p1", "p2"]
    assert "aldebaran_conflicting_duplicates_total 3.0" in samples
    assert log.count("conflicting duplicate") == 1


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_an_alert_id_over_255_bytes_travels_shortened_in_both_modes(mode, broker, worker_env, tmp_path) -> None:
    """A client of 200 emoji makes a `client_daily_limit` alert id of 830 bytes: once the
    engine's lone-alert publish died on it (exit 70) and the per-order books looped. The id is
    now bounded at birth (`bounded_alert_id`), so it is a valid message_id everywhere."""
    env = dict(worker_env, ALDEBARAN_BOOK_TTL_SECONDS="3", ALDEBARAN_MODE=mode,
               ALDEBARAN_APPS='["trade_limits", "client_daily_limit"]',
               ALDEBARAN_APP_OPTIONS='{"client_daily_limit": {"max_shares": 10}}')
    client = "\U0001F600" * 200
    with running(env, tmp_path / "up.log") as pipeline:
        broker.publish([Purchase("lone", "o-long", 11, client, "s")])  # alone in its cycle: a lone alert
        first = collect_alerts(broker, expected=1, timeout=60, settle=0)
        for n in range(10):  # unrelated orders, under the daily limit of their clients
            broker.publish([PurchaseRequest(f"plain-{n}", 5, f"c{n}", "s"),
                            Purchase(f"q{n}", f"plain-{n}", 6, f"c{n}", "s")], batch=2)
        rest = collect_alerts(broker, expected=11, timeout=60, settle=2)
        alive = pipeline.process.poll() is None  # type: ignore[union-attr]
    [daily] = first
    assert alive and daily["kind"] == "client_daily_limit" and daily["client"] == client
    assert daily["alert_id"].startswith("client_daily_limit:\U0001F600") and len(daily["alert_id"].encode()) <= 255
    expected = {f"over_purchase:plain-{n}": 1 for n in range(10)} | {"purchase_without_request:o-long": 1}
    assert alert_counts(rest) == expected
