"""The prefork supervisor with real processes: restarts, boot errors, shutdowns, and confirmed
jobs that survive SIGKILL of a child or of the supervisor itself, in direct mode (the default) or with the
router (``--router``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter

import pytest

import zqsync
from tests.helpers import JobStream, children_of, over_prefork_modes, pid_exists, wait_for
from tests.integration.test_deploy import settled
from zqsync.worker.dispatch import CREDITS_MAX

JOBS = 2000


def supervised(zq_worker, tmp_path, app="zqsync.demo.tasks:registry", processes=2, concurrency=100, mode=(),
               **kwargs):
    args = ["--processes", str(processes), *mode, "--state-dir", str(tmp_path / "state"), "--graceful-timeout", "10"]
    return zq_worker(app, extra_args=args, concurrency=concurrency, **kwargs)


def serving_pids(client: zqsync.Client, calls: int = 40) -> set[int]:
    return {client.call("zqsync.stats")["pid"] for _ in range(calls)}


def count_lines(path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


class ConfirmedSender(threading.Thread):
    """Sends JOBS confirmed ``record`` jobs, one line each, from a thread of its own.

    Each job takes 20 ms and the workers are given few slots, so a backlog of
    journaled, acknowledged, not yet run jobs builds up: what a kill must not lose.
    """

    def __init__(self, endpoint: str, target) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.target = endpoint, target
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with zqsync.Client(self.endpoint, confirm_timeout=90.0) as client:
                for index in range(JOBS):
                    client.enqueue_with_options("record", args=(str(self.target), str(index), 0.02), confirm=True)
                    self.sent = index + 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def assert_every_job_ran_at_least_once(target) -> None:
    seen = wait_for(lambda: (c := count_lines(target)) and len(c) == JOBS and c, timeout=90,
                    what=f"all {JOBS} jobs to run")
    duplicates = sum(seen.values()) - JOBS
    print(f"jobs sent {JOBS}, executed {sum(seen.values())}, duplicates {duplicates}, lost 0")
    assert set(seen) == {str(index) for index in range(JOBS)}


def test_children_share_one_address_and_a_killed_child_is_restarted(zq_worker, tmp_path):
    """The router spreads one client's calls over every child (direct: ``test_direct_prefork.py``)."""
    supervisor = supervised(zq_worker, tmp_path, mode=["--router"])
    with zqsync.Client(supervisor.endpoint) as client:
        first = wait_for(lambda: len(p := serving_pids(client)) == 2 and p, what="both children to answer")
        assert set(children_of(supervisor.pid)) == first
        victim = sorted(first)[0]
        os.kill(victim, signal.SIGKILL)
        replaced = wait_for(lambda: len(c := set(children_of(supervisor.pid))) == 2 and victim not in c and c,
                            what="the killed child to be replaced")
        wait_for(lambda: serving_pids(client) == replaced, what="calls to reach the new child")
    assert "restarting in" in supervisor.output()


def logged_losses(output: str) -> int:
    """Plain jobs the supervisor's log counts as lost with children that exited, or as not sendable to one."""
    held = sum(int(n) for n in re.findall(r"exited holding (\d+) plain job", output))
    return held + output.count("dropped a job message")


def test_the_plain_jobs_a_sigkilled_child_held_are_counted(zq_worker, tmp_path):
    """Plain jobs stream to 2 children; a child is SIGKILLed 3 times. Losing the jobs it had not started is
    the documented at-most-once behaviour; each of them is counted, in the log and in the stats. A child
    that ran jobs in the instant before its kill may not have said so: at most ``CREDITS_MAX`` per kill
    are counted that in fact ran. Before the fix, 0-8 jobs were lost per kill and the log counted 2 of 23."""
    supervisor = supervised(zq_worker, tmp_path, concurrency=4, mode=["--router"])
    target = tmp_path / "ran.txt"
    stream = JobStream(supervisor.endpoint, target, burst=20)
    stream.start()
    kills = 3
    for kill in range(kills):
        wait_for(lambda kill=kill: len(count_lines(target)) >= 1000 * (kill + 1), what="the load to be under way")
        os.kill(children_of(supervisor.pid)[0], signal.SIGKILL)
        wait_for(lambda kill=kill: supervisor.output().count("started worker child") == 3 + kill, what="the child's restart")
    wait_for(lambda: len(count_lines(target)) >= 1000 * (kills + 1), what="the load to go on")
    stream.stop()
    assert stream.error is None
    ran = settled(target, stream.accepted)
    lost, counted = stream.accepted - len(ran), logged_losses(supervisor.output())
    print(f"accepted {stream.accepted}, executed {sum(ran.values())}, lost {lost}, counted (log) {counted}")
    assert max(ran.values()) == 1
    assert lost <= counted <= lost + CREDITS_MAX * kills
    with zqsync.Client(supervisor.endpoint) as client:
        assert client.call("zqsync.stats")["supervisor"]["jobs_lost_in_children"] == counted


