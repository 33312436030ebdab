"""Direct prefork (``zqsync worker --processes 2``, the default), with real processes: every child runs calls and
jobs, a SIGKILLed child's slot comes back on the same address, HUP under load loses no accepted job, and a
warm TERM stops cleanly. The children bind the supervisor's listening sockets (``worker/listeners.py``)."""

from __future__ import annotations

import os
import signal
import socket
from collections import Counter

import pytest

import zqsync
from tests.helpers import JobStream, children_of, slack, wait_for
from tests.integration.test_deploy import count_lines, hup_and_wait, settled
from tests.integration.test_stopping import logged_discards, logged_kills

TASKS = "tests.integration.free_child_tasks:registry"
DIRECT = ["--processes", "2", "--graceful-timeout", "10"]

pytestmark = pytest.mark.timeout(120)


def slot_endpoint(worker, slot: int) -> str:
    host, _, port = worker.endpoint.rpartition(":")
    return f"{host}:{int(port) + 2 + 2 * slot}"


def whoami_all(client, times: int = 20) -> set:
    return {client.call("whoami") for _ in range(times)}


def reach_every_child(client, children: set) -> set:
    """The pids that answered ``whoami``, once every one of ``children`` has (a new socket sends only on the
    connections made so far, ``ZMQ_IMMEDIATE``: the second child's may come up a few calls later)."""
    seen: set = set()
    return wait_for(lambda: (seen.update(whoami_all(client)) or seen) >= children and seen, what="every child")


def test_calls_and_jobs_run_on_every_child(zq_worker, tmp_path):
    worker = zq_worker(TASKS, extra_args=DIRECT, concurrency=4)
    children = set(children_of(worker.pid))
    ran = tmp_path / "pids.txt"
    with zqsync.Client(worker.endpoint, expand_prefork=True) as client:
        assert reach_every_child(client, children) == children

        def every_child_ran_a_job() -> bool:
            for _ in range(20):
                client.enqueue("record", str(ran))
            return {int(pid) for pid in count_lines(ran)} >= children

        wait_for(every_child_ran_a_job, what="a job to run on every child")
    assert {int(pid) for pid in count_lines(ran)} == children
    with zqsync.Client(worker.endpoint) as plain:  # no expansion: the public pair, one child per connection
        assert whoami_all(plain, 3) <= children
        stats = plain.call("zqsync.stats")
    assert {child["pid"] for child in stats["children"]} == children and stats["unreachable"] == 0
    assert stats["jobs_succeeded"] >= 20


def test_a_killed_childs_slot_comes_back_on_the_same_address(zq_worker):
    worker = zq_worker(TASKS, extra_args=DIRECT, concurrency=4)
    with zqsync.Client(slot_endpoint(worker, 0), call_timeout=slack(2.0)) as slot0, \
            zqsync.Client(worker.endpoint, expand_prefork=True, call_timeout=slack(2.0)) as spread:
        killed = slot0.call("whoami")
        assert reach_every_child(spread, set(children_of(worker.pid))) == set(children_of(worker.pid))
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: killed not in children_of(worker.pid) and len(children_of(worker.pid)) == 2,
                 what="the killed child's replacement")

        def answered_by_new_child() -> int:
            try:
                pid = slot0.call("whoami")
            except zqsync.ZqsyncError:
                return 0
            return pid if pid != killed else 0

        replacement = wait_for(answered_by_new_child, what="slot 0's address to answer again")
        assert replacement in children_of(worker.pid)
        assert reach_every_child(spread, set(children_of(worker.pid))) == set(children_of(worker.pid))
    output = worker.output()
    assert f"(pid {killed}) exited with status -9" in output and "WARNING" in output
    assert f"(pid {killed}) exited holding" not in output  # it had read no plain job (seats.py counts them)


