"""Real worker processes on one PostgreSQL journal (``--journal postgresql://...``): confirmed jobs
committed before their acknowledgement, ids unique fleet-wide, and the jobs of a worker killed for
good taken over by another once its lease expires. The server is real (``tests/pgserver.py``); the
tests skip with the reason where none can be started."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'zqsync[postgresql]')")

#: Seconds of each worker's lease here: a killed worker's jobs are taken over about this long after.
LEASE = 1.0


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def states(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        return dict(db.execute("SELECT state, count(*) FROM zqsync_jobs GROUP BY state").fetchall())


@pytest.fixture
def pg_worker(zq_worker, pg_url):
    def start(*extra: str):
        return zq_worker(extra_args=["--journal", pg_url, "--journal-lease", str(LEASE), *extra])

    return start


def test_a_confirmed_job_is_committed_to_postgresql_before_its_acknowledgement(pg_worker, pg_url, tmp_path):
    worker = pg_worker()
    target = tmp_path / "out.txt"
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("record", args=(str(target), "later"), confirm=True, delay=3600)
        with psycopg.connect(pg_url) as db:  # acknowledged: its row is there for any other connection
            assert db.execute("SELECT task, state, next_at > extract(epoch FROM now()) + 3000 FROM zqsync_jobs"
                              " WHERE id = %s", (job_id,)).fetchone() == ("record", "pending", True)
        done = client.enqueue_with_options("add", args=(2, 3), confirm=True)
        assert client.result(done, timeout=slack(10)) == 5
    wait_for(lambda: states(pg_url).get("done") == 1, what="the done row committed")


def test_the_same_confirmed_job_id_sent_to_two_workers_of_one_fleet_runs_once(pg_worker, pg_url, tmp_path):
    first, second = pg_worker(), pg_worker()
    target = tmp_path / "out.txt"
    with zqsync.Client(first.endpoint) as one, zqsync.Client(second.endpoint) as two:
        one.enqueue_with_options("record", args=(str(target), "once"), confirm=True, job_id="tick-1")
        two.enqueue_with_options("record", args=(str(target), "once"), confirm=True, job_id="tick-1")
        wait_for(lambda: states(pg_url).get("done") == 1, what="the job done")
        two.enqueue_with_options("record", args=(str(target), "once"), confirm=True, job_id="tick-1")
    assert [worker.stats()["confirmed_duplicates"] for worker in (first, second)] == [0, 2]
    assert lines(target) == ["once"]


def test_the_acknowledged_jobs_of_a_worker_killed_for_good_run_on_another(pg_worker, pg_url, tmp_path):
    lost, survivor = pg_worker(), pg_worker()
    target = tmp_path / "out.txt"
    with zqsync.Client(lost.endpoint) as client:  # pending on the lost worker when it dies: due in 5 s
        acknowledged = [client.enqueue_with_options("record", args=(str(target), f"job-{n}"), confirm=True, delay=5.0)
                        for n in range(200)]
    lost.kill()  # SIGKILL, with no stop: its lease is left to expire
    killed = time.monotonic()
    assert lines(target) == [], "none was due before the kill"
    wait_for(lambda: len(lines(target)) >= 200, timeout=30, what="every acknowledged job run")
    took = time.monotonic() - killed
    assert sorted(lines(target)) == sorted(f"job-{n}" for n in range(200)), "each ran once"
    assert len(acknowledged) == 200 and took < slack(5.0 + LEASE + 10)
    assert survivor.stats()["jobs_succeeded"] == 200
    wait_for(lambda: states(pg_url) == {"done": 200}, what="every row done")


def test_zqsync_jobs_lists_and_cancels_the_whole_fleets_jobs_from_the_database(pg_worker, pg_url, tmp_path):
    first, second = pg_worker(), pg_worker()
    ids = []
    for worker in (first, second):
        with zqsync.Client(worker.endpoint) as client:
            ids.append(client.enqueue_with_options("record", args=(str(tmp_path / "out"), "x"), confirm=True,
                                                   delay=3600))

    def jobs(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zqsync", "jobs", *args, "--journal", pg_url],
                              capture_output=True, text=True, timeout=slack(60))

    listed = jobs("--state", "pending", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(line)["id"] for line in listed.stdout.splitlines()) == sorted(ids)
    cancelled = jobs("cancel", ids[1])
    assert (cancelled.returncode, cancelled.stdout.splitlines()[-1]) == (0, "cancelled 1 job(s)")
    assert states(pg_url) == {"pending": 1, "cancelled": 1}
    refused = jobs("recover")
    assert refused.returncode != 0 and "only a SQLite journal is recovered" in refused.stderr


def test_any_worker_of_the_fleet_answers_for_a_job_another_one_ran(pg_worker):
    ran, other = pg_worker(), pg_worker()
    with zqsync.Client(ran.endpoint) as client:
        job_id = client.enqueue_with_options("add", args=(20, 22), confirm=True)
        assert client.result(job_id, timeout=slack(10)) == 42
    with zqsync.Client(other.endpoint) as elsewhere:  # knows only the worker that did not run it
        assert elsewhere.result(job_id, timeout=slack(10)) == 42
        status = elsewhere.job(job_id)
    assert (status.state, status.worker) == ("done", other.endpoint)
    assert other.stats()["jobs_succeeded"] == 0
