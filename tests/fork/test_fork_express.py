"""Enqueue's express lane after a fork (pool rule 9): the fork check on every call stays.

The parent's PUSH socket is warm and idle, which is exactly when the express
lane would use it in place. A child of a fork the at-fork hook does not see (as a C-level one)
must still dial its own socket: its jobs then reach the worker and run, which
the parent observes through the stored results. Had the child sent on the
inherited socket, libzmq would have queued the jobs where no I/O thread
serves them, and they would never run.
"""

from __future__ import annotations

import os

import pytest

import zqsync
from tests.fork.test_fork_scenarios import as_caller, run_in_unhooked_fork

pytestmark = pytest.mark.timeout(90)


def _child_enqueues(client: zqsync.Client) -> dict:
    ids = [client.enqueue_with_options("echo", args=(f"child-{n}",), store_result=True) for n in range(3)]
    # Wait for the jobs to run before the child exits: os._exit() skips the linger that would flush them.
    return {"pid": os.getpid(), "ids": ids, "results": [client.result(job_id, timeout=10.0) for job_id in ids]}


def test_a_child_the_fork_hook_missed_enqueues_through_its_own_socket_not_the_parents_idle_one(zq_worker):
    worker = zq_worker()

    def scenario() -> list:
        with zqsync.Client(worker.endpoint, call_timeout=15.0) as client:
            first = client.enqueue_with_options("echo", args=("parent-before",), store_result=True)
            assert client.result(first) == "parent-before"  # the PUSH socket is now idle in the pool
            child = run_in_unhooked_fork(_child_enqueues, client)
            assert child["pid"] != os.getpid()
            assert child["results"] == ["child-0", "child-1", "child-2"]
            results = [client.result(job_id, timeout=10.0) for job_id in child["ids"]]
            after = client.enqueue_with_options("echo", args=("parent-after",), store_result=True)
            results.append(client.result(after, timeout=10.0))
            assert client.stats()["jobs"]["opened"] == 1, "the parent keeps its one job socket"
            return results

    assert as_caller(scenario) == ["child-0", "child-1", "child-2", "parent-after"]
