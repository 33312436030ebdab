"""Confirmed enqueue: journaled before the ack, at least once, idempotent by job id, retries, dead letters.

The worker core runs in-process (``zq_inprocess``), and the tests wait on its counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import zqsync
from tests.helpers import slack
from tests.integration import journal_tasks
from zqsync.demo.tasks import registry as demo_registry


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_confirmed_job_runs_and_is_acknowledged_once_journaled(zq_inprocess, tmp_path):
    worker = zq_inprocess(demo_registry, state_dir=str(tmp_path / "state"))
    target = tmp_path / "out.txt"
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("record", args=(str(target), "durable"), confirm=True)
        assert client.stats()["confirmed"] == 1
    worker.join(1)
    assert lines(target) == ["durable"]
    assert len(job_id) == 32


def test_duplicate_job_id_is_acknowledged_but_not_run_twice(zq_inprocess, tmp_path):
    worker = zq_inprocess(demo_registry, state_dir=str(tmp_path / "state"))
    target = tmp_path / "out.txt"
    with zqsync.Client(worker.endpoint) as client:
        for _ in range(3):  # each acknowledged: the duplicates once journaled as such
            client.enqueue_with_options("record", args=(str(target), "once"), confirm=True, job_id="job-42")
    counters = worker.join(1)
    assert (counters["confirmed_accepted"], counters["confirmed_duplicates"]) == (1, 2)
    assert lines(target) == ["once"]


def test_worker_without_state_dir_refuses_confirmed_jobs_and_says_how_to_enable_them(zq_inprocess):
    worker = zq_inprocess(demo_registry)
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.RemoteError) as caught:
            client.enqueue_with_options("add", args=(1, 2), confirm=True)
    assert caught.value.remote_type == "NoJournal"
    assert "--state-dir" in caught.value.remote_message


def test_confirmed_job_for_an_unknown_task_is_refused_not_journaled(zq_inprocess, tmp_path):
    worker = zq_inprocess(demo_registry, state_dir=str(tmp_path / "state"))
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.UnknownTask):
            client.enqueue_with_options("nope", confirm=True)


def test_no_worker_raises_unconfirmed_after_retrying_until_the_deadline():
    with zqsync.Client("tcp://127.0.0.1:9", confirm_retry=0.1) as client:
        started = time.monotonic()
        with pytest.raises(zqsync.Unconfirmed) as caught:
            client.enqueue_with_options("add", args=(1, 2), confirm=True, send_timeout=0.6, job_id="lost-1")
        elapsed = time.monotonic() - started
        assert client.stats()["confirm_retries"] >= 3
    assert caught.value.job_id == "lost-1"
    assert 0.5 <= elapsed < slack(5.0)


def test_failed_job_is_retried_with_backoff_until_it_succeeds(zq_inprocess, tmp_path):
    worker = zq_inprocess(journal_tasks.registry, state_dir=str(tmp_path / "s"))
    target, key = tmp_path / "flaky.txt", tmp_path.name  # its attempts are counted per key in this process
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue_with_options("flaky", args=(str(target), key), confirm=True)
    counters = worker.join(1)
    assert lines(target) == [f"{key} attempt 1", f"{key} attempt 2", f"{key} attempt 3"]
    assert (counters["jobs_succeeded"], counters["jobs_retried"]) == (1, 2)


def test_job_that_exhausts_its_retries_is_dead_lettered_and_listed(zq_inprocess, tmp_path):
    state = tmp_path / "s"
    worker = zq_inprocess(journal_tasks.registry, state_dir=str(state))
    target = tmp_path / "doomed.txt"
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("doomed", args=(str(target),), confirm=True)
    worker.wait(lambda counters: counters["jobs_dead"] == 1)
    worker.stop()  # its outcome is in the journal the command reads
    assert lines(target) == ["doomed", "doomed"]  # first attempt + one retry
    listed = subprocess.run([sys.executable, "-m", "zqsync", "jobs", "--state-dir", str(state), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(row["id"], row["state"], row["attempts"]) for row in rows] == [(job_id, "dead", 2)]
    assert "ValueError: never works" in rows[0]["error"]


def test_jobs_command_without_a_journal_says_so(tmp_path):
    result = subprocess.run([sys.executable, "-m", "zqsync", "jobs", "--state-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no journal" in result.stderr
