"""``zqsync dashboard``'s JSON endpoints, without a browser: real workers, a real dashboard process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

import zqsync
from tests.dashboard_process import TASKS, Dashboard, csrf_token
from tests.helpers import wait_for
from zqsync.dashboard.fleet import Fleet

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def dashboards():
    started: list[Dashboard] = []

    def start(*args, **kwargs) -> Dashboard:
        started.append(Dashboard(*args, **kwargs))
        return started[-1]

    yield start
    for dashboard in started:
        dashboard.stop()


def _state(url: str) -> dict:
    response = requests.get(url + "/api/state", timeout=10)
    response.raise_for_status()
    return response.json()


def _sample_after(url: str, moment: float) -> list[dict]:
    """The dashboard's history once it holds a sample taken after ``moment`` (epoch seconds, this machine)."""
    def newer() -> list[dict]:
        history = _state(url)["history"]
        return history if history and history[-1]["t"] > moment else []

    return wait_for(newer, timeout=30, what=f"a chart sample after {moment}")


def _free_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def test_fleet_shows_each_worker_its_children_and_moving_rates(zq_worker, dashboards):
    plain = zq_worker(TASKS)
    prefork = zq_worker(TASKS, extra_args=["--processes", "2"])
    nowhere = _free_endpoint()
    dashboard = dashboards([plain.endpoint, prefork.endpoint, nowhere])
    # Rates come from the difference between two polls of a process: let it see every process idle first.
    wait_for(lambda: [len(row["processes"]) for row in _state(dashboard.url)["workers"]] == [1, 1, 0],
             timeout=30, what="every worker polled once")
    _sample_after(dashboard.url, time.time())  # the chart's series starts before the jobs
    with zqsync.Client([plain.endpoint, prefork.endpoint]) as client:
        for _ in range(300):
            client.enqueue("add", 1, 2)
        assert client.call("add", 2, 3) == 5

    def done() -> dict:
        workers = {row["endpoint"]: row for row in _state(dashboard.url)["workers"]}
        processes = [proc for row in workers.values() for proc in row["processes"]]
        totals = [sum(proc["counters"][name] for proc in processes) for name in ("jobs_succeeded", "calls_received")]
        return workers if totals == [300, 1] else {}

    workers = wait_for(done, timeout=30, what="300 jobs and 1 call counted")
    counted = time.time()
    assert workers[plain.endpoint]["state"] in ("up", "busy")
    assert [proc["pid"] for proc in workers[plain.endpoint]["processes"]] == [plain.pid]
    # The prefork worker answers for its whole self: one row under its supervisor's pid, and each child.
    (whole,) = workers[prefork.endpoint]["processes"]
    children = workers[prefork.endpoint]["children"]
    assert whole["pid"] == prefork.pid and whole["prefork"] and whole["uptime"] > 0
    assert len({child["pid"] for child in children} - {prefork.pid}) == 2
    assert sum(child["jobs_done"] for child in children) == whole["counters"]["jobs_succeeded"]
    assert all(child["state"] in ("up", "busy") and child["uptime"] > 0 for child in children)
    nothing = wait_for(lambda: [row for row in _state(dashboard.url)["workers"] if row["state"] == "unreachable"],
                       what="the absent worker unreachable")
    assert [(row["endpoint"], row["processes"]) for row in nothing] == [(nowhere, [])]
    # Samples run on their own timer: wait for one taken after the polls that counted the jobs.
    history = _sample_after(dashboard.url, counted)
    assert max(sample["jobs_per_s"] for sample in history) > 0, history
    # Every job counted is in the chart (more, if a prefork child missed an aggregate answer: not counted here).
    charted = sum(later["jobs_per_s"] * (later["t"] - earlier["t"]) for earlier, later in zip(history, history[1:]))
    assert charted > 299.5, history
    assert max(sample["p99"] for sample in history) > 0, history


