"""A busy worker still answers its admin calls, and calls or jobs whose caller gave up do not run
(real worker processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator

import pytest

import zqsync
from tests.helpers import slack, wait_for
from zqsync.wire.envelope import CLOCK_SKEW

TASKS = "tests.integration.stuck_tasks:registry"
CONCURRENCY = 2


@contextlib.contextmanager
def _busy(worker, calls: int, seconds: float, in_flight: int = CONCURRENCY) -> Iterator[None]:
    """``calls`` cooperative naps of ``seconds`` each, sent from threads: they fill the task slots and
    wait for them. On exit the worker is stopped (its naps end with an error, ignored) and the threads joined."""

    def nap() -> None:
        with zqsync.Client(worker.endpoint, call_timeout=slack(30.0)) as client:
            try:
                client.call("nap", seconds)
            except zqsync.ZqsyncError:
                pass  # the stop at the end of the test

    threads = [threading.Thread(target=nap, daemon=True) for _ in range(calls)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: worker.stats()["in_flight"] == in_flight, what="every slot busy")
        yield
    finally:
        worker.stop()
        for thread in threads:
            thread.join(slack(30.0))


@pytest.mark.timeout(60)
def test_ping_and_stats_answer_within_100_ms_while_every_slot_is_busy_and_calls_and_jobs_wait(zq_worker, root):
    worker = zq_worker(TASKS, cwd=root, concurrency=CONCURRENCY, extra_args=["--graceful-timeout", "0.5"])
    with _busy(worker, CONCURRENCY + 4, 10.0), zqsync.Client(worker.endpoint, call_timeout=slack(5.0)) as client:
        for _ in range(20):
            client.enqueue("nap", 10.0)  # jobs back up behind the busy slots too
        latencies = []
        for name in ["zqsync.ping", "zqsync.stats"] * 5:
            started = time.perf_counter()
            client.call_with_options(name, timeout=1.0)
            latencies.append(time.perf_counter() - started)
        stats = client.call("zqsync.stats")
    assert max(latencies) < slack(0.1), latencies
    assert stats["in_flight"] == CONCURRENCY and stats["calls_succeeded"] == 0  # the naps are all still running


@pytest.mark.timeout(60)
def test_every_busy_prefork_child_answers_stats_within_100_ms(zq_worker, root):
    """A prefork worker's stats gather every child's: each answers although its one slot is busy. (The router
    gives each child one of the naps; a direct child gets whichever connections the kernel gives it.)"""
    worker = zq_worker(TASKS, cwd=root, concurrency=1,
                       extra_args=["--processes", "2", "--router", "--graceful-timeout", "0.5"])
    with _busy(worker, 4, 10.0, in_flight=2), zqsync.Client(worker.endpoint, call_timeout=slack(5.0)) as client:
        latencies = []
        for _ in range(10):
            started = time.perf_counter()
            stats = client.call_with_options("zqsync.stats", timeout=1.0)
            latencies.append(time.perf_counter() - started)
            assert stats["unreachable"] == 0
            assert [child["in_flight"] for child in stats["children"]] == [1, 1]
    assert max(latencies) < slack(0.1), latencies


@pytest.mark.timeout(60)
def test_zqsync_ping_exits_0_on_a_busy_worker_and_1_when_nobody_answers(zq_worker, root):
    worker = zq_worker(TASKS, cwd=root, concurrency=CONCURRENCY, extra_args=["--graceful-timeout", "0.5"])
    command = [sys.executable, "-m", "zqsync", "ping", worker.endpoint, "--timeout", "1"]
    with _busy(worker, CONCURRENCY + 2, 10.0):
        alive = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith(f"pong from {worker.endpoint} in ") and alive.stdout.rstrip().endswith(" ms")
    dead = subprocess.run(command[:-1] + ["0.3"], capture_output=True, text=True, timeout=30)
    assert dead.returncode == 1
    assert f"no pong from {worker.endpoint} within 0.3 s" in dead.stderr and "CallTimeout" in dead.stderr


@pytest.mark.timeout(60)
def test_a_call_that_timed_out_against_a_stopped_worker_does_not_run_after_it_resumes(zq_worker, root, tmp_path):
    worker = zq_worker(TASKS, cwd=root, concurrency=CONCURRENCY)
    abandoned, kept = str(tmp_path / "abandoned"), str(tmp_path / "kept")
    with zqsync.Client(worker.endpoint) as client:
        client.call("zqsync.ping")  # connect the pooled sockets first: a stopped worker completes no handshake
        client.enqueue("nap", 0)
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            with pytest.raises(zqsync.CallTimeout):
                client.call_with_options("touch", args=(abandoned,), timeout=0.5)
            client.enqueue_with_options("touch", args=(abandoned,), deadline=0.5)
            client.enqueue("touch", kept)  # no deadline: the old format, it runs whenever it is read
            time.sleep(0.5 + CLOCK_SKEW + 0.5)  # past both deadlines, by either clock
        finally:
            os.kill(worker.pid, signal.SIGCONT)
    wait_for(lambda: os.path.exists(kept), what="the job without a deadline")
    stats = wait_for(lambda: (lambda s: s if s["calls_expired"] + s["jobs_expired"] == 2 or os.path.exists(abandoned)
                              else None)(worker.stats()), what="the expired call and job")
    assert not os.path.exists(abandoned), "a request whose caller had given up ran"
    assert stats["calls_expired"] == 1 and stats["jobs_expired"] == 1
    assert stats["calls_succeeded"] == 0 and stats["jobs_succeeded"] == 2
    assert "its deadline passed" in worker.output()


@pytest.mark.timeout(60)
def test_a_call_within_its_deadline_runs_and_a_late_one_that_waited_for_a_slot_does_not(zq_worker, root, tmp_path):
    worker = zq_worker(TASKS, cwd=root, concurrency=1)
    late = str(tmp_path / "late")
    with zqsync.Client(worker.endpoint) as client:
        nap = threading.Thread(target=client.call, args=("nap", 1.5))
        nap.start()
        wait_for(lambda: worker.stats()["in_flight"] == 1, what="the slot busy")
        with pytest.raises(zqsync.CallTimeout):
            client.call_with_options("touch", args=(late,), timeout=0.5)  # waits for the slot past its deadline
        nap.join(slack(30.0))
        assert client.call_with_options("touch", args=(str(tmp_path / "in-time"),), timeout=slack(5.0)) == "touched"
    stats = worker.stats()
    assert not os.path.exists(late)
    assert stats["calls_expired"] == 1 and stats["calls_succeeded"] == 2


@pytest.mark.timeout(60)
def test_a_call_still_waiting_for_a_slot_at_a_cold_stop_is_refused_not_run(zq_worker, root, tmp_path):
    worker = zq_worker(TASKS, cwd=root, concurrency=1)
    waiting = str(tmp_path / "waiting")
    errors: dict[str, zqsync.RemoteError] = {}

    def call(name: str, task: str, *args) -> None:
        with zqsync.Client(worker.endpoint, call_timeout=slack(30.0)) as client:
            try:
                client.call(task, *args)
            except zqsync.RemoteError as exc:
                errors[name] = exc

    callers = [threading.Thread(target=call, args=("running", "nap", 30.0))]
    callers[0].start()
    wait_for(lambda: worker.stats()["in_flight"] == 1, what="the slot busy")
    callers.append(threading.Thread(target=call, args=("waiting", "touch", waiting)))
    callers[1].start()
    time.sleep(0.3)  # the second call reaches the worker and waits for the slot
    os.kill(worker.pid, signal.SIGQUIT)
    for caller in callers:
        caller.join(slack(30.0))
    assert worker.proc.wait(slack(10.0)) == 1
    assert type(errors["running"]) is zqsync.WorkerShutdown
    assert type(errors["waiting"]) is zqsync.WorkerStopping  # not run: safe to retry elsewhere
    assert not os.path.exists(waiting)