def test_hup_under_load_loses_no_accepted_job(zq_worker, tmp_path, monkeypatch):
    """Before a retiring child's notice named no endpoint, expanding clients left both slots out while the
    children were replaced in turn, and this timed out waiting for the new children to take jobs. While the
    listening descriptors were blocking (before ``listeners.bind_inherited`` made them non-blocking) it lost
    accepted jobs in 1 of 6 to 2 of 5 runs with the CPUs loaded; since, none in 11."""
    monkeypatch.setenv("ZQSYNC_EXPAND_PREFORK", "1")
    worker = zq_worker(extra_args=DIRECT, concurrency=4)
    target = tmp_path / "ran.txt"
    stream = JobStream(worker.endpoint, target, delay=0.002, burst=40)
    stream.start()
    try:
        wait_for(lambda: sum(count_lines(target).values()) >= 500, what="the load to be under way")
        hup_and_wait(worker, 0)
        accepted_at_hup = stream.accepted
        wait_for(lambda: stream.accepted >= accepted_at_hup + 500, what="jobs accepted by the new children")
    finally:
        stream.stop()
    assert stream.error is None
    output = worker.output()
    discarded, killed = logged_discards(output), logged_kills(output)
    seen = settled(target, stream.accepted)
    print(f"accepted {stream.accepted}, executed {sum(seen.values())}, discarded (logged) {discarded}, "
          f"killed (logged) {killed}; client {stream.stats}")
    assert discarded == killed == 0
    assert set(seen) == {str(index) for index in range(stream.accepted)} and max(seen.values()) == 1


def test_a_warm_term_runs_what_was_accepted_and_closes_every_port(zq_worker, tmp_path):
    worker = zq_worker(extra_args=DIRECT, concurrency=4)
    target = tmp_path / "ran.txt"
    with zqsync.Client(worker.endpoint, expand_prefork=True) as client:
        for index in range(200):
            client.enqueue("record", str(target), str(index), 0.01)
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.proc.wait(slack(30)) == 0
    output = worker.output()
    assert output.count("stopping: told") == 2 and "killing" not in output
    seen = Counter(count_lines(target))
    assert set(seen) == {str(index) for index in range(200)} and max(seen.values()) == 1
    host, _, port = worker.endpoint[len("tcp://"):].rpartition(":")
    for each in range(int(port), int(port) + 6):  # the public pair and both slot pairs
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect((host, each))


def test_a_killed_child_counts_the_plain_jobs_it_held(zq_worker, tmp_path):
    """A child SIGKILLed under a steady stream of plain jobs: the supervisor counts and logs the jobs it had
    read into its process and not run (``seats.py``; ``zqsync.stats``: ``supervisor.jobs_lost_in_children``).
    What libzmq and the kernel had buffered for it and not handed to Python is lost uncounted: at most the
    socket's receive HWM (1000 messages per connection) plus the kernels' TCP buffers. Before the count, the
    supervisor only logged a WARNING per child exit, and the stats said 0."""
    worker = zq_worker(extra_args=DIRECT, concurrency=50)
    target = tmp_path / "ran.txt"
    killed_at = tmp_path / "killed.txt"
    with zqsync.Client(slot_endpoint(worker, 0), call_timeout=slack(5.0)) as slot0:
        victim = slot0.call("zqsync.stats")["pid"]
    # At most 1,000 jobs/s (10 then a 10 ms pause) of 20 ms each, within the child's 2,500/s: about 20 run at
    # any time, and none wait in its buffers for a slot.
    stream = JobStream(slot_endpoint(worker, 0), target, delay=0.02, burst=10)
    stream.start()
    try:
        wait_for(lambda: sum(count_lines(target).values()) >= 300, what="the load to be under way")
        os.kill(victim, signal.SIGKILL)
        killed_at.write_text(str(stream.accepted))
        wait_for(lambda: "exited holding" in worker.output() or f"(pid {victim}) exited" in worker.output(),
                 what="the supervisor to reap the killed child")
        wait_for(lambda: stream.accepted >= int(killed_at.read_text()) + 200, what="the replacement to take jobs")
    finally:
        stream.stop()
    assert stream.error is None
    seen = settled(target, stream.accepted)
    with zqsync.Client(worker.endpoint, call_timeout=slack(5.0)) as client:
        lost = client.call("zqsync.stats")["supervisor"]["jobs_lost_in_children"]
    uncounted = stream.accepted - len(seen) - lost
    print(f"accepted {stream.accepted}, ran {len(seen)}, counted lost {lost}, uncounted {uncounted}")
    assert max(seen.values()) == 1
    assert f"(pid {victim}) exited holding {lost} plain job(s)" in worker.output()
    assert 1 <= lost <= 50 + 1  # the running ones (each sleeps 20 ms), and one read and waiting for a slot
    assert 0 <= uncounted <= UNCOUNTED_AT_KILL, "more lost uncounted than libzmq's and the kernel's buffers hold"


#: Most plain jobs a SIGKILLed child can lose uncounted: its jobs socket's receive HWM (1000, one client
#: connection) and what the two kernels' TCP buffers hold of ~100-byte jobs (measured: see docs/design.md).
UNCOUNTED_AT_KILL = 1000 + 2000
