"""Call's express lane (``express.lease_idle``) keeps the pool's rules.

Every call after a client's first takes the lane. Each test pins one rule the
lane could break if it skipped a check: the cap's fairness (a queued greenlet
is never overtaken), nested leases, the fork check, and reuse seen from the
worker (one DEALER identity for many calls).
"""

from __future__ import annotations

import os

import gevent
import pytest
import zmq

import zqsync
from tests.fork.test_fork_scenarios import as_caller, run_in_c_fork
from zqsync.client import express
from zqsync.wire.endpoints import split_endpoint

pytestmark = pytest.mark.timeout(60)


def test_sequential_calls_reuse_one_socket_seen_from_the_worker(zq_worker):
    """Rules 1 and 2: 200 calls from one owner are one DEALER identity at the worker."""
    worker = zq_worker()
    with zqsync.Client(worker.endpoint) as client:
        assert [client.call("add", n, 1) for n in range(200)] == [n + 1 for n in range(200)]
        assert len(worker.identities()) == 1
        dealer = client.stats()["dealer"]
        assert dealer["opened"] == 1 and dealer["reused"] == 199 and dealer["in_flight"] == 0


def test_a_greenlet_queued_for_the_only_permit_is_never_overtaken_by_the_call_lane(zq_worker):
    """Rules 5 and 6: a permit handed to a waiting greenlet is that greenlet's, even while the
    socket it will use sits idle in the bucket: the lane declines and leases nothing."""
    worker = zq_worker()
    rpc = split_endpoint(worker.endpoint)[1]
    gevent.get_hub()  # the main greenlet and the waiter share one owner, this hub, in both modes
    pool = zqsync.SocketPool(zmq.DEALER, pool_size=1)
    leased: list[str] = []
    try:
        with pool.lease(rpc):
            pass  # one idle socket now

        def waiter() -> None:
            with pool.lease(rpc, timeout=20.0):
                leased.append("waiter")

        with pool.lease(rpc):
            queued = gevent.spawn(waiter)
            gevent.sleep(0.05)  # the waiter is now queued for the only permit
        # The socket is parked and the permit handed to the waiter, which has not run yet.
        assert express.lease_idle(pool, rpc) is None
        assert pool.stats()["in_flight"] == 0
        queued.join(20)
        assert leased == ["waiter"]
        lease = express.lease_idle(pool, rpc)  # uncontended again
        assert lease is not None
        with lease:
            assert pool.stats()["in_flight"] == 1
            assert express.lease_idle(pool, rpc) is None  # nested, and no idle socket left
        assert pool.stats()["opened"] == 1
    finally:
        pool.close()


def test_a_call_inside_a_lease_of_the_lane_raises_nested_lease(zq_worker):
    """Rule 7: a greenlet holding a lease taken by the lane must not get a second socket."""
    worker = zq_worker()
    with zqsync.Client(worker.endpoint) as client:
        assert client.call("add", 1, 1) == 2  # the DEALER is idle now
        lease = express.lease_idle(client._dealer, split_endpoint(worker.endpoint)[1])
        assert lease is not None
        with lease:
            with pytest.raises(zqsync.PoolError, match="nested lease"):
                client.call("add", 2, 2)
        assert client.call("add", 3, 3) == 6
        assert client.stats()["dealer"]["opened"] == 1


def _child_calls(client: zqsync.Client) -> dict:
    return {"pid": os.getpid(), "results": [client.call("add", n, 10) for n in range(3)],
            "forks_detected": client.stats()["dealer"]["forks_detected"]}


def test_c_level_forked_child_calls_through_its_own_socket_not_the_parents_idle_one(zq_worker):
    """Rule 9: after a fork that skips the at-fork hooks, the parent's DEALER sits idle in the
    bucket the child inherited; the child's calls must dial a socket of their own (a third identity
    at the worker after the parent's), and the parent keeps its one socket."""
    worker = zq_worker()

    def scenario() -> dict:
        with zqsync.Client(worker.endpoint, call_timeout=10.0) as client:
            assert client.call("add", 1, 1) == 2
            child = run_in_c_fork(_child_calls, client)
            assert child["pid"] != os.getpid()
            assert client.call("add", 2, 2) == 4
            return {"child": child, "parent_opened": client.stats()["dealer"]["opened"]}

    outcome = as_caller(scenario)
    assert outcome["child"]["results"] == [10, 11, 12]
    assert outcome["child"]["forks_detected"] == 1  # by the pid check: this fork ran no at-fork hook
    assert outcome["parent_opened"] == 1
    assert len(worker.identities()) == 2  # the parent's socket and the child's own
