"""The dashboard shows the jobs themselves: recent plain jobs, running ones, queue depth, states named as
``client.job()`` names them, and actions that say what they did and do it once.

The worker core runs in-process (``zq_inprocess``), the dashboard's Flask app in the test over a
:class:`~zqsync.dashboard.fleet.Fleet` of real clients (its WSGI test client: no HTTP server), except
for the headers test, which asks a real ``zqsync dashboard`` process over HTTP.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

import zqsync
from tests.dashboard_process import Dashboard, csrf_token
from tests.helpers import wait_for
from tests.integration import job_tasks
from zqsync.dashboard.app import create_app
from zqsync.dashboard.fleet import Fleet
from zqsync.worker import recent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def dashboard():
    """``dashboard(endpoint)``: a Flask test client of the dashboard over that worker, and its Fleet."""
    fleets: list[Fleet] = []

    def start(endpoint: str):
        fleets.append(Fleet([endpoint]))
        web = create_app(fleets[-1]).test_client()
        page = web.get("/").get_data(as_text=True)
        web.environ_base["HTTP_X_CSRF_TOKEN"] = page.split('name="csrf-token" content="')[1].split('"')[0]
        return web, fleets[-1]

    yield start
    for fleet in fleets:
        fleet.stop()


def _result(web, path: str) -> dict:
    response = web.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)
    (answer,) = response.get_json()["workers"]
    assert "error" not in answer, answer
    return answer["result"]


def _requeued(answer: dict) -> int:
    """How many a requeue answer says it requeued (a bare count from a dashboard that does not explain)."""
    result = answer["result"]
    return result if isinstance(result, int) else result["requeued"]


def test_every_response_says_nosniff_and_has_a_strict_csp(tmp_path):
    dashboard = Dashboard(["tcp://127.0.0.1:9"])
    try:
        session = requests.Session()
        headers = {"X-CSRF-Token": csrf_token(session, dashboard.url)}
        answers = [session.get(dashboard.url + path, timeout=10) for path in
                   ("/", "/login", "/static/dashboard.js", "/api/state", "/api/v1/state", "/api/nothing")]
        answers += [session.post(dashboard.url + "/api/requeue", json={}, timeout=10),
                    session.post(dashboard.url + "/api/v1/purge", json={"endpoint": "tcp://127.0.0.1:9", "older_than": "x"},
                                 headers=headers, timeout=10)]
    finally:
        dashboard.stop()
    for answer in answers:
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", (answer.url, dict(answer.headers))
        policy = dict(part.strip().split(" ", 1) for part in answer.headers["Content-Security-Policy"].split(";"))
        assert policy["default-src"] == "'none'" and policy["script-src"] == "'self'", policy
        assert policy["frame-ancestors"] == "'none'" and "unsafe" not in json.dumps(policy), policy
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200, 200, 404, 403, 400]


def test_a_running_confirmed_job_is_running_and_a_delayed_one_scheduled_everywhere(zq_inprocess, dashboard, tmp_path):
    state = tmp_path / "state"
    worker = zq_inprocess(job_tasks.registry, state_dir=str(state))
    web, _ = dashboard(worker.endpoint)
    with zqsync.Client(worker.endpoint) as client:
        running = client.enqueue_with_options("slow", args=(str(tmp_path / "out"), "long", 30.0), confirm=True)
        delayed = client.enqueue_with_options("add", args=(1, 2), delay=3600, confirm=True)
        worker.wait(lambda counters: counters["in_flight"] == 1)
        assert (client.job(running).state, client.job(delayed).state) == ("running", "scheduled")
        counts = _result(web, "/api/jobs")["counts"]
        assert (counts.get("running"), counts.get("scheduled"), counts.get("pending")) == (1, 1, None), counts
        rows = {state: [row["id"] for row in _result(web, f"/api/v1/jobs?state={state}")["rows"]]
                for state in ("running", "scheduled", "pending")}
        assert rows == {"running": [running], "scheduled": [delayed], "pending": []}, rows
        listed = subprocess.run([sys.executable, "-m", "zqsync", "jobs", "--state-dir", str(state), "--json"],
                                capture_output=True, text=True, timeout=60)
        assert {row["id"]: row["state"] for row in map(json.loads, listed.stdout.splitlines())} == {
            running: "running", delayed: "scheduled"}, listed.stdout + listed.stderr
        # An action that does nothing says why.
        answer = web.post("/api/requeue", json={"endpoint": worker.endpoint, "ids": [running]}).get_json()
        assert _requeued(answer) == 0 and "running" in (answer.get("why_not") or ""), answer
        cancelled = web.post("/api/v1/cancel", json={"endpoint": worker.endpoint, "id": running}).get_json()
        assert cancelled["did"] == f"cancelled job {running}" and cancelled["why_not"] is None, cancelled
        again = web.post("/api/v1/cancel", json={"endpoint": worker.endpoint, "id": running}).get_json()
        assert again["did"] == "cancelled nothing" and "already ended (cancelled)" in again["why_not"], again


def test_requeue_all_sent_twice_around_a_worker_restart_requeues_once(zq_inprocess, dashboard, tmp_path):
    state, dead = str(tmp_path / "state"), 5
    worker = zq_inprocess(job_tasks.registry, state_dir=state)
    web, _ = dashboard(worker.endpoint)
    with zqsync.Client(worker.endpoint) as client:
        for n in range(dead):
            client.enqueue_with_options("boom", args=(f"dead {n}",), confirm=True)
    worker.wait(lambda counters: counters["jobs_failed"] == dead)
    listing = wait_for(lambda: (lambda page: page if len(page["rows"]) == dead else None)(
        _result(web, "/api/jobs?state=dead")), what="the dead jobs listed")
    # The page sends the listing's time (the worker's clock) with the click; a dashboard without it, none.
    click = {"endpoint": worker.endpoint, "as_of": listing.get("now")}
    first = web.post("/api/requeue", json=click).get_json()
    assert _requeued(first) == dead and first.get("why_not") is None, first
    worker.wait(lambda counters: counters["jobs_failed"] == 2 * dead)  # each ran again, and died again
    assert worker.stop() == 0
    worker = zq_inprocess(job_tasks.registry, state_dir=state, bind=worker.endpoint)
    second = web.post("/api/requeue", json=click).get_json()
    assert _requeued(second) == 0, second
    assert "after the listing" in second["why_not"], second
    assert _result(web, "/api/v1/jobs")["counts"] == {"dead": dead}
    fresh = _result(web, "/api/v1/jobs?state=dead")  # a new listing may requeue them again
    third = web.post("/api/v1/requeue", json={"endpoint": worker.endpoint, "as_of": fresh["now"]}).get_json()
    assert third["result"]["requeued"] == dead and third["did"] == f"requeued {dead} job(s)", third


def test_recent_plain_jobs_running_ones_and_queue_depth(zq_inprocess, dashboard, tmp_path, monkeypatch):
    monkeypatch.setattr(recent, "SAMPLE_EVERY", 0.0)  # keep every success: the ring itself is under test
    queue = zqsync.settings.QueueSpec("slow", 1, "tcp://127.0.0.1:0")
    worker = zq_inprocess(job_tasks.registry, queues=(queue,))
    web, fleet = dashboard(worker.endpoint)
    extra = 3
    with zqsync.Client(worker.endpoint) as client:
        for n in range(recent.PER_TASK + extra):
            client.enqueue("add", n, 1)
        for n in range(2):
            client.enqueue("boom", f"plain {n}")
        worker.wait(lambda counters: counters["jobs_succeeded"] == recent.PER_TASK + extra
                    and counters["jobs_failed"] == 2)
        done = _result(web, "/api/v1/recent?task=add&limit=1000")["finished"]
        # The ring keeps the newest PER_TASK outcomes of the task, newest first, with their results.
        assert len(done) == recent.PER_TASK and {row["state"] for row in done} == {"done"}
        assert done[0]["args"] == f"{recent.PER_TASK + extra - 1}, 1" and done[0]["result"] == str(recent.PER_TASK + extra)
        assert sorted(int(row["result"]) for row in done) == list(range(extra + 1, recent.PER_TASK + extra + 1))
        failed = _result(web, "/api/v1/recent?state=failed")["finished"]
        assert [(row["task"], row["args"]) for row in failed] == [("boom", "'plain 1'"), ("boom", "'plain 0'")]
        assert failed[0]["error"] == "ValueError: plain 1" and failed[0]["result"] is None
        assert _result(web, f"/api/v1/recent?since={failed[0]['finished_at'] + 1e-6}")["finished"] == []

        endpoint = client.call("zqsync.stats")["queues"]["slow"]["endpoint"]
        with zqsync.Client(endpoint) as slow:
            slow.enqueue("slow", str(tmp_path / "out"), "held", 30.0)
            slow.enqueue("slow", str(tmp_path / "out"), "waits", 30.0)

            def depth():
                fleet.poll(fleet.workers[0])
                (process,) = web.get("/api/v1/state").get_json()["workers"][0]["processes"]
                held = process["queues"]["slow"]
                return process if (held["running"], held["waiting"]) == (1, True) else None

            process = wait_for(depth, what="one job running on the queue and one waiting")
            assert process["queues"]["slow"]["concurrency"] == 1
            (running,) = _result(web, "/api/v1/recent?state=running")["running"]
            assert running["task"] == "slow" and running["args"].endswith(", 'held', 30.0"), running
            assert running["runtime"] >= 0 and not running["confirmed"]
            stopped = web.post("/api/v1/cancel", json={"endpoint": worker.endpoint, "id": running["id"]}).get_json()
            assert stopped["result"]["cancelled"] and stopped["why_not"] is None, stopped
            worker.wait(lambda counters: counters["jobs_cancelled"] == 1 and counters["in_flight"] == 1)
            (second,) = _result(web, "/api/v1/recent?state=running")["running"]
            web.post("/api/v1/cancel", json={"endpoint": worker.endpoint, "id": second["id"]})
            worker.wait(lambda counters: counters["jobs_cancelled"] == 2)
    cancelled = _result(web, "/api/v1/recent?task=slow&state=cancelled")["finished"]
    assert [row["args"].split(", ")[1] for row in cancelled] == ["'waits'", "'held'"]


def test_a_flood_keeps_a_sample_of_successes_counts_the_rest_and_every_failure(zq_inprocess, dashboard):
    """Remembering every quick success cost a worker about 30 % of its plain-job rate: at most one per
    task per `recent.SAMPLE_EVERY` is kept, the others are counted, and no failure is left out."""
    worker = zq_inprocess(job_tasks.registry)
    web, _ = dashboard(worker.endpoint)
    flood = 3000
    with zqsync.Client(worker.endpoint) as client:
        for n in range(flood):
            client.enqueue("add", n, 1)
            if n % 100 == 0:
                client.enqueue("boom", f"plain {n}")
        worker.wait(lambda counters: counters["jobs_succeeded"] == flood and counters["jobs_failed"] == flood // 100)
    answer = _result(web, "/api/v1/recent?limit=1000")
    kept = [row for row in answer["finished"] if row["task"] == "add"]
    failed = [row for row in answer["finished"] if row["state"] == "failed"]
    assert 0 < len(kept) <= recent.PER_TASK and answer["unsampled"] > 0
    assert len(failed) == flood // 100
