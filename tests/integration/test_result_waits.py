"""Waiting for results costs no pooled socket (``zqsync/client/waits.py``).

An in-process worker (its own thread and hub, on loopback TCP) runs 2 s jobs for 500
greenlets that wait on their results through one client with ``pool_size=4``. Every waiter
gets its result, a quick call made while they wait answers at once, and the worker, the
peer, sees the waiters' long-polls on one connection: at most ``pool_size`` + 1 routing ids
from this process.
"""

from __future__ import annotations

import os
import threading
import time

import gevent
import pytest

import zqsync
from tests.conftest import MONKEY_PATCHED
from tests.fork.test_fork_scenarios import as_caller
from tests.helpers import slack, wait_for
from tests.integration import job_tasks
from zqsync.testing import run_in_fork

WAITERS = 500


def _wait_all(client, jobs, errors):
    def wait(job):
        try:
            return client.result(job, timeout=slack(60))
        except Exception as exc:  # counted by the test
            errors.append(repr(exc))
            return None

    return [gevent.spawn(wait, job) for job in jobs]


@pytest.mark.timeout(120)
def test_500_greenlets_wait_on_one_connection_and_a_quick_call_still_answers(zq_inprocess):
    worker = zq_inprocess(job_tasks.registry, concurrency=WAITERS + 10)
    with zqsync.Client(worker.endpoint, pool_size=4) as client:
        jobs = [client.enqueue_with_options("nap", args=(2.0, index), store_result=True) for index in range(WAITERS)]
        errors: list[str] = []
        waiters = _wait_all(client, jobs, errors)
        wait_for(lambda: client.call("zqsync.stats")["long_polls"] >= WAITERS,
                 what=f"all {WAITERS} long-polls waiting at the worker at once")
        started = time.monotonic()
        assert client.call("add", 2, 3) == 5
        quick = time.monotonic() - started
        gevent.joinall(waiters, timeout=slack(90))
        stats = client.call("zqsync.stats")
    print(f"{WAITERS} waiters: quick call while they waited {quick * 1000:.1f} ms; errors {len(errors)}")
    assert errors == [] and [waiter.value for waiter in waiters] == list(range(WAITERS))
    assert quick < slack(1.0), "the quick call waited for a pooled socket"
    assert stats["identities_by_pid"][str(os.getpid())] <= 4 + 1


@pytest.mark.timeout(60)
def test_a_thread_waits_on_its_own_socket_and_a_timed_out_long_poll_leaves_it_usable(zq_inprocess):
    """Outside gevent each thread has one long-poll socket: a result() that timed out leaves its late
    reply behind, which the next result() on that thread drops as stale."""
    if MONKEY_PATCHED:
        pytest.skip("monkey-patched: threads are greenlets of one hub (the test above covers that)")
    worker = zq_inprocess(job_tasks.registry)
    outcome: dict = {}
    with zqsync.Client(worker.endpoint, pool_size=1) as client:
        slow = client.enqueue_with_options("nap", args=(1.0, "slow"), store_result=True)
        quick = client.enqueue_with_options("nap", args=(0.0, "quick"), store_result=True)

        def in_thread():
            with pytest.raises(zqsync.CallTimeout):
                client.result(slow, timeout=0.3)
            outcome["quick"] = client.result(quick, timeout=slack(10))
            outcome["slow"] = client.result(slow, timeout=slack(10))

        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join(slack(30))
        assert client.call("add", 1, 1) == 2
        seen = client.call("zqsync.stats")["identities_by_pid"][str(os.getpid())]
    assert (outcome["quick"], outcome["slow"]) == ("quick", "slow")
    assert seen <= 3, "this thread's call socket and long-poll socket, and the main thread's call socket"


def _child_waits(client: zqsync.Client, job: str) -> dict:
    return {"pid": os.getpid(), "result": client.result(job, timeout=slack(20)),
            "in_child": client.result(client.enqueue_with_options("nap", args=(0.2, "child"), store_result=True),
                                      timeout=slack(20))}


@pytest.mark.timeout(90)
def test_a_forked_child_waits_on_a_long_poll_socket_of_its_own(zq_worker):
    """The parent's long-poll socket is idle in its channel when the child forks: the child must open its
    own (pool rule 9), and the parent's goes on working."""
    worker = zq_worker("tests.integration.job_tasks:registry")

    def scenario() -> tuple:
        with zqsync.Client(worker.endpoint) as client:
            first = client.enqueue_with_options("nap", args=(0.2, "parent"), store_result=True)
            assert client.result(first, timeout=slack(20)) == "parent"
            second = client.enqueue_with_options("nap", args=(0.5, "second"), store_result=True)
            child = run_in_fork(_child_waits, client, second)
            after = client.result(client.enqueue_with_options("nap", args=(0.2, "after"), store_result=True),
                                  timeout=slack(20))
            return child, after, client.call("zqsync.stats")["identities_by_pid"]

    child, after, identities = as_caller(scenario)
    assert (child["result"], child["in_child"], after) == ("second", "child", "after")
    assert str(child["pid"]) in identities and child["pid"] != os.getpid()
