"""``zqsync dashboard`` in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``), via Selenium.

Two real workers (one with ``--processes 2``), a real dashboard process, real jobs. The
screenshot is kept under the test's tmp dir; with ``ZQSYNC_SCREENSHOT_DOCS=1`` it also
replaces ``docs/dashboard.png``.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
import requests

import zqsync
from tests.dashboard_process import TASKS, Dashboard
from tests.helpers import wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,2000")

pytestmark = [
    pytest.mark.processes_only,
    pytest.mark.timeout(150),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no {CHROMIUM}: apt-get install chromium chromium-driver"),
    pytest.mark.skipif(not os.path.exists(CHROMEDRIVER), reason="no chromedriver: apt-get install chromium-driver"),
]
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402


@pytest.fixture
def browser(tmp_path):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _texts(driver, selector: str) -> list[str]:
    """The text of every element matching ``selector``, read in one script (the page redraws its tables)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map((e) => e.textContent)", selector)


def _click_and_confirm(driver, selector: str) -> None:
    """Click ``selector`` (found and clicked in one script: the tables are redrawn), then accept its confirm()."""
    driver.execute_script("const e = document.querySelector(arguments[0]); setTimeout(() => e.click(), 0)", selector)
    wait_for(lambda: _alert(driver), what="the confirm() dialog").accept()


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None


def _job_state(client, job_id: str) -> str:
    return client.call("zqsync.job", job_id)["state"]


def test_dashboard_in_a_real_browser(browser, zq_worker, tmp_path, root):
    plain = zq_worker(TASKS, extra_args=["--state-dir", str(tmp_path / "state"), "--queue", "slow:1=tcp://127.0.0.1:0"])
    prefork = zq_worker(TASKS, extra_args=["--processes", "2"])
    dashboard = Dashboard([plain.endpoint, prefork.endpoint])
    try:
        started = time.monotonic()
        browser.get(dashboard.url)
        wait_for(lambda: {plain.endpoint, prefork.endpoint} <= set(_texts(browser, "#fleet tbody td:first-child")),
                 what="both workers in the fleet table")
        print(f"page load to a filled fleet table: {time.monotonic() - started:.2f} s")
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, f'#fleet tr[data-child="{prefork.endpoint}"]')) == 2,
                 what="both children of the prefork worker")
        assert set(_texts(browser, "#fleet tbody td:nth-child(2)")) <= {"up", "busy"}

        def jobs_done() -> int:
            return sum(int(text or 0) for text in _texts(browser, "#fleet td.jobs-done"))

        before = jobs_done()
        canvas = "return document.querySelector('#chart-throughput canvas').toDataURL()"
        drawn = browser.execute_script(canvas)
        with zqsync.Client([plain.endpoint, prefork.endpoint]) as client:
            for _ in range(2000):
                client.enqueue("add", 1, 2)
        wait_for(lambda: jobs_done() >= before + 2000, timeout=30, what="the page's done-jobs counters to move")
        wait_for(lambda: browser.execute_script("return Math.max(...zqsyncCharts.throughput.data[1])") > 0,
                 what="jobs/s above 0 in the chart")
        assert browser.execute_script(canvas) != drawn, "the throughput chart was not redrawn"

        # The jobs themselves: recent plain jobs with their results, and each worker's named queues.
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#recent tr[data-state="done"]'), what="recent plain jobs")
        assert set(_texts(browser, '#recent tr[data-state="done"] td:nth-child(7)')) == {"3"}
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#queues tr[data-queue="slow"]'), what="the named queue")

        flag = str(tmp_path / "flag")
        with zqsync.Client(plain.endpoint) as client:
            dead = client.enqueue_with_options("needs_file", args=[flag], confirm=True)
            delayed = client.enqueue_with_options("add", args=[1, 2], delay=3600)
            client.enqueue("needs_file", str(tmp_path / "never"))
            held = client.enqueue("hold", 60.0)
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'#dead tr[data-id="{dead}"]'), what="the dead job row")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'#pending tr[data-id="{delayed}"]'),
                     what="the scheduled job row")
            assert "scheduled" in _texts(browser, f'#pending tr[data-id="{delayed}"] td')
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'#running tr[data-id="{held}"]'), what="the running job")
            assert "60.0" in _texts(browser, f'#running tr[data-id="{held}"] td:nth-child(5)')
            Select(browser.find_element(By.ID, "filter-state")).select_by_visible_text("failed")
            browser.find_element(By.CSS_SELECTOR, "#recent-filter button").click()
            wait_for(lambda: (lambda states: states and set(states) == {"failed"})(
                _texts(browser, "#recent tbody td:nth-child(6)")), what="only failed jobs listed")
            assert any("never" in text for text in _texts(browser, "#recent tbody td:nth-child(5)"))
            browser.save_screenshot(str(tmp_path / "dashboard.png"))
            _click_and_confirm(browser, f'#running tr[data-id="{held}"] button')
            wait_for(lambda: f"cancelled job {held}" in browser.find_element(By.ID, "action-result").text,
                     what="the running job cancelled")
            open(flag, "w").close()
            _click_and_confirm(browser, f'#dead tr[data-id="{dead}"] button')
            wait_for(lambda: _job_state(client, dead) == "done", what="the requeued job to run")
            _click_and_confirm(browser, f'#pending tr[data-id="{delayed}"] button')
            wait_for(lambda: _job_state(client, delayed) == "cancelled", what="the scheduled job cancelled")
        blocked = [entry for entry in browser.get_log("browser") if "Content Security Policy" in entry["message"]]
        assert not blocked, blocked
        browser.find_element(By.ID, "lookup-id").send_keys(dead)
        browser.find_element(By.CSS_SELECTOR, "#lookup button").click()
        try:
            wait_for(lambda: '"state": "done"' in browser.find_element(By.ID, "lookup-result").text, what="the lookup")
        except AssertionError:
            print("lookup-result:", browser.find_element(By.ID, "lookup-result").get_attribute("textContent"))
            print("action-result:", browser.find_element(By.ID, "action-result").get_attribute("textContent"))
            print("browser log:", browser.get_log("browser"))
            raise
    except BaseException:
        print(dashboard.output())
        raise
    finally:
        dashboard.stop()
    if os.environ.get("ZQSYNC_SCREENSHOT_DOCS") == "1":
        shutil.copy(tmp_path / "dashboard.png", os.path.join(root, "docs", "dashboard.png"))


def test_off_loopback_the_browser_must_log_in(browser, zq_worker):
    worker = zq_worker(TASKS)
    token = "browser-test-token-0123456789"
    dashboard = Dashboard([worker.endpoint], host="0.0.0.0", token=token)
    try:
        assert requests.get(dashboard.url + "/api/state", timeout=10).status_code == 401
        browser.get(dashboard.url)
        assert browser.current_url.endswith("/login") and not browser.find_elements(By.ID, "fleet")
        browser.find_element(By.ID, "token").send_keys("wrong")
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_for(lambda: browser.find_elements(By.ID, "wrong-token"), what="the wrong-token message")
        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_for(lambda: worker.endpoint in _texts(browser, "#fleet tbody td:first-child"), what="the fleet after login")
    finally:
        dashboard.stop()
