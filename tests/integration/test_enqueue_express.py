"""Enqueue's express lane (``zqsync/client/express.py``) keeps the pool's rules.

Each test pins one rule the lane could break if it skipped a check: the
cap's fairness (a queued greenlet is never overtaken), nested leases, and
socket reuse seen from the worker (jobs keep flowing over one connection).
"""

from __future__ import annotations

import gevent
import gevent.event
import pytest
import zmq

import zqsync
from tests.helpers import wait_for
from zqsync.client import express
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

pytestmark = pytest.mark.timeout(60)


def frame(value: str) -> bytes:
    return envelope.encode_request("job", value, "echo", (value,))


def test_a_greenlet_queued_for_the_only_permit_is_never_overtaken_by_the_express_lane(zq_worker):
    """Rules 5 and 6: a permit handed to a waiting greenlet is that greenlet's, even while
    the socket it will use sits idle in the bucket: the lane declines and sends nothing."""
    worker = zq_worker()
    gevent.get_hub()  # the main greenlet and the waiter share one owner, this hub, in both modes
    pool = zqsync.SocketPool(zmq.DEALER, pool_size=1, send_only=True)  # as a client's job pool
    order: list[str] = []
    try:
        with pool.lease(worker.endpoint) as sock:
            sock.send(frame("warm"))

        def waiter() -> None:
            with pool.lease(worker.endpoint, timeout=20.0) as sock:
                order.append("waiter")
                sock.send(frame("waiter"))

        with pool.lease(worker.endpoint):
            queued = gevent.spawn(waiter)
            gevent.sleep(0.05)  # the waiter is now queued for the only permit
            assert not order
        # The socket is parked and the permit handed to the waiter, which has not run yet.
        assert express.try_send(pool, worker.endpoint, frame("newcomer")) is False
        queued.join(20)
        assert order == ["waiter"]
        assert express.try_send(pool, worker.endpoint, frame("later")) is True  # uncontended again
        wait_for(lambda: worker.stats()["jobs_received"] >= 3, what="warm, waiter and later jobs")
    finally:
        pool.close()


def test_enqueue_inside_a_lease_raises_nested_lease_even_when_a_socket_is_idle(zq_worker):
    """Rule 7: the express lane must not let an enqueue through inside another lease."""
    worker = zq_worker()
    other = zqsync.SocketPool(zmq.DEALER)
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue("echo", "warm")  # the client's PUSH socket is idle now
        try:
            with other.lease(split_endpoint(worker.endpoint)[1]):
                with pytest.raises(zqsync.PoolError, match="nested lease"):
                    client.enqueue("echo", "nested")
            client.enqueue("echo", "after")
        finally:
            other.close()
        assert client.stats()["enqueued"] == 2


def test_express_enqueues_reuse_one_connection_and_every_job_arrives(zq_worker):
    """Rules 1 and 2 from the worker's side: 500 enqueues from one owner are one TCP
    connection (one accepted at the worker), and the worker receives every job."""
    worker = zq_worker()
    with zqsync.Client(worker.endpoint) as client:
        for n in range(500):
            client.enqueue("echo", n)
        wait_for(lambda: worker.stats()["jobs_received"] >= 500, what="500 jobs")
        stats = worker.stats()
        assert stats["jobs_received"] == 500
        assert stats["connections_jobs"] == 1
        assert client.stats()["jobs"]["opened"] == 1
