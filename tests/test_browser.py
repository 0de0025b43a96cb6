"""The dashboard in a real browser: Debian's Chromium driven by Playwright.

`aldebaran up` and `aldebaran api` run as subprocesses on the test's vhost and Redis
prefix; the page is opened before any trade data exists, then the design document's
stream (request 100, purchases 90 and 30) and one unreadable message are published in
the text form. The alert, its delivery per channel and the dead letter's reason must
appear on the page by themselves (it polls). The screenshot goes to the test's temporary
directory; `ALDEBARAN_TEST_SCREENSHOT=docs/dashboard.png` keeps it for the docs.
No browser is downloaded: Chromium comes from the distribution.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.pipeline import Broker, declare, running
from tests.support.processes import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 45_000

CONFIG = """
[[channels]]
name = "ops-log"
kind = "log"

[[channels]]
name = "pull-api"
kind = "queue-api"
queue = "alerts"

[[channels]]
name = "ops-webhook"
kind = "webhook"
url = "http://127.0.0.1:{dead_port}/alerts"
max_attempts = 2
backoff_initial_seconds = 0.1
backoff_max_seconds = 0.2
timeout_seconds = 2
"""

STREAM = [
    b"id:1\n# shares: 100\nclient: Sendence\nstock: AAPL",
    b"id:2\ninitial order id: 1\n# shares: 90\nclient: Sendence\nstock: AAPL",
    b"id:3\ninitial order id: 1\n# shares: 30\nclient: Sendence\nstock: AAPL",
]
UNREADABLE = b"id:9\n# shares: lots\nclient: Sendence\nstock: AAPL"


def wait_serving(base: str, api: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until the API answers (a start-up bound, not a speed claim)."""
    def serving() -> bool:
        if api.poll() is not None:
            raise AssertionError(f"aldebaran api exited with {api.returncode}:\n{log_path.read_text()}")
        return httpx.get(base + "/", timeout=2).status_code == 200

    wait_until(serving, lambda: f"aldebaran api to answer:\n{log_path.read_text()}", timeout=60,
               ignoring=(httpx.HTTPError,))


@pytest.fixture
def api_base(worker_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The pipeline (`aldebaran up`) and the API (`aldebaran api`) on this test's vhost."""
    config = tmp_path / "aldebaran.toml"
    config.write_text(CONFIG.format(dead_port=free_port()))
    env = dict(worker_env, ALDEBARAN_CONFIG=str(config))
    declare(env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api_log = tmp_path / "api.log"
    with running(env, tmp_path / "up.log"), api_log.open("ab") as log:
        api = subprocess.Popen([sys.executable, "-m", "aldebaran.cli", "api", "--port", str(port)],
                               env=env, stdout=log, stderr=log)
        try:
            wait_serving(base, api, api_log)
            yield base, env
        finally:
            api.terminate()
            try:
                api.wait(timeout=30)
            except subprocess.TimeoutExpired:
                api.kill()
                api.wait()
        assert api.returncode == 0, api_log.read_text()


def test_dashboard_shows_a_fresh_alert_its_delivery_and_a_dead_letter(api_base: tuple[str, dict[str, str]],
                                                                     tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    screenshot = Path(os.environ.get("ALDEBARAN_TEST_SCREENSHOT") or tmp_path / "dashboard.png")

    assert CHROMIUM.exists(), "Debian's chromium is missing: SETUP_TEST_TOOLS=1 deploy/setup.sh installs it"
    base, env = api_base
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(base + "/")
            expect(page.locator("#status")).to_contain_text("live", timeout=WAIT_MS)
            expect(page.locator("#alerts tbody")).to_contain_text("No alerts yet.")

            broker = Broker(env["ALDEBARAN_AMQP_URL"])
            try:
                for body in STREAM:
                    broker.publish_raw(body, "text/plain")
                broker.publish_raw(UNREADABLE, "text/plain")
            finally:
                broker.close()

            row = page.locator('#alerts tr[data-alert-id="over_purchase:1"]')
            expect(row).to_be_visible(timeout=WAIT_MS)
            expect(row).to_contain_text("over_purchase")
            expect(row).to_contain_text("Sendence")
            expect(row).to_contain_text("120")  # 90 + 30 purchased of 100
            for channel in ("ops-log", "pull-api"):
                expect(row.locator(f'td[data-channel="{channel}"] .badge')).to_have_attribute(
                    "data-status", "delivered", timeout=WAIT_MS)
            webhook = row.locator('td[data-channel="ops-webhook"]')
            expect(webhook.locator(".badge")).to_have_attribute("data-status", "parked", timeout=WAIT_MS)
            expect(webhook).to_contain_text("after 2 attempts")  # the channel's last error, as parked
            expect(page.locator("#card-pull")).to_have_text("1", timeout=WAIT_MS)  # the queue-api channel's copy
            dead = page.locator("#dead-letters tbody")
            expect(dead).to_contain_text("lots", timeout=WAIT_MS)  # the unreadable message, with its reason
            expect(dead).to_contain_text("Aldebaran.Channel.ops-webhook.Dead_Letter")
            expect(page.locator('#queues tr[data-queue="Aldebaran.Channel.ops-webhook.Dead_Letter"]')).to_contain_text(
                "1", timeout=WAIT_MS)  # the unreachable webhook's parked alert
            expect(page.locator("#status")).to_contain_text("live")

            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000
