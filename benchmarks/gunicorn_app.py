"""The demo app (``zqsync/demo/webapp.py``) plus ``/raw-call``: the floor of ``/call`` in the same gunicorn layout.

``/raw-call`` makes the same ``add(1, 1)`` round trip as ``/call``, but by hand: a persistent
``zmq.green`` DEALER per socket slot of this process (at most ``SOCKETS`` at once, as the client's
``pool_size``), ``msgpack.packb`` of the request map, pyzmq's own green ``send`` and ``recv``,
``msgpack.unpackb`` of the reply. No checks, no deadline, no reply-id match, no counters: what a
hand-written caller pays, so ``/call``'s CPU minus ``/raw-call``'s is what zqsync's client adds.
"""

from __future__ import annotations

import os

import msgpack
from flask import jsonify

from zqsync.demo.webapp import ENDPOINT, app
from zqsync.wire.endpoints import split_endpoint

#: Raw sockets per web process, as the client's default pool_size.
SOCKETS = 4
_pool: dict[str, object] = {}


def _sockets():
    """This process's queue of raw green DEALERs, made at first use after the fork (never inherited)."""
    if _pool.get("pid") != os.getpid():
        import gevent.queue
        import zmq.green as zmq

        context = zmq.Context()
        queue = gevent.queue.Queue()
        for _ in range(SOCKETS):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(split_endpoint(ENDPOINT)[1])
            queue.put(sock)
        _pool.update(pid=os.getpid(), queue=queue)
    return _pool["queue"]


@app.get("/raw-call")
def raw_call():
    """``add(1, 1)`` over a raw persistent green DEALER; answer as ``/call`` does."""
    queue = _sockets()
    sock = queue.get()
    try:
        sock.send(msgpack.packb({"v": 1, "id": os.urandom(16).hex(), "kind": "call", "task": "add",
                                 "args": [1, 1], "kwargs": {}}))
        reply = msgpack.unpackb(sock.recv())
    finally:
        queue.put(sock)
    return jsonify(result=reply["result"], pid=os.getpid())
