"""The in-process worker (``zq_inprocess``): the real worker core in a thread of the test process."""

from __future__ import annotations

import pytest
import zmq

import zqsync
from zqsync.demo.tasks import registry as demo_registry
from zqsync.wire.endpoints import split_endpoint

pytestmark = pytest.mark.timeout(60)


def test_wait_returns_the_counters_once_its_condition_holds_and_names_them_when_it_does_not(zq_inprocess):
    worker = zq_inprocess(demo_registry)
    with zqsync.Client(worker.endpoint) as client:
        for n in range(20):
            client.enqueue("add", n, n)
        assert worker.join(20)["jobs_succeeded"] == 20
        with pytest.raises(TimeoutError, match="'jobs_succeeded': 20"):
            worker.join(21, timeout=0.3)
        assert client.call("add", 2, 3) == 5  # a wait that timed out leaves the worker serving


def test_a_worker_that_cannot_bind_raises_in_the_test_s_thread(zq_inprocess):
    with pytest.raises(zqsync.ConfigurationError, match="tcp://HOST:PORT"):
        zq_inprocess(demo_registry, bind="nonsense")


def test_stop_closes_the_worker_s_sockets_and_returns_its_exit_status(zq_inprocess):
    worker = zq_inprocess(demo_registry)
    with zqsync.Client(worker.endpoint) as client:
        assert client.call("add", 1, 1) == 2
    assert worker.stop() == 0
    context = zmq.Context()
    try:  # the port is free again: nothing in this process listens on it
        sock = context.socket(zmq.ROUTER)
        sock.bind(split_endpoint(worker.endpoint)[1])
        sock.close(linger=0)
    finally:
        context.term()
    assert worker.stop() == 0  # stopping twice is harmless


def test_two_in_process_workers_serve_side_by_side_each_in_its_own_hub(zq_inprocess):
    first, second = zq_inprocess(demo_registry), zq_inprocess(demo_registry)
    with zqsync.Client(first.endpoint) as one, zqsync.Client(second.endpoint) as other:
        for n in range(10):
            one.enqueue("add", n, 1)
            other.enqueue("add", n, 2)
        assert (first.join(10)["jobs_succeeded"], second.join(10)["jobs_succeeded"]) == (10, 10)
        assert one.call("zqsync.stats")["pid"] == other.call("zqsync.stats")["pid"]  # one process
