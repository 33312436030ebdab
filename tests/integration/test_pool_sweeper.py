"""Rule 8 without a lease: the sweeper thread closes the idle sockets of an owner that ended."""

from __future__ import annotations

import gc
import time

import gevent

import zqsync
from tests.helpers import wait_for
from zqsync.client import lifecycle


def test_a_finished_threads_socket_is_closed_without_any_further_lease(zq_peer):
    """The peer sees the ended thread's connection go away while the client sits idle."""
    peer = zq_peer()
    client = zqsync.Client(peer.endpoint)
    hub = gevent.get_hub()  # first: the main thread's owner is its hub from the first call on
    try:
        client.call("echo", "main")
        # A native thread in both modes (gevent's threadpool), so it is an owner of its own.
        assert hub.threadpool.apply(client.call, ("echo", "thread")) == "thread"
        assert len(peer.identities()) == 2
        before = peer.stats()["disconnections_rpc"]
        leases = client.stats()["dealer"]["opened"] + client.stats()["dealer"]["reused"]
        hub.threadpool.kill()  # its threads end (and their hubs, when monkey-patched)
        started = time.monotonic()
        wait_for(lambda: gc.collect() is not None and peer.stats()["disconnections_rpc"] > before,
                 what="the sweeper to close the dead thread's socket")
        assert time.monotonic() - started < lifecycle.SWEEP_EVERY * 5
        assert client.stats()["dealer"]["swept"] == 1
        assert client.stats()["dealer"]["opened"] + client.stats()["dealer"]["reused"] == leases, "no lease since"
        opened = client.stats()["dealer"]["opened"]
        assert client.call("echo", "main again") == "main again"
        assert client.stats()["dealer"]["opened"] == opened, "the live owner's socket was kept and reused"
        assert peer.stats()["disconnections_rpc"] == before + 1, "only the dead thread's socket went away"
    finally:
        client.close()
