"""The prefork router's choice when every child is suspected of a blocked hub (``dispatch.Dispatcher._usable``).

On a busy machine a healthy child can take longer than ``SUSPECT_AFTER`` to
acknowledge its work, while a sibling whose hub is blocked has not acknowledged
for seconds. Both are then suspected; the work must go to the one silent for
the shortest time, not to whichever credit came first. The test plays the two
children with real sockets against a real router.
"""

from __future__ import annotations

import time

import pytest
import zmq

from tests.conftest import MONKEY_PATCHED
from tests.helpers import slack, wait_for
from zqsync.wire import envelope
from zqsync.worker.dispatch import SLOT, SUSPECT_AFTER, Dispatcher

pytestmark = pytest.mark.skipif(MONKEY_PATCHED, reason="the router runs in the supervisor, which never imports "
                                "gevent: its native thread would be a greenlet blocking the hub here")


class FakeChild:
    """A child's ends of the router's private sockets: it sends credits and reads the calls routed to it."""

    def __init__(self, context: zmq.Context, directory: str, name: str, dispatch: Dispatcher) -> None:
        jobs, rpc = dispatch.call(dispatch.add_child, name)
        self.name = jobs.encode()
        self.rpc = context.socket(zmq.ROUTER)
        self.rpc.connect(rpc)
        self.credits = context.socket(zmq.PUSH)
        self.credits.connect(f"ipc://{directory}/credits")

    def offer(self, count: int, started: int = 0) -> None:
        """Send ``count`` slot credits, saying ``started`` pieces of work in all have started (it read no jobs)."""
        self.credits.send_multipart([self.name, SLOT, b"%d" % count, b"0", b"%d" % started])

    def received(self) -> list[bytes]:
        """The request bodies routed to this child within a second (the router's sends are local)."""
        bodies = []
        while self.rpc.poll(slack(1000)):
            bodies.append(self.rpc.recv_multipart()[-1])
        return bodies

    def close(self) -> None:
        self.rpc.close(linger=0)
        self.credits.close(linger=0)


@pytest.fixture
def router(short_tmp):
    context = zmq.Context()
    jobs_front, rpc_front = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
    jobs_front.bind("tcp://127.0.0.1:*")
    rpc_front.bind("tcp://127.0.0.1:*")
    client = context.socket(zmq.DEALER)
    client.connect(rpc_front.getsockopt_string(zmq.LAST_ENDPOINT))
    dispatch = Dispatcher(context, str(short_tmp), jobs_front, rpc_front)
    dispatch.start()
    children: list[FakeChild] = []

    def child(name: str) -> FakeChild:
        children.append(FakeChild(context, str(short_tmp), name, dispatch))
        return children[-1]

    yield dispatch, client, child
    for each in children:
        each.close()
    client.close(linger=0)
    dispatch.stop()
    context.destroy(linger=0)


def call(client: zmq.Socket, request_id: str) -> bytes:
    body = envelope.encode_request("call", request_id, "whoami")
    client.send_multipart([b"", body])
    return body


def test_when_every_child_is_suspected_the_call_goes_to_the_one_silent_for_the_shortest_time(router):
    dispatch, client, child = router
    blocked, slow = child("1"), child("2")
    blocked.offer(4)  # the blocked child's credits come first in the router's queue
    wait_for(lambda: dispatch.call(len, dispatch.ready[SLOT]) == 4, what="the first child's credits")
    slow.offer(4)
    first = call(client, "1")
    assert blocked.received() == [first]  # ... and it never acknowledges: its hub is blocked
    time.sleep(SUSPECT_AFTER * 4)
    second = call(client, "2")
    assert slow.received() == [second]  # passed over the suspected child; this one is slow to acknowledge
    time.sleep(SUSPECT_AFTER * 4)  # now both are suspected: silent for 5 and for 1 SUSPECT_AFTER periods or more
    third = call(client, "3")
    assert blocked.received() == [], "the third call went to the child silent the longest (its hub is blocked)"
    assert slow.received() == [third]


def test_a_late_acknowledgement_of_earlier_work_does_not_acknowledge_the_work_sent_after_it(router):
    """A child acknowledges its first call only after the second was sent to it, and its hub then blocks in
    the second: it is still suspected, and the third call goes to its sibling. The router used to clear a
    child's suspicion on any credit message, so the third call went to the blocked child, behind the block
    (seen under load in ``test_free_child``)."""
    dispatch, client, child = router
    blocked, free = child("1"), child("2")
    blocked.offer(4)  # the blocked child's credits come first in the router's queue
    wait_for(lambda: dispatch.call(len, dispatch.ready[SLOT]) == 4, what="the first child's credits")
    free.offer(4)
    first, second = call(client, "1"), call(client, "2")
    assert blocked.received() == [first, second]
    blocked.offer(0, started=1)  # the first call started; the second blocks its hub: nothing more from it
    wait_for(lambda: dispatch.call(lambda: dispatch.routes[blocked.name].started[SLOT]) == 1,
             what="the late acknowledgement")
    time.sleep(SUSPECT_AFTER * 4)
    third = call(client, "3")
    assert free.received() == [third], "the third call went to the child blocked in the second"
    assert blocked.received() == []


def test_asking_a_router_whose_loop_died_times_out_instead_of_hanging(router):
    """The supervisor asks its router thread through :meth:`Dispatcher.call`. Once that loop has died (a bug,
    logged), each ask must end in ``TimeoutError``: it used to block for good once the unanswered wake-ups
    filled their pipe (seen: the suite's timeout, after a fake child's malformed credit killed the loop)."""
    dispatch, _, _ = router
    dispatch.call(setattr, dispatch, "_running", False)  # the loop ends, as it does on a bug
    wait_for(lambda: not dispatch.alive, what="the router's loop to end")
    for _ in range(2100):  # more wake-ups than the waker's pipe holds (twice the default HWM of 1000)
        with pytest.raises(TimeoutError):
            dispatch.call(len, [], timeout=0)
