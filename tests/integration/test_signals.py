"""Stop signals that work whatever the tasks do (real worker processes, real signals)."""

from __future__ import annotations

import os
import signal
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for
from zqsync.worker.watchdog import HARD_STOP_GRACE

TASKS = "tests.integration.stuck_tasks:registry"
GRACE = 1.0
#: Seconds a stop may take past its grace period (the watchdog's detection, the shutdown, interpreter exit).
BOUND = 3.0


def _start_blocking(worker, task, path, *args):
    """Enqueue ``task`` and wait until it runs (it then blocks the worker's hub)."""
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue(task, path, *args)
    wait_for(lambda: os.path.exists(path), what=f"{task} to start")


def _stop_seconds(worker, *signals):
    started = time.monotonic()
    for signum in signals:
        os.kill(worker.pid, signum)
        time.sleep(0.1)
    status = worker.proc.wait(timeout=slack(30.0))
    return status, time.monotonic() - started


@pytest.mark.timeout(60)
@pytest.mark.parametrize("task, args", [("spin_forever", ()), ("c_sleep", (60,))])
def test_term_stops_a_worker_whose_task_blocks_the_hub_within_the_grace_period(zq_worker, root, tmp_path, task, args):
    worker = zq_worker(TASKS, cwd=root, concurrency=4, extra_args=["--graceful-timeout", str(GRACE)])
    _start_blocking(worker, task, str(tmp_path / "started"), *args)
    status, seconds = _stop_seconds(worker, signal.SIGTERM)
    assert seconds < GRACE + slack(BOUND), worker.output()
    assert status == 1, worker.output()  # a task was killed: a service manager restarts on failure
    assert "zqsync worker pid" in worker.output() and "stopped" in worker.output()  # a clean shutdown, not a crash


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signals", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGQUIT,)], ids=["term-term", "quit"])
@pytest.mark.parametrize("task, args", [("spin_forever", ()), ("c_sleep", (60,)), ("gil_regex", ())])
def test_a_second_term_or_quit_kills_a_blocking_task_at_once(zq_worker, root, tmp_path, task, args, signals):
    worker = zq_worker(TASKS, cwd=root, concurrency=4, extra_args=["--graceful-timeout", "60"])
    _start_blocking(worker, task, str(tmp_path / "started"), *args)
    status, seconds = _stop_seconds(worker, *signals)
    assert seconds < slack(BOUND), worker.output()
    assert status == 1, worker.output()


@pytest.mark.timeout(60)
def test_a_task_holding_the_gil_at_a_stop_is_ended_by_faulthandler_past_the_grace_period(zq_worker, root, tmp_path):
    """No Python runs while the regex holds the GIL: faulthandler's C timer, armed by the signal, is the backstop."""
    worker = zq_worker(TASKS, cwd=root, concurrency=4, extra_args=["--graceful-timeout", str(GRACE)])
    _start_blocking(worker, "gil_regex", str(tmp_path / "started"))
    status, seconds = _stop_seconds(worker, signal.SIGTERM)
    assert seconds < GRACE + HARD_STOP_GRACE + slack(BOUND), worker.output()
    assert status == 1
    assert "gil_regex" in worker.output()  # the traceback says where it was stuck


@pytest.mark.timeout(60)
def test_a_warm_stop_of_tasks_that_finish_in_time_exits_zero(zq_worker, root, tmp_path):
    worker = zq_worker(TASKS, cwd=root, concurrency=4, extra_args=["--graceful-timeout", "20"])
    _start_blocking(worker, "c_sleep", str(tmp_path / "started"), 0.5)
    status, seconds = _stop_seconds(worker, signal.SIGTERM)
    assert status == 0, worker.output()
    assert seconds < slack(BOUND)


@pytest.mark.timeout(90)
def test_term_stops_a_prefork_worker_whose_child_blocks_its_hub(zq_worker, root, tmp_path):
    worker = zq_worker(TASKS, cwd=root, concurrency=4,
                       extra_args=["--processes", "2", "--graceful-timeout", str(GRACE)])
    _start_blocking(worker, "spin_forever", str(tmp_path / "started"))
    status, seconds = _stop_seconds(worker, signal.SIGTERM)
    assert seconds < GRACE + slack(BOUND), worker.output()
    assert status == 1, worker.output()
