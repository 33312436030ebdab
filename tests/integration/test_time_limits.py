"""Time limits that hold for tasks that never yield, and tasks that cannot kill their worker (real workers)."""

from __future__ import annotations

import os
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for

TASKS = "tests.integration.blocking_tasks:registry"


@pytest.fixture
def worker(zq_worker, root):
    return zq_worker(TASKS, cwd=root, concurrency=4)


def test_a_task_that_never_yields_is_interrupted_at_its_time_limit(worker):
    with zqsync.Client(worker.endpoint, call_timeout=slack(20.0)) as client:
        started = time.monotonic()
        with pytest.raises(zqsync.TimeLimitExceeded, match="time limit of 0.5 s"):
            client.call("cpu", 3.0)
        assert time.monotonic() - started < 2.5 * slack(1.0)  # not the task's 3 s
        assert client.call("zqsync.ping") == "pong"
        assert client.call("add", 1, 2) == 3
    stats = worker.stats()
    assert stats["timed_out"] == 1 and stats["calls_failed"] == 1


def test_a_task_that_never_yields_sees_its_soft_limit_cleans_up_and_still_meets_its_hard_limit(worker, tmp_path):
    path = tmp_path / "notes"
    with zqsync.Client(worker.endpoint, call_timeout=slack(20.0)) as client:
        started = time.monotonic()
        assert client.call("cpu_tidy", str(path), 30.0) == "cleaned up"
        assert time.monotonic() - started < slack(5.0)  # not the task's 30 s
        with pytest.raises(zqsync.TimeLimitExceeded, match="time limit of 0.8 s"):
            client.call("cpu_stubborn", str(path), 30.0)
        assert client.call("add", 1, 2) == 3
    assert path.read_text().splitlines() == ["cleaned up", "soft limit seen"]


def test_work_after_an_overrun_never_happens(worker, tmp_path):
    path = str(tmp_path / "side-effect")
    with zqsync.Client(worker.endpoint, call_timeout=slack(20.0)) as client:
        with pytest.raises(zqsync.TimeLimitExceeded):
            client.call("cpu_then_write", path, 2.0)
        client.enqueue("cpu_then_write", path, 2.0)
        wait_for(lambda: worker.stats()["timed_out"] == 2, what="the job's time limit")
    time.sleep(0.2)
    assert not os.path.exists(path)


def test_a_task_holding_the_gil_past_its_hard_limit_ends_the_process_with_its_traceback(worker):
    with zqsync.Client(worker.endpoint, call_timeout=0.5) as client:
        with pytest.raises(zqsync.CallTimeout):
            client.call("catastrophic_regex")
    status = worker.proc.wait(timeout=slack(30.0))
    assert status == 1
    output = worker.output()
    assert "Timeout" in output and "catastrophic_regex" in output  # where it was stuck


@pytest.mark.parametrize("task, remote_type", [("exits", "SystemExit"), ("interrupts", "KeyboardInterrupt")])
def test_sys_exit_or_keyboard_interrupt_in_a_task_fails_only_that_task(worker, task, remote_type):
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        with pytest.raises(zqsync.RemoteError) as raised:
            client.call(task)
        assert raised.value.remote_type == remote_type
        for _ in range(20):
            client.enqueue(task)
        wait_for(lambda: worker.stats()["jobs_failed"] == 20, what="20 failed jobs")
        assert client.call("add", 2, 2) == 4
    assert worker.proc.poll() is None