def test_a_sample_counts_the_jobs_of_every_poll_since_the_previous_sample(zq_worker):
    """Polls and samples run on separate timers: on a busy machine two polls can fall between two samples.
    The Fleet is not started: the test orders the polls and samples itself, against a real worker."""
    worker = zq_worker(TASKS)
    fleet = Fleet([worker.endpoint])
    (polled,) = fleet.workers
    try:
        fleet.poll(polled)
        before = fleet.sample()
        with zqsync.Client(worker.endpoint) as client:
            for _ in range(300):
                client.enqueue("add", 1, 2)
            assert client.call("add", 2, 3) == 5

        def counted() -> bool:
            fleet.poll(polled)
            stats = polled.processes[worker.pid].stats
            return stats["jobs_succeeded"] == 300 and stats["calls_received"] == 1

        wait_for(counted, what="300 jobs and 1 call counted")
        fleet.poll(polled)  # a poll that sees nothing new, before the sampler wakes
        after = fleet.sample()
    finally:
        fleet.stop()
    elapsed = after["t"] - before["t"]
    assert after["jobs_per_s"] * elapsed == pytest.approx(300, abs=0.5), (before, after)
    assert after["calls_per_s"] * elapsed == pytest.approx(1, abs=0.01), (before, after)


def test_dead_job_requeued_runs_and_a_delayed_job_is_cancelled(zq_worker, dashboards, tmp_path):
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(tmp_path / "state")])
    dashboard = dashboards([worker.endpoint])
    flag = str(tmp_path / "flag")
    with zqsync.Client(worker.endpoint) as client:
        dead = client.enqueue_with_options("needs_file", args=[flag], confirm=True)
        delayed = client.enqueue_with_options("add", args=[1, 2], delay=3600)
    rows = wait_for(lambda: requests.get(dashboard.url + "/api/jobs?state=dead", timeout=10).json()["workers"][0]
                    ["result"]["rows"], what="the dead job listed")
    assert [(row["id"], row["task"]) for row in rows] == [(dead, "needs_file")]
    assert "FileNotFoundError" in rows[0]["error"] and rows[0]["args"].endswith("flag'")
    lookup = requests.get(f"{dashboard.url}/api/job/{dead}", timeout=10)
    assert lookup.status_code == 200 and lookup.json()["found"][0]["result"]["state"] in ("dead", "failed")
    assert requests.get(dashboard.url + "/api/job/" + "0" * 32, timeout=10).status_code == 404

    session = requests.Session()
    assert session.post(dashboard.url + "/api/requeue", json={"endpoint": worker.endpoint}, timeout=10).status_code == 403
    headers = {"X-CSRF-Token": csrf_token(session, dashboard.url)}
    open(flag, "w").close()
    answer = session.post(dashboard.url + "/api/requeue", json={"endpoint": worker.endpoint, "ids": [dead]},
                          headers=headers, timeout=10)
    assert answer.status_code == 200 and answer.json()["result"]["requeued"] == 1
    wait_for(lambda: requests.get(f"{dashboard.url}/api/job/{dead}", timeout=10).json()["found"][0]["result"]["state"]
             == "done", what="the requeued job to run")

    pending = requests.get(dashboard.url + "/api/jobs?state=scheduled", timeout=10).json()["workers"][0]["result"]["rows"]
    assert [row["id"] for row in pending] == [delayed] and pending[0]["due"] > 0
    answer = session.post(dashboard.url + "/api/cancel", json={"endpoint": worker.endpoint, "id": delayed},
                          headers=headers, timeout=10)
    assert answer.status_code == 200 and answer.json()["result"]["cancelled"] is True
    counts = requests.get(dashboard.url + "/api/jobs", timeout=10).json()["workers"][0]["result"]["counts"]
    assert counts == {"done": 1, "cancelled": 1}, counts

    # DNS rebinding: a page whose own name now points at 127.0.0.1 would fetch the page (and its CSRF token).
    for path in ("/", "/api/state"):
        rebound = requests.get(dashboard.url + path, headers={"Host": "attacker.example:8008"}, timeout=10)
        assert rebound.status_code == 403 and "not loopback" in rebound.json()["error"]
    unknown = session.post(dashboard.url + "/api/cancel", json={"endpoint": "tcp://10.0.0.1:1", "id": delayed},
                           headers=headers, timeout=10)
    assert unknown.status_code == 404
    bad = session.post(dashboard.url + "/api/purge", json={"endpoint": worker.endpoint, "older_than": "old"},
                       headers=headers, timeout=10)
    assert bad.status_code == 400