@over_prefork_modes
def test_a_child_that_fails_to_boot_halts_the_supervisor_with_a_clear_message(tmp_path, mode):
    result = subprocess.run(
        [sys.executable, "-m", "zqsync", "worker", "no_such_module_xyz:registry", "--bind", "tcp://127.0.0.1:0",
         "--processes", "2", *mode], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 3
    assert "cannot import 'no_such_module_xyz'" in result.stderr
    assert "before it finished booting; halting" in result.stderr


@over_prefork_modes
def test_confirmed_jobs_survive_sigkill_of_a_child(zq_worker, tmp_path, mode):
    supervisor = supervised(zq_worker, tmp_path, concurrency=4, mode=mode)
    target = tmp_path / "records.txt"
    sender = ConfirmedSender(supervisor.endpoint, target)
    sender.start()
    wait_for(lambda: sender.sent >= JOBS // 4, what="a quarter of the jobs to be confirmed")
    os.kill(children_of(supervisor.pid)[0], signal.SIGKILL)
    sender.join(120)
    assert sender.error is None and sender.sent == JOBS
    assert_every_job_ran_at_least_once(target)


@over_prefork_modes
def test_confirmed_jobs_survive_sigkill_of_the_supervisor(zq_worker, tmp_path, mode):
    supervisor = supervised(zq_worker, tmp_path, concurrency=4, mode=mode)
    target = tmp_path / "records.txt"
    sender = ConfirmedSender(supervisor.endpoint, target)
    sender.start()
    wait_for(lambda: sender.sent >= JOBS // 4, what="a quarter of the jobs to be confirmed")
    orphans = children_of(supervisor.pid)
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.proc.wait(10)
    wait_for(lambda: not any(pid_exists(pid) for pid in orphans), timeout=40, what="the orphaned children to exit")
    supervised(zq_worker, tmp_path, concurrency=4, mode=mode, bind=supervisor.endpoint)  # same address, journal
    sender.join(120)
    assert sender.error is None and sender.sent == JOBS
    assert_every_job_ran_at_least_once(target)


@over_prefork_modes
def test_warm_shutdown_lets_in_flight_tasks_complete(zq_worker, tmp_path, mode):
    supervisor = supervised(zq_worker, tmp_path, mode=mode)
    results: list = []
    with zqsync.Client(supervisor.endpoint, call_timeout=30) as client:
        callers = [threading.Thread(target=lambda: results.append(client.call("sleep", 1.0))) for _ in range(4)]
        for caller in callers:
            caller.start()
        wait_for(lambda: supervisor.stats()["in_flight"] >= 1, what="sleep tasks to be running")
        os.kill(supervisor.pid, signal.SIGTERM)
        for caller in callers:
            caller.join(30)
    assert results == [1.0] * 4
    assert supervisor.proc.wait(30) == 0


def test_cold_shutdown_keeps_confirmed_jobs_in_the_journal_for_the_next_start(zq_worker, tmp_path):
    """A confirmed job waiting for its retry (2 s backoff) when QUIT arrives runs after the next start."""
    app = "tests.integration.journal_tasks:registry"
    supervisor = supervised(zq_worker, tmp_path, app=app)
    target = tmp_path / "later.txt"
    with zqsync.Client(supervisor.endpoint) as client:
        client.enqueue_with_options("fail_first", args=(str(target), "after-restart"), confirm=True)
    wait_for(lambda: os.path.exists(f"{target}.after-restart.tried"), what="the first, failing attempt")
    os.kill(supervisor.pid, signal.SIGQUIT)
    assert supervisor.proc.wait(30) == 0
    listed = subprocess.run([sys.executable, "-m", "zqsync", "jobs", "--state-dir", str(tmp_path / "state")],
                            capture_output=True, text=True, timeout=60)
    assert "fail_first" in listed.stdout and "pending" in listed.stdout
    assert not target.exists()
    supervised(zq_worker, tmp_path, app=app)
    wait_for(lambda: target.exists() and target.read_text() == "after-restart\n", timeout=60,
             what="the journaled job to run after the restart")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_supervisor_exits_zero_and_leaves_no_children(zq_worker, tmp_path, signum):
    supervisor = supervised(zq_worker, tmp_path)
    children = children_of(supervisor.pid)
    assert len(children) == 2
    os.kill(supervisor.pid, signum)
    assert supervisor.proc.wait(30) == 0
    assert not any(pid_exists(pid) for pid in children)
