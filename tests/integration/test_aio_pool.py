"""The asyncio client's pool rules, proved from the peer's side: sockets per event loop and per process,
the cap, discard on cancellation and on a timeout, and fork.

The two-loop test answers from a ROUTER of its own that speaks the worker's wire and records which
identity carried which loop's requests; the others use the in-process worker core, whose receiver
counts the messages of every identity (``zq_inprocess``). Event loops run in native threads also
under gevent: there ``threading.Thread`` is a greenlet of the main thread, and two greenlets of
one thread cannot each run an event loop (asyncio keeps the running loop per native thread).
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys

import pytest
import zmq

from tests.conftest import MONKEY_PATCHED
from tests.helpers import slack, wait_for
from tests.integration import aio_tasks
from zqsync.errors import CallTimeout, PoolError
from zqsync.testing import run_in_fork
from zqsync.wire import envelope

pytestmark = pytest.mark.timeout(60)


def _original(module: str, name: str):
    monkey = sys.modules.get("gevent.monkey")
    return monkey.get_original(module, name) if MONKEY_PATCHED else getattr(__import__(module), name)


def in_native_thread(function, *args):
    """Start ``function(*args)`` in a native thread; returns a ``join(timeout)`` that gives its result or
    re-raises its error. Under gevent the thread's hub (asyncio's selector makes one) is destroyed after."""
    done = _original("_thread", "allocate_lock")()
    done.acquire()
    outcome: list = []

    def body() -> None:
        try:
            outcome.append((True, function(*args)))
        except BaseException as exc:  # re-raised by join
            outcome.append((False, exc))
        finally:
            if MONKEY_PATCHED:
                from gevent._hub_local import get_hub_if_exists

                hub = get_hub_if_exists()
                if hub is not None:
                    hub.destroy(destroy_loop=True)
            done.release()

    _original("_thread", "start_new_thread")(body, ())

    def join(timeout: float):
        assert done.acquire(timeout=timeout), "the thread hung"
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    return join


class RecordingPeer:
    """A ROUTER on an ephemeral loopback port answering ``echo`` calls as a worker does, in a native
    thread, and recording the identity of every request by the tag its caller put in (``args[1]``)."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port - 1}"  # the client's base endpoint: rpc is on PORT+1
        self.tags: dict[str, set[bytes]] = collections.defaultdict(set)
        self.control = self.context.socket(zmq.PAIR)
        self.control.bind(f"inproc://stop-{id(self)}")
        self._join = in_native_thread(self._serve)

    def _serve(self) -> None:
        stop = self.context.socket(zmq.PAIR)
        stop.connect(f"inproc://stop-{id(self)}")
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while stop not in dict(poller.poll()):
                identity, body = self.router.recv_multipart()
                request = envelope.decode_request(body)
                self.tags[request.args[1]].add(identity)
                self.router.send_multipart([identity, envelope.encode_result(request.id, request.args[0])])
        finally:
            stop.close(linger=0)

    def close(self) -> None:
        self.control.send(b"stop")
        self._join(slack(10))
        self.router.close()
        self.control.close()
        self.context.term()


@pytest.fixture
def recording_peer():
    peer = RecordingPeer()
    yield peer
    peer.close()


def test_two_loops_in_two_threads_each_use_at_most_pool_size_sockets_of_their_own(recording_peer, zq_async_client):
    """2 loops x 1,000 calls, 16 at a time each, pool size 4: every reply is the caller's own, each
    loop's requests came over at most 4 identities, and no identity served both loops."""
    client = zq_async_client(recording_peer.endpoint, pool_size=4, lease_timeout=slack(20), call_timeout=slack(20))

    async def calls(tag: str) -> int:
        async def one(n: int) -> bool:
            value = f"{tag}-{n}"
            return await client.call("echo", value, tag) == value

        wrong = 0
        for start in range(0, 1000, 16):
            wrong += (await asyncio.gather(*(one(n) for n in range(start, start + 16)))).count(False)
        return wrong

    joins = [in_native_thread(asyncio.run, calls(tag)) for tag in ("loop-a", "loop-b")]
    assert [join(slack(40)) for join in joins] == [0, 0], "wrong replies"
    seen = recording_peer.tags
    assert set(seen) == {"loop-a", "loop-b"}
    assert all(1 <= len(identities) <= 4 for identities in seen.values()), {k: len(v) for k, v in seen.items()}
    assert not seen["loop-a"] & seen["loop-b"], "a socket was handed to another event loop"
    assert all(identity.startswith(f"zq-{os.getpid()}-".encode()) for ids in seen.values() for identity in ids)