def test_purge_deletes_old_dead_jobs(zq_worker, dashboards, tmp_path):
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(tmp_path / "state")])
    dashboard = dashboards([worker.endpoint])
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue_with_options("needs_file", args=[str(tmp_path / "never")], confirm=True)
    wait_for(lambda: requests.get(dashboard.url + "/api/jobs", timeout=10).json()["workers"][0]["result"]["counts"]
             .get("dead"), what="a dead job")
    session = requests.Session()
    headers = {"X-CSRF-Token": csrf_token(session, dashboard.url)}
    kept = session.post(dashboard.url + "/api/purge", json={"endpoint": worker.endpoint, "older_than": 3600},
                        headers=headers, timeout=10)
    assert kept.json()["result"] == 0
    purged = session.post(dashboard.url + "/api/purge", json={"endpoint": worker.endpoint, "older_than": 0},
                          headers=headers, timeout=10)
    assert purged.status_code == 200 and purged.json()["result"] == 1


def test_off_loopback_needs_a_token_and_every_request_carries_it(dashboards):
    refused = subprocess.run([sys.executable, "-m", "zqsync", "dashboard", "tcp://127.0.0.1:5555", "--bind", "0.0.0.0:0"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--token-file" in refused.stderr, refused.stderr

    token = "s3cret-token-for-the-test"
    dashboard = dashboards([_free_endpoint()], host="0.0.0.0", token=token)
    assert requests.get(dashboard.url + "/api/state", timeout=10).status_code == 401
    page = requests.get(dashboard.url + "/", timeout=10, allow_redirects=False)
    assert page.status_code == 302 and page.headers["Location"].endswith("/login")
    assert requests.post(dashboard.url + "/api/purge", json={}, timeout=10).status_code == 401
    assert requests.get(dashboard.url + "/api/state", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    assert requests.get(dashboard.url + "/api/state", headers={"Authorization": f"Bearer {token}"},
                        timeout=10).status_code == 200

    session = requests.Session()
    assert session.post(dashboard.url + "/login", data={"token": "wrong"}, timeout=10).status_code == 403
    assert session.get(dashboard.url + "/api/state", timeout=10).status_code == 401
    assert session.post(dashboard.url + "/login", data={"token": token}, timeout=10).status_code == 200
    assert session.get(dashboard.url + "/api/state", timeout=10).status_code == 200
    assert 'href="http://127.0.0.1:9/metrics"' in session.get(dashboard.url + "/", timeout=10).text
    assert session.post(dashboard.url + "/api/purge", json={}, timeout=10).status_code == 403


def test_a_worker_is_busy_then_stopping_then_unreachable(zq_worker, dashboards):
    worker = zq_worker(extra_args=["--graceful-timeout", "20"])
    dashboard = dashboards([worker.endpoint], interval=0.2)

    def state() -> str:
        return _state(dashboard.url)["workers"][0]["state"]

    wait_for(lambda: state() == "up", what="the worker up")
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue("sleep", 3.0)
    wait_for(lambda: state() == "busy", what="the worker busy with its job")
    worker.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: state() == "stopping", what="the worker stopping while its job runs")
    assert worker.proc.wait(30) == 0
    wait_for(lambda: state() == "unreachable", what="the stopped worker unreachable")


def test_help_names_every_option_and_sigterm_stops_it_cleanly(zq_worker):
    shown = subprocess.run([sys.executable, "-m", "zqsync", "dashboard", "--help"], capture_output=True, text=True,
                           timeout=60)
    for option in ("--bind", "--token-file", "--metrics-url", "--interval", "--curve-server-key", "--curve-secret-key"):
        assert option in shown.stdout
    dashboard = Dashboard([zq_worker(TASKS).endpoint])
    assert requests.get(dashboard.url + "/api/state", timeout=10).status_code == 200
    assert dashboard.stop() == 0, dashboard.output()


def test_bad_bind_is_a_clear_error():
    result = subprocess.run([sys.executable, "-m", "zqsync", "dashboard", "tcp://127.0.0.1:5555", "--bind", "8008"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--bind must be HOST:PORT" in result.stderr, result.stderr
