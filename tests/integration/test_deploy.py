"""Deploys with real processes: HUP to a prefork supervisor replaces its children one at a time,
behind public sockets that stay bound, and no plain job is lost or run twice."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter

import pytest

from tests.helpers import JobStream, children_of, over_prefork_modes, slack, wait_for
from tests.integration.test_stopping import logged_discards, logged_kills

pytestmark = pytest.mark.timeout(120)

JOBS = 10_000


def count_lines(path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def hup_and_wait(supervisor, retired_before: int) -> None:
    old = set(children_of(supervisor.pid))
    os.kill(supervisor.pid, signal.SIGHUP)
    wait_for(lambda: supervisor.output().count("retired with status") >= retired_before + len(old), timeout=60,
             what="every old child to be replaced")
    assert not old & set(children_of(supervisor.pid))


@over_prefork_modes
def test_hup_twice_under_full_load_runs_every_job_exactly_once(zq_worker, tmp_path, mode):
    supervisor = zq_worker(extra_args=["--processes", "2", *mode, "--graceful-timeout", "10"], concurrency=4)
    target = tmp_path / "ran.txt"
    sender = JobStream(supervisor.endpoint, target, jobs=JOBS, delay=0.002)
    sender.start()
    wait_for(lambda: sum(count_lines(target).values()) >= 1000, what="the load to be under way")
    hup_and_wait(supervisor, 0)
    wait_for(lambda: sender.accepted >= JOBS // 2 or not sender.is_alive(), timeout=60, what="half the jobs")
    hup_and_wait(supervisor, 2)
    sender.join(60)
    assert sender.error is None and sender.accepted == JOBS
    try:
        seen = wait_for(lambda: (c := count_lines(target)) and sum(c.values()) >= JOBS and c, timeout=30,
                        what=f"all {JOBS} jobs to run")
    except AssertionError:  # jobs were lost: say how many, and what the supervisor logged
        seen = count_lines(target)
        missing = sorted(set(range(JOBS)) - {int(line) for line in seen})
        print(f"ran {sum(seen.values())} of {JOBS}; missing {len(missing)}, first {missing[:20]}; "
              f"client stats {sender.stats}")
        print(supervisor.output())
        raise
    ran_twice = [line for line, times in seen.items() if times > 1]
    print(f"accepted {sender.accepted}, executed {sum(seen.values())}, distinct {len(seen)}, twice {len(ran_twice)}")
    print("\n".join(line for line in supervisor.output().splitlines() if "stopped taking jobs" in line))
    assert set(seen) == {str(index) for index in range(JOBS)} and not ran_twice
    assert supervisor.proc.poll() is None


#: The stream's jobs come in bursts of this many, 10 ms apart.
BURST = 40


def settled(target, expected: int, timeout: float = 30.0) -> Counter:
    """The lines of ``target`` once ``expected`` distinct ones ran, or once nothing ran for 2 s."""
    deadline, last, since = time.monotonic() + slack(timeout), -1, time.monotonic()
    while time.monotonic() < deadline:
        seen = count_lines(target)
        if len(seen) >= expected:
            break
        if sum(seen.values()) != last:
            last, since = sum(seen.values()), time.monotonic()
        elif time.monotonic() - since > 2.0:
            break
        time.sleep(0.05)
    return count_lines(target)


@over_prefork_modes
def test_a_supervisor_stopped_mid_load_loses_only_what_its_log_says(zq_worker, tmp_path, mode):
    """Jobs stream to a supervisor and a standalone peer; TERM to the supervisor: the peer takes the
    later jobs, and every accepted job runs once or is counted in the supervisor's log (discarded, or
    killed at the end of the grace period), exactly. Before the fix, with other work on the CPUs, 353
    of 7,280 and 760 of 7,920 accepted jobs were neither (the public endpoint was unbound under the
    clients' feet, with no stopping notice)."""
    supervisor = zq_worker(extra_args=["--processes", "2", *mode, "--graceful-timeout", "10"], concurrency=4)
    peer = zq_worker(concurrency=20)
    target = tmp_path / "ran.txt"
    stream = JobStream([supervisor.endpoint, peer.endpoint], target, delay=0.002, burst=BURST)  # about 3,000 jobs/s
    stream.start()
    wait_for(lambda: sum(count_lines(target).values()) >= 2000, what="the load to be under way")
    os.kill(supervisor.pid, signal.SIGTERM)
    status = supervisor.proc.wait(slack(30))
    after_stop = peer.stats()["jobs_received"]
    wait_for(lambda: peer.stats()["jobs_received"] >= after_stop + 1000, what="the peer to take the later jobs")
    stream.stop()
    assert stream.error is None
    output = supervisor.output()
    discarded, killed = logged_discards(output), logged_kills(output)
    seen = settled(target, stream.accepted - discarded - killed)
    lost = stream.accepted - len(seen) - discarded - killed
    print(f"accepted {stream.accepted}, executed {sum(seen.values())}, discarded (logged) {discarded}, "
          f"killed (logged) {killed}, lost {lost}")
    assert re.search(r"stopping: told [1-9]\d* job client\(s\)", output), "the supervisor sent no stopping notice"
    assert max(seen.values()) == 1
    assert lost == 0
    # The client left the stopping worker out at its first notice. A direct child's notice named only its slot's
    # endpoint, which this client (it did not expand the slots) could not match: it retired its socket and
    # reconnected at once, 287-374 times in one stop, and in 1 run of 8 lost 3-7 jobs on the new connections.
    assert stream.stats["jobs"]["discarded_stopping"] <= 20, stream.stats["jobs"]
    # A stop that killed tasks exits 1. A direct child the kernel gave every connection of the stream to holds
    # ~10,000 queued jobs at the stop, more than it runs in the grace period (the router's children hold
    # their credits' worth, and the supervisor discards its own queue).
    assert status == (1 if killed else 0), output[-3000:]
