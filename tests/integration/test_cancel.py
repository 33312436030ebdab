"""Cancel: a delayed job never runs, a running task is interrupted where it yields and recorded
cancelled, a finished job is left alone; and the same from ``zqsync jobs cancel``.

The worker core runs in-process (``zq_inprocess``); the tests wait on its counters. A kept plain job's
skipped retry, seen only in the worker's log, is watched on a worker process.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for
from tests.integration import job_tasks

TASKS = "tests.integration.job_tasks:registry"


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def jobs_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zqsync", "jobs", "cancel", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def journaled(zq_inprocess, tmp_path):
    return zq_inprocess(job_tasks.registry, state_dir=str(tmp_path / "state"))


def running(counters) -> bool:
    """A task has started (it has yielded: what it did before its first yield is done)."""
    return counters["in_flight"] == 1


@pytest.mark.timeout(60)
def test_a_cancelled_delayed_job_never_runs(journaled, tmp_path):
    out = tmp_path / "out"
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("stamp", args=(str(out), "x"), delay=1.0)
        marker = client.enqueue_with_options("stamp", args=(str(out), "marker"), delay=1.5)
        status = client.cancel(job_id)
        assert (status.state, status.worker) == ("cancelled", journaled.endpoint)
        assert client.result(marker, timeout=slack(20)) == "marker"  # the due time has passed meanwhile
        with pytest.raises(zqsync.JobCancelled):
            client.result(job_id, timeout=slack(5))
        assert client.job(job_id).attempts == 0
    assert [line.split()[0] for line in lines(out)] == ["marker"]


@pytest.mark.timeout(60)
def test_a_running_task_is_interrupted_and_recorded_cancelled_and_the_worker_goes_on(zq_inprocess, tmp_path):
    # One task slot, held by the task: the cancel (an admin call) must not wait for a slot.
    journaled = zq_inprocess(job_tasks.registry, state_dir=str(tmp_path / "state"), concurrency=1)
    out = tmp_path / "out"
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("slow", args=(str(out), "long", 30.0), confirm=True)
        journaled.wait(running)
        assert lines(out) == ["start long"]
        started = time.monotonic()
        status = client.cancel(job_id)
        assert time.monotonic() - started < slack(5)
        assert (status.state, status.attempts, status.error.remote_type) == ("cancelled", 1, "JobCancelled")
        with pytest.raises(zqsync.JobCancelled):
            client.result(job_id, timeout=slack(5))
        assert client.call("add", 1, 2) == 3
        assert client.call("zqsync.stats")["jobs_cancelled"] == 1
    time.sleep(0.5)
    assert lines(out) == ["start long"], "the rest of the task never ran"


@pytest.mark.timeout(60)
def test_a_finished_or_unknown_job_is_not_cancelled(journaled):
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("add", args=(1, 1), confirm=True)
        assert client.result(job_id, timeout=slack(20)) == 2
        assert client.cancel(job_id).state == "done"
        assert client.cancel("never-sent").state == "unknown"
        assert client.result(job_id, timeout=slack(5)) == 2


@pytest.mark.timeout(90)
def test_the_cli_cancels_a_delayed_job_in_the_journal_and_a_running_one_over_rpc(journaled, tmp_path):
    state, out = tmp_path / "state", tmp_path / "out"
    with zqsync.Client(journaled.endpoint) as client:
        delayed = client.enqueue_with_options("stamp", args=(str(out), "x"), delay=60.0)
        running_id = client.enqueue_with_options("slow", args=(str(out), "long", 30.0), confirm=True)
        journaled.wait(running)
        local = jobs_cli(delayed, "--state-dir", str(state))
        assert local.returncode == 0 and "cancelled 1 job(s)" in local.stdout, local.stderr
        refused = jobs_cli(running_id, "--state-dir", str(state))
        assert refused.returncode == 1 and "use --endpoint" in refused.stdout
        remote = jobs_cli(running_id, "--endpoint", journaled.endpoint)
        assert remote.returncode == 0 and f"{running_id}: cancelled" in remote.stdout, remote.stderr
        assert [client.job(job_id).state for job_id in (delayed, running_id)] == ["cancelled", "cancelled"]
    assert lines(out) == ["start long"]


@pytest.mark.timeout(60)
def test_a_job_cancelled_while_it_waits_for_a_retry_is_not_retried(journaled, tmp_path):
    out, marks = tmp_path / "out", tmp_path / "marks"
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("failing", args=(str(out), "f"), confirm=True)
        journaled.wait(lambda counters: counters["jobs_retried"] == 1)  # the first attempt failed
        assert client.job(job_id).state == "scheduled"
        assert client.cancel(job_id).state == "cancelled"
        marker = client.enqueue_with_options("stamp", args=(str(marks), "m"), delay=2.0)  # past the 1 s backoff
        assert client.result(marker, timeout=slack(20)) == "m"
        status = client.job(job_id)
        with pytest.raises(zqsync.JobCancelled):
            client.result(job_id, timeout=slack(5))
    assert (status.state, status.attempts) == ("cancelled", 1)
    assert lines(out) == ["f"], "a cancelled job must not run again when its retry timer fires"


@pytest.mark.timeout(60)
def test_a_kept_plain_job_cancelled_while_it_waits_for_a_retry_is_not_retried(zq_worker, tmp_path):
    worker, out = zq_worker(TASKS), tmp_path / "out"  # no journal: the status lives in the worker's memory
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("failing", args=(str(out), "p"), store_result=True)
        wait_for(lambda: client.job(job_id).state == "scheduled", what="the first attempt to fail")
        assert client.cancel(job_id).state == "cancelled"
        wait_for(lambda: worker.stats()["jobs_retried"] == 1 and "skipped" in worker.output(),
                 timeout=10, what="the retry timer to fire and the attempt to be skipped")
        with pytest.raises(zqsync.JobCancelled):
            client.result(job_id, timeout=slack(5))
    assert lines(out) == ["p"]
