"""Deploys with real processes: HUP to a prefork supervisor replaces its children one at a time,
behind public sockets that stay bound, and no plain job is lost or run twice."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

import pytest

import zqsync
from tests.helpers import children_of, wait_for

pytestmark = pytest.mark.timeout(120)

JOBS = 10_000


def count_lines(path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


class Sender(threading.Thread):
    """Enqueues JOBS plain ``record`` jobs as fast as the client sends them."""

    def __init__(self, endpoint: str, target) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.target = endpoint, target
        self.accepted = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with zqsync.Client(self.endpoint, send_timeout=30.0) as client:
                for index in range(JOBS):
                    client.enqueue("record", str(self.target), str(index), 0.002)
                    self.accepted = index + 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def hup_and_wait(supervisor, retired_before: int) -> None:
    old = set(children_of(supervisor.pid))
    os.kill(supervisor.pid, signal.SIGHUP)
    wait_for(lambda: supervisor.output().count("retired with status") >= retired_before + len(old), timeout=60,
             what="every old child to be replaced")
    assert not old & set(children_of(supervisor.pid))


def test_hup_twice_under_full_load_runs_every_job_exactly_once(zq_worker, tmp_path):
    supervisor = zq_worker(extra_args=["--processes", "2", "--graceful-timeout", "10"], concurrency=4)
    target = tmp_path / "ran.txt"
    sender = Sender(supervisor.endpoint, target)
    sender.start()
    wait_for(lambda: sum(count_lines(target).values()) >= 1000, what="the load to be under way")
    hup_and_wait(supervisor, 0)
    wait_for(lambda: sender.accepted >= JOBS // 2 or not sender.is_alive(), timeout=60, what="half the jobs")
    hup_and_wait(supervisor, 2)
    sender.join(60)
    assert sender.error is None and sender.accepted == JOBS
    seen = wait_for(lambda: (c := count_lines(target)) and sum(c.values()) >= JOBS and c, timeout=30,
                    what=f"all {JOBS} jobs to run")  # fails here, with the count, if jobs were lost
    ran_twice = [line for line, times in seen.items() if times > 1]
    print(f"accepted {sender.accepted}, executed {sum(seen.values())}, distinct {len(seen)}, twice {len(ran_twice)}")
    print("\n".join(line for line in supervisor.output().splitlines() if "stopped taking jobs" in line))
    assert set(seen) == {str(index) for index in range(JOBS)} and not ran_twice
    assert supervisor.proc.poll() is None
