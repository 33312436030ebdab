"""Fleet-wide status with the PostgreSQL journal (issue 24, item 4): two workers on one database,
each asked about what the other journaled. The workers run in-process (``zq_inprocess``) on loopback;
the server is real (``tests/pgserver.py``) and the tests skip with the reason where none can be started.

A job run by worker A is seen done, its result fetched and a delayed job of A's cancelled through a
client of worker B only; the dashboard's journal API, watching only B, lists, requeues and cancels A's
jobs; two beats, one on each worker, send every tick once. ``zqsync jobs --journal URL`` over a fleet is
in ``test_journal_postgres.py``.
"""

from __future__ import annotations

import threading

import pytest

import zqsync
from tests import dashboard_process
from tests.helpers import slack, wait_for
from tests.integration import job_tasks
from zqsync.beat import Beat, Periodic
from zqsync.worker.inprocess import ended

pytestmark = pytest.mark.timeout(60)

#: Seconds of each worker's lease: long enough that neither loses its rows during a test.
LEASE = 10.0


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def fleet(pg_url, zq_inprocess):
    """``fleet(registry)``: workers A and B on one PostgreSQL journal (stopped before it is dropped)."""
    def start(registry):
        return [zq_inprocess(registry, journal=pg_url, journal_lease=LEASE) for _ in "AB"]

    return start


def test_a_job_run_by_one_worker_is_seen_fetched_and_cancelled_through_another(fleet, tmp_path):
    a, b = fleet(job_tasks.registry)
    out = tmp_path / "out"
    with zqsync.Client(a.endpoint) as on_a:
        done = on_a.enqueue_with_options("add", args=(20, 22), confirm=True)
        later = on_a.enqueue_with_options("stamp", args=(str(out), "cancelled"), confirm=True, delay=1.0)
        marker = on_a.enqueue_with_options("stamp", args=(str(out), "marker"), confirm=True, delay=1.5)
        a.wait(lambda counters: ended(counters) >= 1)
        with zqsync.Client(b.endpoint) as on_b:  # knows only the worker that did not journal them
            status = on_b.job(done)
            assert (status.state, status.worker, status.attempts) == ("done", b.endpoint, 1)
            assert on_b.result(done, timeout=slack(10)) == 42
            cancelled = on_b.cancel(later)
            assert (cancelled.state, cancelled.worker) == ("cancelled", b.endpoint)
            with pytest.raises(zqsync.JobCancelled):
                on_b.result(later, timeout=slack(5))
        assert on_a.result(marker, timeout=slack(20)) == "marker"  # due after the cancelled one
        assert on_a.job(later).state == "cancelled"
    assert [line.split()[0] for line in lines(out)] == ["marker"]
    assert b.worker.runner.counters["jobs_succeeded"] == 0


def test_the_dashboard_watching_one_worker_lists_requeues_and_cancels_the_other_ones_jobs(fleet, tmp_path):
    from zqsync.dashboard.app import create_app
    from zqsync.dashboard.fleet import Fleet

    a, b = fleet(dashboard_process.registry)
    flag = str(tmp_path / "flag")
    with zqsync.Client(a.endpoint) as on_a:
        dead = on_a.enqueue_with_options("needs_file", args=[flag], confirm=True)
        delayed = on_a.enqueue_with_options("add", args=[1, 2], confirm=True, delay=3600)
        a.wait(lambda counters: counters["jobs_failed"] == 1)
    watched = Fleet([b.endpoint])
    try:
        page = create_app(watched).test_client()
        with page.session_transaction() as session:
            session["csrf"] = "token"

        def get(path: str):
            answer = page.get(path)
            assert answer.status_code == 200, answer.get_data(as_text=True)
            return answer.get_json()

        def post(path: str, body: dict):
            answer = page.post(path, json={"endpoint": b.endpoint, **body}, headers={"X-CSRF-Token": "token"})
            assert answer.status_code == 200, answer.get_data(as_text=True)
            return answer.get_json()["result"]

        rows = get("/api/jobs?state=dead")["workers"][0]["result"]["rows"]
        assert [(row["id"], row["task"]) for row in rows] == [(dead, "needs_file")]
        assert get(f"/api/job/{dead}")["found"][0]["result"]["state"] in ("dead", "failed")
        open(flag, "w").close()
        assert post("/api/requeue", {"ids": [dead]})["requeued"] == 1
        wait_for(lambda: get(f"/api/job/{dead}")["found"][0]["result"]["state"] == "done",
                 what="the requeued job to run on either worker")
        scheduled = get("/api/jobs?state=scheduled")["workers"][0]["result"]["rows"]
        assert [row["id"] for row in scheduled] == [delayed]
        assert post("/api/cancel", {"id": delayed})["cancelled"] is True
        assert get("/api/jobs")["workers"][0]["result"]["counts"] == {"done": 1, "cancelled": 1}
    finally:
        watched.stop()


def test_two_beats_on_two_workers_of_one_journal_send_each_tick_once(fleet, tmp_path):
    workers = fleet(job_tasks.registry)
    out, ticks = tmp_path / "out", 20
    start = 1_800_000_000.0  # a virtual clock: both beats go through the same 20 ticks at once

    def beat(worker) -> None:
        now = [start]

        def wait(seconds: float) -> None:
            now[0] += seconds
            if now[0] > start + ticks:
                runner.stop()

        with zqsync.Client(worker.endpoint) as client:
            runner = Beat([Periodic.build("stamp", every=1.0, args=(str(out), "tick"))],
                          lambda task, args, kwargs, job_id: client.enqueue_with_options(
                              task, args=args, kwargs=kwargs, confirm=True, job_id=job_id),
                          clock=lambda: now[0], wait=wait)
            runner.run()
        sent.append(runner.counters)

    sent: list[dict] = []
    beats = [threading.Thread(target=beat, args=(worker,)) for worker in workers]
    for thread in beats:
        thread.start()
    for thread in beats:
        thread.join(slack(30))
    assert [counters["ticks_sent"] for counters in sent] == [ticks, ticks]
    counters = [worker.worker.runner.counters for worker in workers]
    accepted = sum(c["confirmed_accepted"] for c in counters)
    wait_for(lambda: sum(c["jobs_succeeded"] for c in counters) >= accepted, what="every accepted tick run")
    assert (accepted, sum(c["confirmed_duplicates"] for c in counters)) == (ticks, ticks)
    assert len(lines(out)) == ticks
