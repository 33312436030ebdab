"""Rule 9's last clause: greenlets copied into a forked child mid-call stay harmless.

A background greenlet waits for a slow reply when the process forks. In the
child that greenlet is a copy whose socket belongs to the parent: were it to
wake and touch that socket, the child's libzmq would drain the parent's
mailbox signal and the parent would miss its own reply. The pool stops the
copies' event watchers and kills them in the child.
"""

from __future__ import annotations

import time

import gevent
import pytest

import zqsync
from tests.conftest import MONKEY_PATCHED
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
