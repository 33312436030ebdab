"""Rule 9's last clause: greenlets copied into a forked child mid-call stay harmless.

A background greenlet waits for a slow reply when the process forks. In the
child that greenlet is a copy whose socket belongs to the parent: were it to
wake and touch that socket, the child's libzmq would drain the parent's
mailbox signal and the parent would miss its own reply. The pool stops the
copies' event watchers and kills them in the child.
"""

from __future__ import annotations

import gc
import time

import gevent
import pytest
import zmq
import zmq.utils.garbage

import zqsync
from tests.conftest import MONKEY_PATCHED
from tests.helpers import slack
from zqsync.testing import run_in_fork

pytestmark = pytest.mark.skipif(not MONKEY_PATCHED, reason="a gevent process: the suite's monkey-patched run")


def test_a_call_in_flight_across_fork_still_gets_its_reply_in_the_parent(zq_peer):
    peer = zq_peer()
    client = zqsync.Client(peer.endpoint, call_timeout=8.0)
    try:
        client.call("echo", "warm")
        in_flight = [gevent.spawn(client.call, "delay", 1.5, f"slow-{n}") for n in range(3)]
        gevent.sleep(0.3)  # the requests are on the wire, the greenlets wait on their sockets

        def child() -> list:
            # Keep the hub busy past the parent's reply time, so copied greenlets would wake.
            deadline = time.monotonic() + 2.5
            answers = []
            while time.monotonic() < deadline:
                answers.append(client.call("echo", "child"))
                gevent.sleep(0.05)
            return answers

        answers = run_in_fork(child, timeout=30)
        assert answers and set(answers) == {"child"}
        assert [greenlet.get(timeout=15) for greenlet in in_flight] == [f"slow-{n}" for n in range(3)]
        assert client.call("echo", "after") == "after"
        assert client.stats()["dealer"]["stale_replies"] == 0
    finally:
        client.close()


def _zero_copy_send(context: zmq.Context) -> None:
    """One ``copy=False`` send of a frame above pyzmq's copy threshold: it starts pyzmq's collector."""
    sock = context.socket(zmq.PUB)
    try:
        sock.bind("tcp://127.0.0.1:*")
        sock.send(b"z" * (4 * zmq.COPY_THRESHOLD), copy=False)
    finally:
        sock.close(linger=0)


def test_pyzmqs_collector_copied_into_a_child_is_ended_and_the_child_calls(zq_peer):
    """After a zero-copy send, pyzmq's collector thread (``zmq.utils.garbage``) is a greenlet here, and a
    fork copies it with the parent's socket; in the child it could spin in ``recv`` and hang the child
    (seen in CI as a forked child that never answered). The child's copy must be dead at once, the child
    must call and send zero-copy itself, and the parent's collector must go on."""
    peer = zq_peer()
    context = zmq.Context()
    client = zqsync.Client(peer.endpoint, call_timeout=8.0)
    try:
        _zero_copy_send(context)
        collector = zmq.utils.garbage.gc
        assert collector.is_alive()
        copied = next(item for item in gc.get_objects() if id(item) == collector.thread.ident)

        def child() -> dict:
            gevent.sleep(0)  # the kill scheduled by the fork hook lands
            dead = copied.dead
            calls = [client.call("echo", n) for n in range(20)]
            _zero_copy_send(zmq.Context.instance())
            return {"copy dead": dead, "calls": calls, "own collector": collector.is_alive()}

        for _ in range(5):
            assert run_in_fork(child, timeout=slack(20)) == {"copy dead": True, "calls": list(range(20)),
                                                             "own collector": True}
        _zero_copy_send(context)
        assert collector.is_alive() and not copied.dead
        assert client.call("echo", "after") == "after"
    finally:
        client.close()
        context.term()
