"""Confirmed jobs from many greenlets of one hub are all in flight at once with the default ``pool_size``.

Replies carry the request's id, so confirms travel on the hub's multiplexed channel (``waits.py``)
instead of one exclusive pooled socket each: seen from the worker's side, a fake worker that answers
nothing until it holds ``CONCURRENT`` unanswered confirms at once, and counts the routing ids they came
from. With exclusive leases of the default 4 sockets it never held more than 4.
"""

from __future__ import annotations

import pytest

import zqsync
from tests.conftest import MONKEY_PATCHED
from tests.fork.test_fork_scenarios import as_caller
from tests.helpers import slack
from zqsync.settings import POOL_SIZE
from zqsync.wire import envelope

CONCURRENT = 20


def _twenty_confirms_against_a_fake_worker() -> tuple[dict, list, dict]:
    import gevent
    import zmq.green as zmq_green

    context = zmq_green.Context()
    rpc = context.socket(zmq_green.ROUTER)
    port = rpc.bind_to_random_port("tcp://127.0.0.1", min_port=20001, max_port=60000)
    held: dict[str, bytes] = {}  # request id -> the routing id it came from last
    seen = {"most_unanswered": 0, "routing_ids": set()}

    def fake_worker():
        while True:
            routing_id, frame = rpc.recv_multipart()
            request = envelope.decode_request(frame)
            seen["routing_ids"].add(routing_id)
            held[request.id] = routing_id
            seen["most_unanswered"] = max(seen["most_unanswered"], len(held))
            if len(held) >= CONCURRENT:
                for request_id, peer in held.items():
                    rpc.send_multipart([peer, envelope.encode_result(request_id, None)])
                held.clear()

    server = gevent.spawn(fake_worker)
    try:
        with zqsync.Client(f"tcp://127.0.0.1:{port - 1}", confirm_timeout=slack(10.0)) as client:
            assert client.settings.pool_size == POOL_SIZE
            senders = [gevent.spawn(client.enqueue_with_options, "t", args=(n,), confirm=True) for n in range(CONCURRENT)]
            gevent.joinall(senders, timeout=slack(10.0))
            outcomes = [sender.value if sender.successful() else repr(sender.exception) for sender in senders]
            stats = client.stats()
    finally:
        server.kill()
        rpc.close(linger=0)
        context.term()
        if not MONKEY_PATCHED:
            gevent.get_hub().destroy(destroy_loop=True)  # this thread's own hub: its loop's descriptors too
    return seen, outcomes, stats


@pytest.mark.timeout(60)
def test_confirms_from_one_hub_are_all_in_flight_at_once_with_the_default_pool_size():
    # Unpatched, in a native thread of its own: a hub of its own, with no greenlet an earlier test left
    # in the main thread's hub (closed clients' readers, probes) to run in the middle of this one.
    seen, outcomes, stats = as_caller(_twenty_confirms_against_a_fake_worker)
    retries = stats["confirm_retries"]
    assert seen["most_unanswered"] == CONCURRENT, (
        f"at most {seen['most_unanswered']} confirms were in flight at once; outcomes {outcomes[:3]}, client {stats}")
    assert retries == 0, f"{retries} confirms were sent again (after confirm_retry) before all were in flight"
    assert all(isinstance(job_id, str) and len(job_id) == 32 for job_id in outcomes), outcomes
    assert len(seen["routing_ids"]) == 1, "the hub's confirms came from more than one socket"
