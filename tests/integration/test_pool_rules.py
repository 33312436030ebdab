"""Pool rules 4, 6, 7 and 8 of docs/design.md, asserted from the peer's side where the behaviour is visible there.

A peer is a real worker; it records the ZMQ identity of every socket that
calls it and counts the TCP connections it accepted and lost.
"""

from __future__ import annotations

import gc

import gevent
import gevent.event
import pytest
import zmq

import zqsync
from tests.helpers import wait_for
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

#: The first call on a fresh pool also warms the peer; identities are compared to that.


def rpc(endpoint: str) -> str:
    return split_endpoint(endpoint)[1]


def echo(sock: zmq.Socket, value: str) -> str:
    """One raw call of the peer's ``echo`` task over a leased socket."""
    sock.send(envelope.encode_request("call", value, "echo", (value,)))
    assert sock.poll(20_000), "the peer did not answer"
    return envelope.decode_reply(sock.recv()).result


def test_a_socket_closed_inside_a_clean_lease_is_never_parked(zq_peer):
    """Rule 4: the next lease gets a new socket (a new identity at the peer), not the closed one."""
    peer = zq_peer()
    pool = zqsync.SocketPool(zmq.DEALER, pool_size=1)
    try:
        with pool.lease(rpc(peer.endpoint)) as sock:
            assert echo(sock, "a") == "a"
            sock.close(linger=0)
        with pool.lease(rpc(peer.endpoint)) as sock:
            assert echo(sock, "b") == "b"
        assert len(peer.identities()) == 2
    finally:
        pool.close()


def test_a_busy_peer_never_stalls_a_lease_to_another_peer(zq_peer):
    """Rule 6: with the cap at 1 and peer A's only socket leased, a lease to peer B is immediate."""
    peer_a, peer_b = zq_peer(), zq_peer()
    pool = zqsync.SocketPool(zmq.DEALER, pool_size=1)
    holding = gevent.event.Event()
    release = gevent.event.Event()

    def hold_a() -> None:
        with pool.lease(rpc(peer_a.endpoint)) as sock:
            echo(sock, "a")
            holding.set()
            release.wait(30)

    holder = gevent.spawn(hold_a)
    try:
        assert holding.wait(30)
        with pool.lease(rpc(peer_b.endpoint), timeout=0.5) as sock:  # a shared permit would time out here
            assert echo(sock, "b") == "b"
        with pytest.raises(zqsync.PoolError, match="ZQSYNC_POOL_SIZE"):
            with pool.lease(rpc(peer_a.endpoint), timeout=0.2):
                pass
    finally:
        release.set()
        holder.join(30)
        pool.close()


def test_a_lease_inside_a_lease_raises_on_one_pool_and_across_pools(zq_peer):
    """Rule 7: nesting could deadlock on the cap, so it raises at once; consecutive leases are fine."""
    peer = zq_peer()
    first, second = zqsync.SocketPool(zmq.DEALER), zqsync.SocketPool(zmq.PUSH)
    try:
        with first.lease(rpc(peer.endpoint)) as sock:
            with pytest.raises(zqsync.PoolError, match="nested lease"):
                with first.lease(rpc(peer.endpoint)):
                    pass
            with pytest.raises(zqsync.PoolError, match="nested lease"):
                with second.lease(peer.endpoint):
                    pass
            assert echo(sock, "outer still works") == "outer still works"
        for _ in range(3):
            with first.lease(rpc(peer.endpoint)) as sock:
                echo(sock, "again")
        assert len(peer.identities()) == 1, "the failed nested leases must not have cost the outer socket"
    finally:
        first.close()
        second.close()


def test_a_finished_threads_sockets_are_closed_on_the_next_lease(zq_peer):
    """Rule 8: the peer sees the ended thread's connection go away once the pool is used again."""
    peer = zq_peer()
    client = zqsync.Client(peer.endpoint)
    try:
        client.call("echo", "main")
        # A native thread in both modes (gevent's threadpool), so it is an owner of its own.
        assert gevent.get_hub().threadpool.apply(client.call, ("echo", "thread")) == "thread"
        assert len(peer.identities()) == 2
        before = peer.stats()["disconnections_rpc"]

        def swept() -> bool:
            gc.collect()
            client.call("echo", "main again")
            return peer.stats()["disconnections_rpc"] > before

        gevent.get_hub().threadpool.kill()  # its threads end (and their hubs, when monkey-patched)
        wait_for(swept, what="the dead thread's socket to be closed")
        assert peer.stats()["disconnections_rpc"] == before + 1, "only the dead thread's socket went away"
        assert client.stats()["dealer"]["swept"] == 1
    finally:
        client.close()
