"""The job pool's libzmq I/O thread runs under SCHED_BATCH (``zqsync/client/iosched.py``); the call pool's does not.

Seen from the kernel: the policy of this process's real ``ZMQbg/IO`` threads,
read by thread id, before and after a client opens each pool's first socket.
"""

from __future__ import annotations

import os

import pytest
import zmq

import zqsync
from tests.helpers import wait_for
from zqsync.client import iosched

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"),
                       reason="SCHED_BATCH and /proc are Linux's"),
]


def zmq_io_threads() -> set[int]:
    """Thread ids of this process's libzmq I/O threads."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().startswith("ZMQbg/IO"):
                    found.add(int(tid))
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return found


def test_jobs_leave_through_a_batch_io_thread_and_calls_through_a_default_one(zq_worker):
    if not iosched.batch_allowed():
        pytest.skip("this sandbox or this thread's policy does not allow SCHED_BATCH")
    worker = zq_worker()
    client = zqsync.Client(worker.endpoint)
    try:
        before = zmq_io_threads()
        client.enqueue("add", 1, 2)
        job_threads = zmq_io_threads() - before
        assert client.call("add", 2, 3) == 5
        call_threads = zmq_io_threads() - before - job_threads
        wait_for(lambda: worker.stats()["jobs_received"] >= 1, what="the job at the worker")
        assert len(job_threads) == 1 and len(call_threads) == 1  # one context, one I/O thread per pool
        assert [os.sched_getscheduler(tid) for tid in job_threads] == [os.SCHED_BATCH]
        assert [os.sched_getscheduler(tid) for tid in call_threads] == [os.SCHED_OTHER]
    finally:
        client.close(linger=1.0)


def _refuse(pid: int, policy: int, param: object) -> None:
    raise PermissionError(1, "Operation not permitted")


@pytest.mark.parametrize("name, fake", [
    # libzmq aborts the process if the kernel refuses the policy: a SCHED_FIFO caller (priority > 0,
    # which SCHED_BATCH rejects) must leave the context alone.
    ("sched_getscheduler", lambda pid: os.SCHED_FIFO),
    # A sandbox that forbids sched_setscheduler: the probe fails, and nothing is asked of libzmq.
    ("sched_setscheduler", _refuse),
], ids=["real-time caller", "refused probe"])
def test_a_caller_that_may_not_switch_policy_keeps_libzmq_default(monkeypatch, name, fake):
    monkeypatch.setattr(os, name, fake)
    context = zmq.Context()
    try:
        assert iosched.batch_io_threads(context) is False
        assert context.get(zmq.THREAD_SCHED_POLICY) == -1
    finally:
        context.term()


def test_the_probe_leaves_the_calling_thread_as_it_was():
    policy = os.sched_getscheduler(0)
    iosched.batch_allowed()
    assert os.sched_getscheduler(0) == policy
