"""Delayed jobs with real workers: journaled, run at or after their due time in due-time order, even
across a SIGKILL and restart; refused by a worker without a journal."""

from __future__ import annotations

import datetime
import signal
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for
from tests.integration import job_tasks

TASKS = "tests.integration.job_tasks:registry"


def stamps(path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    return [(key, float(when)) for key, when in (line.split() for line in path.read_text().splitlines())]


@pytest.mark.timeout(60)
def test_delayed_jobs_run_at_or_after_their_due_time_in_due_order(zq_inprocess, tmp_path):
    worker = zq_inprocess(job_tasks.registry, state_dir=str(tmp_path / "state"))
    out = tmp_path / "out"
    with zqsync.Client(worker.endpoint) as client:
        now = time.time()
        late = client.enqueue_with_options("stamp", args=(str(out), "late"), delay=2.0)
        soon = client.enqueue_with_options(
            "stamp", args=(str(out), "soon"), eta=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1))
        status = client.job(late)
        assert (status.state, status.attempts) == ("scheduled", 0)
        assert now + 2.0 <= status.due <= time.time() + 2.0
        assert client.result(soon, timeout=slack(20)) == "soon"
        assert client.result(late, timeout=slack(20)) == "late"
    ran = stamps(out)
    assert [key for key, _ in ran] == ["soon", "late"]
    assert ran[0][1] >= now + 1.0 and ran[1][1] >= now + 2.0


@pytest.mark.timeout(90)
def test_a_delayed_job_runs_once_after_its_worker_is_killed_and_restarted(zq_worker, tmp_path):
    state, out = tmp_path / "state", tmp_path / "out"
    first = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    with zqsync.Client(first.endpoint) as client:
        due = time.time() + 3.0
        job_id = client.enqueue_with_options("stamp", args=(str(out), "k"), delay=3.0)
    first.stop(sig=signal.SIGKILL)
    second = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    with zqsync.Client(second.endpoint) as client:
        wait_for(lambda: client.job(job_id).state == "scheduled", what="the new worker to claim the delayed job")
        assert client.result(job_id, timeout=slack(30)) == "k"
        assert client.job(job_id).pid == second.pid
    ran = stamps(out)
    assert [key for key, _ in ran] == ["k"] and ran[0][1] >= due


@pytest.mark.timeout(60)
def test_a_worker_without_a_journal_refuses_a_delayed_job_and_says_why(zq_worker, tmp_path):
    worker = zq_worker(TASKS)
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.NoJournal, match="delayed.*--state-dir"):
            client.enqueue_with_options("stamp", args=(str(tmp_path / "out"), "x"), delay=0.5)
    assert not (tmp_path / "out").exists()


def test_bad_delays_are_refused_before_anything_is_sent():
    with zqsync.Client("tcp://127.0.0.1:9") as client:
        for options in ({"delay": -1}, {"delay": float("nan")}, {"eta": datetime.datetime.now()},
                        {"delay": 1, "eta": datetime.datetime.now(datetime.timezone.utc)}):
            with pytest.raises(zqsync.ConfigurationError):
                client.enqueue_with_options("stamp", **options)
        assert client.stats()["confirmed"] == 0