@pytest.fixture
def peer(zq_inprocess):
    return zq_inprocess(aio_tasks.registry, concurrency=4, graceful_timeout=0.2)


def identities(worker) -> collections.Counter:
    """Messages per client identity that the worker's rpc receiver took in."""
    return collections.Counter(worker.worker.identities)


def test_a_cancelled_call_discards_its_socket_and_the_next_call_gets_a_fresh_one(peer, zq_async_client):
    client = zq_async_client(peer.endpoint, call_timeout=slack(20))

    async def scenario() -> list:
        replies = [await client.call("echo", "warm")]
        slow = asyncio.ensure_future(client.call("nap", slack(30), "late"))
        await asyncio.sleep(0)  # its request goes out on the warm, idle socket
        peer.wait(lambda counters: counters["calls_received"] >= 2)  # the worker has it (blocks this loop briefly)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        replies.append(await client.call("echo", "next"))
        return replies

    assert asyncio.run(scenario()) == ["warm", "next"]
    seen = identities(peer)
    assert len(seen) == 2 and sorted(seen.values()) == [1, 2], (
        f"the call after the cancelled one did not get a fresh socket: {dict(seen)}")
    assert client.stats()["call_sockets"]["discarded"] == 1


def test_a_call_that_timed_out_discards_its_socket(peer, zq_async_client):
    client = zq_async_client(peer.endpoint, call_timeout=slack(20))

    async def scenario() -> str:
        await client.call("echo", "warm")
        with pytest.raises(CallTimeout):
            await client.call_with_options("nap", args=(slack(30),), timeout=0.2)
        return await client.call("echo", "next")  # type: ignore[no-any-return]

    assert asyncio.run(scenario()) == "next"
    assert sorted(identities(peer).values()) == [1, 2], dict(identities(peer))


def test_past_the_cap_a_caller_waits_its_lease_timeout_then_gets_pool_error(peer, zq_async_client):
    client = zq_async_client(peer.endpoint, pool_size=1, lease_timeout=0.1, call_timeout=slack(20))

    async def scenario() -> str:
        await client.call("echo", "warm")  # connected: the next request leaves at once, without a wait
        busy = asyncio.ensure_future(client.call("nap", slack(30)))
        await asyncio.sleep(0)
        peer.wait(lambda counters: counters["calls_received"] >= 2)
        with pytest.raises(PoolError, match=r"no pooled socket .* came free within 0\.100 s: 1 are in use by this "
                                            r"event loop"):
            await client.call("echo", "over the cap")
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        return await client.call("echo", "after")  # type: ignore[no-any-return]

    assert asyncio.run(scenario()) == "after"
    assert sorted(identities(peer).values()) == [1, 2]  # the cancelled call's socket was discarded


def test_a_forked_child_dials_its_own_socket_and_leaves_the_parent_s_alone(peer, zq_async_client):
    """The parent's loop (still open) keeps an idle socket; the child, on a loop of its own, gets the
    right reply over a socket named by its own pid, and the parent's socket carries on after."""
    client = zq_async_client(peer.endpoint, call_timeout=slack(10))
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(client.call("echo", "parent")) == "parent"
        parent = set(identities(peer))

        def child() -> tuple:
            return os.getpid(), asyncio.run(client.call("echo", "child"))

        child_pid, reply = run_in_fork(child, timeout=slack(20))
        assert reply == "child"
        after = identities(peer)
        new = set(after) - parent
        assert len(new) == 1 and next(iter(new)).startswith(f"zq-{child_pid}-".encode()), dict(after)
        assert [after[identity] for identity in parent] == [1], "the child used the parent's socket"
        assert loop.run_until_complete(client.call("echo", "parent again")) == "parent again"
        assert [identities(peer)[identity] for identity in parent] == [2]
    finally:
        client.close(linger=0)
        loop.close()


def test_the_idle_socket_of_a_closed_loop_is_closed_and_an_open_loop_s_is_kept(peer, zq_async_client):
    """A loop that was closed leaves an idle socket: it is closed (when the next loop first leases, or
    by the sweeper thread), and the worker sees its connection go; a loop still open keeps its own."""
    client = zq_async_client(peer.endpoint, call_timeout=slack(10))
    connections = peer.worker.intake.connections
    assert asyncio.run(client.call("echo", 1)) == 1
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(client.call("echo", 2)) == 2
        wait_for(lambda: connections["disconnections_rpc"] >= 1, timeout=10, what="the closed loop's socket to close")
        assert loop.run_until_complete(client.call("echo", 3)) == 3
        assert connections["disconnections_rpc"] == 1 and connections["connections_rpc"] == 2
        assert sorted(identities(peer).values()) == [1, 2]
    finally:
        client.close(linger=0)
        loop.close()
