"""Direct prefork's listening sockets (``worker/listeners.py``) and the client's opt-in expansion of announced slots."""

from __future__ import annotations

import socket

import pytest
import zmq

import zqsync
from tests.helpers import slack
from zqsync.errors import ConfigurationError
from zqsync.worker import Registry
from zqsync.worker.listeners import Listeners, bind_inherited


def test_a_taken_port_of_the_run_is_a_one_line_error_naming_it():
    free = Listeners("tcp://127.0.0.1:0", 2)
    base = free.port
    free.close()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", base + 3))
        taken.listen(1)
        with pytest.raises(ConfigurationError) as caught:
            Listeners(f"tcp://127.0.0.1:{base}", 2)
    message = str(caught.value)
    assert f"cannot bind tcp://127.0.0.1:{base + 3}" in message and f"ports {base}..{base + 5}" in message
    assert "\n" not in message
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):  # what it had opened, it closed
        probe.connect(("127.0.0.1", base))


def test_port_zero_finds_a_free_run_that_clients_can_reach():
    listeners = Listeners("tcp://127.0.0.1:0", 2)
    try:
        assert listeners.slots == (listeners.port + 2, listeners.port + 4)
        for port in range(listeners.port, listeners.port + 6):
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    finally:
        listeners.close()


def test_an_expanding_client_keeps_a_worker_that_announces_no_slots(zq_inprocess):
    worker = zq_inprocess(Registry())
    with zqsync.Client(worker.endpoint, expand_prefork=True) as expanding:
        assert expanding.call("zqsync.ping") == "pong"  # zqsync.endpoints is unknown there: it stands for itself
        assert expanding.endpoints == (worker.endpoint,)



#: Connections to the shared listening socket: each one is a chance for a child that loses its accept to stall.
SHARED_ROUNDS = 1000
#: Children sharing it: every one woken by a connection that one of them takes (more losers, more chances).
SHARING = 4


@pytest.mark.timeout(60)
def test_a_connection_a_sibling_accepted_never_stalls_a_childs_own_listener():
    """Children bind the shared public listening socket and one of their own each (here: contexts, each with
    its own I/O thread, as forked children have). A connection to the shared one wakes them all; one that loses
    the accept must go back to waiting, not block in ``accept4`` (its whole I/O thread with it): else its own
    slot's connections sit in the kernel's accept queue for good (issue 22, the accept fault)."""
    listeners = Listeners("tcp://127.0.0.1:0", SHARING)
    children = [zmq.Context() for _ in range(SHARING)]
    peer = zmq.Context()
    routers: list = []
    try:
        routers += [_bind_child(context, listeners.backend(slot, "")) for slot, context in enumerate(children)]
        public = f"tcp://127.0.0.1:{listeners.port}"
        for round_ in range(SHARED_ROUNDS):
            _send_once(peer, public, routers, f"round {round_}: the shared listener")
            for slot, port in enumerate(listeners.slots):
                _send_once(peer, f"tcp://127.0.0.1:{port}", routers[slot:slot + 1],
                           f"round {round_}: child {slot}'s own listener, after a connection to the shared one")
    finally:
        _destroy(children, routers, listeners, peer)


def _bind_child(context: zmq.Context, backend) -> zmq.Socket:
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    public_jobs, _, own_jobs, _ = backend.bindings()
    for fd, endpoint in (public_jobs, own_jobs):
        bind_inherited(router, fd, endpoint)
    return router


def _send_once(context: zmq.Context, endpoint: str, receivers: list, what: str, timeout: float = 5.0) -> None:
    """A new connection to ``endpoint`` sends one message; one of ``receivers`` must read it within ``timeout``
    seconds (stretched by `slack`)."""
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(endpoint)
        dealer.send(b"hello")
        poller = zmq.Poller()
        for router in receivers:
            poller.register(router, zmq.POLLIN)
        ready = dict(poller.poll(slack(timeout) * 1000))
        assert ready, f"{what}: no child read a message sent to {endpoint} within {slack(timeout)} s"
        for router in ready:
            router.recv_multipart()
    finally:
        dealer.close(linger=0)


def _destroy(children: list, routers: list, listeners: Listeners, peer: zmq.Context) -> None:
    """Destroy every context, also those a failure of the test above leaves stuck in ``accept4`` on the shared
    listener (destroying one waits for its I/O thread): the others first, then one connection per stuck one
    (each wakes one blocked ``accept4``)."""
    stuck = []
    for slot, context in enumerate(children):
        try:
            _send_once(peer, f"tcp://127.0.0.1:{listeners.slots[slot]}", routers[slot:slot + 1], "", timeout=0.5)
        except (AssertionError, IndexError):  # no answer, or never bound
            stuck.append(context)
        else:
            context.destroy(linger=0)
    peer.destroy(linger=0)
    unstick = [socket.create_connection(("127.0.0.1", listeners.port), timeout=5) for _ in stuck]
    for context in stuck:
        context.destroy(linger=0)
    for connection in unstick:
        connection.close()
    listeners.close()
