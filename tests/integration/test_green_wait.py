"""Green waits on pooled sockets never lose a wake-up (issue 14, item 2).

A ZeroMQ socket's ``FD`` signals only an edge (``EVENTS`` going from nothing
to something), and anything that reads ``EVENTS`` consumes it: our own
operations, and zmq.green's per-socket watcher, which reads ``EVENTS`` from
the hub whenever the descriptor was readable, possibly long after the
greenlet that now holds the socket armed its own wait. A transport that
sleeps on the descriptor without accounting for that sleeps through a reply
that is already there, and the call ends in ``CallTimeout`` although the
worker answered.

The second test below makes that sequence deterministic (it failed on the
reverted C-level transport of commit e6f06fe); the first is a broader
stress test (it did not catch that race in 20 s runs, but guards the C-level
send and receive against mixed sizes and many greenlets).
"""

from __future__ import annotations

import random
import time

import gevent
import pytest
import zmq
import zmq.green

import zqsync
from tests.helpers import slack
from zqsync.client import transport
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

#: Seconds the greenlets hammer the worker.
HAMMER_FOR = 4.0
#: A call's deadline, seconds: a reply on this idle loopback worker takes milliseconds.
CALL_TIMEOUT = 3.0
GREENLETS = 64
#: Payload sizes, bytes: empty, typical, and large enough to cross the kernel's socket buffers.
SIZES = (0, 10, 200, 3000, 40_000, 300_000)


def _hammer(client: zqsync.Client, seed: int, until: float, lost: list, wrong: list) -> int:
    rng = random.Random(seed)
    calls = 0
    while time.monotonic() < until and not lost:
        payload = "x" * rng.choice(SIZES) + str(seed)
        try:
            value = client.call("echo", payload)
        except zqsync.CallTimeout as exc:
            lost.append(exc)
            break
        calls += 1
        if value != payload:
            wrong.append((len(payload), len(value or "")))
        roll = rng.random()
        if roll < 0.3:
            client.enqueue("echo", payload[:100])
        elif roll < 0.4:
            gevent.sleep(0)
        elif roll < 0.45:
            gevent.spawn(client.enqueue, "echo", "").join()
    return calls


@pytest.mark.timeout(120)
def test_many_greenlets_hammering_calls_never_lose_a_reply(zq_peer):
    """64 greenlets share one client for a few seconds: calls of mixed sizes (pipes fill and drain,
    edges flip), enqueues, yields and spawned enqueues between calls. Every call returns its own
    payload; a lost wake-up would be a ``CallTimeout``."""
    peer = zq_peer()
    gevent.get_hub()
    lost: list = []
    wrong: list = []
    with zqsync.Client(peer.endpoint, call_timeout=slack(CALL_TIMEOUT), lease_timeout=slack(60.0)) as client:
        client.call("echo", "warm-up")
        until = time.monotonic() + HAMMER_FOR
        greenlets = [gevent.spawn(_hammer, client, n, until, lost, wrong) for n in range(GREENLETS)]
        gevent.joinall(greenlets, timeout=HAMMER_FOR + slack(CALL_TIMEOUT) + slack(60.0))
        failed = [g for g in greenlets if not g.successful()]
        calls = sum(g.value for g in greenlets if g.successful())
    assert not failed, f"{len(failed)} greenlets failed, first: {failed[0].exception!r}"
    assert not lost, f"{len(lost)} calls lost their reply after {calls} calls, first: {lost[0]!r}"
    assert not wrong, f"{len(wrong)} calls got another payload (sent, got lengths): {wrong[:5]}"
    assert calls > GREENLETS, f"only {calls} calls completed"


def _busy(seconds: float) -> None:
    """Hold the hub for ``seconds`` without yielding, so events pile up for one loop iteration."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _busy_after(delay: float, seconds: float) -> None:
    gevent.sleep(delay)
    _busy(seconds)


def _green_dealer(endpoint: str) -> tuple[zmq.green.Context, zmq.Socket]:
    """A zmq.green DEALER of a context of its own, connected to the rpc endpoint of ``endpoint``."""
    gevent.get_hub()
    context = zmq.green.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(split_endpoint(endpoint)[1])
    return context, sock


def _request(request_id: str, task: str, *args) -> bytes:
    return envelope.encode_request("call", request_id, task, args)


@pytest.mark.timeout(60)
def test_a_stale_watcher_of_the_socket_running_after_the_wait_is_armed_does_not_swallow_the_reply(zq_peer):
    """The lost wake-up, made deterministic. While the hub is held, reply A arrives (the socket's
    descriptor turns readable) and two timers expire: the holder's, then the busy greenlet's. In the
    next loop iteration libev queues zmq.green's own watcher of the socket and then the timers, and
    runs the timers first, in order of expiry: the holder reads A, sends B and waits; the busy
    greenlet gives B time to arrive; only then the queued zmq.green watcher runs and reads
    ``EVENTS``, which consumes B's edge. The holder's wait must still end with B, at once."""
    context, sock = _green_dealer(zq_peer().endpoint)
    got: list = []
    stale: list = []

    def holder() -> None:
        gevent.sleep(slack(0.5))
        got.append(envelope.decode_reply(transport.recv(sock, 0.0)).result)
        stale.append(sock._state_event.pending)  # zmq.green's watcher is queued to run after us
        assert transport.send(sock, _request("b", "echo", "B"), slack(5.0))
        started = time.monotonic()
        data = transport.recv(sock, slack(4.0))
        got.append((envelope.decode_reply(data).result if data else None, time.monotonic() - started))

    try:
        assert transport.send(sock, _request("w", "echo", "warm-up"), slack(5.0))
        assert envelope.decode_reply(transport.recv(sock, slack(10.0))).result == "warm-up"
        assert transport.send(sock, _request("a", "delay", 0.1, "A"), slack(5.0))
        assert transport.recv(sock, 0.0) is None  # the pipe is now read-inactive: A's reply raises an edge
        greenlets = [gevent.spawn(_busy_after, slack(0.6), slack(0.5)), gevent.spawn(holder)]
        gevent.sleep(0)  # both are asleep on their timers now
        _busy(slack(1.0))  # meanwhile A's reply arrives and both timers expire
        gevent.joinall(greenlets, timeout=slack(20.0), raise_error=True)
    finally:
        sock.close(linger=0)
        context.term()
    assert stale == [True], "setup: zmq.green's watcher was not pending while the holder ran"
    assert got[0] == "A"
    reply, waited = got[1]
    assert reply == "B", f"the reply to B was lost: the wait ended empty after {waited:.1f} s"


@pytest.mark.timeout(60)
def test_after_a_transport_wait_the_socket_still_wakes_zmq_greens_own_blocking_receive(zq_peer):
    """The wait borrows zmq.green's watcher of the socket and must give it back: zmq.green's own
    blocking ``recv`` (woken only by that watcher) gets the next reply, after a wait that ran out
    and after one that ended with a reply."""
    context, sock = _green_dealer(zq_peer().endpoint)
    try:
        assert transport.recv(sock, 0.05) is None  # a wait that ran out
        assert transport.send(sock, _request("1", "delay", 0.05, "one"), slack(5.0))
        assert envelope.decode_reply(transport.recv(sock, slack(10.0))).result == "one"  # one that got a reply
        assert transport.send(sock, _request("2", "delay", 0.05, "two"), slack(5.0))
        with gevent.Timeout(slack(5.0), AssertionError("zmq.green's recv was never woken")):
            assert envelope.decode_reply(sock.recv()).result == "two"
    finally:
        sock.close(linger=0)
        context.term()
