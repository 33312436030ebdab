"""Every reply reaches the client that asked, whichever path sent it (``worker/inline.py``'s `Reader.reply`).

Seen from the peers' side: raw DEALERs, each with its own routing id, send a mix of requests without
waiting for answers, so the worker has many in flight at once: calls it runs inline in its receiver,
calls whose task yields (answered later from a handed-off greenlet, several in one wake-up), confirmed
jobs (answered in a batch from the hub after their group commit) and the worker's own ``zqsync.ping``
(answered from an admin greenlet). Each client must get back exactly the ids it sent, each with its own
result, and nothing of another client's.
"""

from __future__ import annotations

import os

import gevent
import pytest
import zmq

from tests.helpers import slack
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint
from zqsync.worker import Registry

pytestmark = pytest.mark.timeout(60)

CLIENTS = 6
#: Requests each client sends before it reads any reply (well below every HWM and the worker's slots).
EACH = 40

registry = Registry()


@registry.task
def tag(value):
    """Answered at once: run inline in the receiving greenlet."""
    return value


@registry.task
def nap(value):
    """Yields once, so its reply goes from another greenlet, together with its neighbours'."""
    gevent.sleep(0.001)
    return value


def request(client: int, n: int) -> tuple[str, bytes, object]:
    """The ``n``-th request of ``client``: its id, its frame and the result its reply must carry."""
    request_id = f"c{client}-{n}-{os.urandom(4).hex()}"
    kind, task = [("call", "tag"), ("call", "nap"), ("confirm", "tag"), ("call", "zqsync.ping")][n % 4]
    value = [client, n]
    args = () if task == "zqsync.ping" else (value,)
    frame = envelope.encode_request(kind, request_id, task, args, deadline=slack(30.0))
    expected = "pong" if task == "zqsync.ping" else request_id if kind == "confirm" else value
    return request_id, frame, expected


def answered(reply: envelope.Reply) -> object:
    """What a reply carries: the call's result, or the id a confirmation acknowledges."""
    assert reply.ok, reply.error
    return reply.result["job_id"] if isinstance(reply.result, dict) else reply.result


def test_each_client_gets_its_own_replies_from_every_reply_path(zq_inprocess, tmp_path):
    worker = zq_inprocess(registry, state_dir=str(tmp_path), concurrency=64)
    rpc = split_endpoint(worker.endpoint)[1]
    context = zmq.Context()
    sockets = []
    try:
        for client in range(CLIENTS):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, f"peer-{client}".encode())
            sock.setsockopt(zmq.SNDTIMEO, int(slack(10.0) * 1000))
            sock.connect(rpc)
            sockets.append(sock)
        expected: list[dict[str, object]] = [{} for _ in range(CLIENTS)]
        for n in range(EACH):  # interleaved, so the worker has every client's requests in flight together
            for client, sock in enumerate(sockets):
                request_id, frame, result = request(client, n)
                expected[client][request_id] = result
                sock.send(frame)
        got = read_replies(sockets, slack(20.0))
        for client in range(CLIENTS):
            strays = {request_id: result for request_id, result in got[client].items()
                      if request_id not in expected[client]}
            assert not strays, (f"client {client} got {len(strays)} replies to requests it never sent, "
                                f"e.g. {sorted(strays.items())[:3]}")
            assert got[client] == expected[client], f"client {client}: replies {got[client]} != {expected[client]}"
    finally:
        for sock in sockets:
            sock.close(linger=0)
        context.term()


def read_replies(sockets: list[zmq.Socket], timeout: float) -> list[dict[str, object]]:
    """Every reply the sockets get until each has ``EACH`` (or ``timeout`` seconds pass): per socket,
    ``{reply id: what it carries}``."""
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    got: list[dict[str, object]] = [{} for _ in sockets]
    while sum(map(len, got)) < EACH * len(sockets):
        ready = dict(poller.poll(timeout * 1000))
        assert ready, f"replies stopped coming: got {[len(one) for one in got]} of {EACH} per client"
        for index, sock in enumerate(sockets):
            while sock in ready and sock.poll(0):
                reply = envelope.decode_reply(sock.recv())
                assert reply.id not in got[index], f"client {index} got two replies to {reply.id}"
                got[index][reply.id] = answered(reply)
    return got
