"""amqps:// and rediss:// against local TLS listeners with a self-signed certificate, and
no password in any log line or error, even across reconnects and failed logins."""

from __future__ import annotations

import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.faults.fleet import (
    TEST_TIMEOUT,
    Fleet,
    PrivateRedis,
    RetryingPublisher,
    describe,
    pull_queue_deliveries,
    wait_for_sinks,
)
from tests.support import services
from tests.support.checker import fault_stream
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def broker_user(vhost: services.Vhost, user: str, password: str) -> None:
    with services._management() as http:
        http.put(f"/api/users/{quote(user, safe='')}", json={"password": password, "tags": ""}).raise_for_status()
        http.put(f"/api/permissions/{quote(vhost.name, safe='')}/{quote(user, safe='')}",
                 json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()


def drop_user(user: str) -> None:
    with services._management() as http:
        http.delete(f"/api/users/{quote(user, safe='')}")


def test_tls_urls_work_and_no_password_is_ever_logged(fault_env, webhook, redis_prefix, vhost,
                                                      tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    user, amqp_pw, redis_pw = f"ald-{uuid.uuid4().hex[:8]}", f"Amqp{uuid.uuid4().hex}", f"Rds{uuid.uuid4().hex}"
    wrong_pw = f"Wrong{uuid.uuid4().hex}"
    broker_user(vhost, user, amqp_pw)
    store = PrivateRedis(tmp_path / "redis", password=redis_pw).start()
    amqp_tls = TcpProxy(5672, ssl=server_tls).start()
    redis_tls = TcpProxy(store.port, ssl=server_tls).start()
    vpath = quote(vhost.name, safe="")
    env = {**fault_env,
           "ALDEBARAN_AMQP_URL": f"amqps://{user}:{amqp_pw}@127.0.0.1:{amqp_tls.port}/{vpath}",
           "ALDEBARAN_REDIS_URL": f"rediss://:{redis_pw}@127.0.0.1:{redis_tls.port}/0",
           "ALDEBARAN_TLS_CA_FILE": str(cert)}
    stream = fault_stream(20, seed=41)
    fleet = Fleet(env, tmp_path / "logs")
    failures: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        fleet.start_all()
        publisher = RetryingPublisher(vhost.amqp_url)
        # Cut the TLS connections mid-stream: reconnect log lines carry the URLs.
        publisher.publish_stream(stream.events, at={0.5: amqp_tls.cut})
        publisher.close()
        reports = wait_for_sinks(stream.expected, {
            "webhook": webhook.deliveries,
            "queue-api": lambda: pull_queue_deliveries(store.url, redis_prefix)}, timeout=180)
        alive = fleet.alive()
        # Failed logins and an untrusted certificate must fail with a masked reason.
        base = {**env, "ALDEBARAN_LOG_FORMAT": "json", "ALDEBARAN_MODE": "per-order"}
        cases = {
            "wrong broker password": {**base, "ALDEBARAN_AMQP_URL": env["ALDEBARAN_AMQP_URL"].replace(
                amqp_pw, wrong_pw)},
            "wrong redis password": {**base, "ALDEBARAN_REDIS_URL": env["ALDEBARAN_REDIS_URL"].replace(
                redis_pw, wrong_pw)},
            "untrusted certificate": {k: v for k, v in base.items() if k != "ALDEBARAN_TLS_CA_FILE"},
        }
        for name, case_env in cases.items():
            kind = "books" if "redis" in name else "aggregator"
            failures[name] = subprocess.run([sys.executable, "-m", "aldebaran.cli", "run", kind], env=case_env,
                                            capture_output=True, text=True, timeout=120)
    finally:
        codes = fleet.stop_all()
        amqp_tls.close()
        redis_tls.close()
        store.close()
        drop_user(user)
    print(f"\nTLS: amqps connections {amqp_tls.connections_seen}, rediss connections {redis_tls.connections_seen}, "
          f"cut {amqp_tls.cuts}\n{describe(reports.values())}")
    assert all(code is None for code in alive.values()), alive
    assert all(r.ok for r in reports.values()), describe(reports.values())
    assert amqp_tls.connections_seen >= 5 and redis_tls.connections_seen >= 1 and amqp_tls.cuts >= 1
    for name, result in failures.items():
        assert result.returncode == 69, (name, result.returncode, result.stderr[-2000:])
    text = fleet.all_logs() + "".join(r.stdout + r.stderr for r in failures.values())
    assert "***@" in text  # URLs were logged, masked
    for secret in (amqp_pw, redis_pw, wrong_pw):
        assert secret not in text, f"a password leaked into the logs: {secret[:4]}..."
    assert all(code == 0 for code in codes.values()), codes
