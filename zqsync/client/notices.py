"""Stopping notices on job (DEALER) sockets: see ``zqsync/worker/stopping.py``.

The client looks for a notice before a send, at most every `CHECK_EVERY`
sends on a socket (one ``ZMQ_EVENTS`` read, non-blocking). On a notice the
socket is discarded with the normal linger (libzmq flushes its queue to the
worker, which keeps reading while it stops), and the client leaves that
endpoint out for `AVOID_FOR` seconds: a client listing several workers
sends to the others, and one whose workers all stop gets the normal "no
worker" behaviour (its socket connects to none: BLOCK raises ``Congested`` at
the send deadline, DROP drops and counts). After that it connects again: to a
restarted worker, or to a worker still draining, which tells it again.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import msgpack
import zmq

#: Sends on one socket between two looks for a notice (the first send looks too).
CHECK_EVERY = 16
#: Seconds a client leaves out a stopping worker (a stopping worker unbinds once its clients fall quiet).
AVOID_FOR = 1.0


def stopping_endpoints(sock: zmq.Socket) -> Optional[tuple[str, ...]]:
    """The endpoints named by a stopping notice waiting on ``sock`` (its ``endpoint``, then its ``also``;
    ``()`` if unnamed), or ``None`` if no notice waits.

    Never blocks. ``sock.get`` is the green socket's, which keeps a waiting sender's wakeup."""
    found = None
    while int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
        try:
            notice = msgpack.unpackb(sock.recv(zmq.NOBLOCK))
        except (zmq.Again, ValueError, msgpack.ExtraData):
            continue
        if isinstance(notice, dict) and notice.get("notice") == "stopping":
            also = notice.get("also")
            names = [notice.get("endpoint"), *(also if isinstance(also, list) else ())]
            found = tuple(str(name) for name in names if name)
    return found


def match(named: tuple[str, ...], endpoints: tuple[str, ...]) -> Optional[str]:
    """The client endpoint a notice names: the first of ``named`` that is one of ``endpoints`` by string,
    else by port (the only one with that port)."""
    for endpoint in named:
        if endpoint in endpoints:
            return endpoint
        port = endpoint.rpartition(":")[2]
        same = [name for name in endpoints if name.rpartition(":")[2] == port]
        if len(same) == 1:
            return same[0]
    return None


class Avoided:
    """Endpoints left out until a deadline (monotonic seconds).

    :ivar until: ``{endpoint: monotonic seconds}``; empty (the common case, read without a call) when none is.
    """

    def __init__(self) -> None:
        self.until: dict[str, float] = {}

    def add(self, endpoint: str) -> None:
        self.until[endpoint] = time.monotonic() + AVOID_FOR

    def address(self, endpoints: tuple[str, ...], default: Any) -> Any:
        """``default``, or the endpoints not avoided (``()``: every one is, connect to none)."""
        if not self.until:
            return default
        now = time.monotonic()
        self.until = {name: until for name, until in self.until.items() if until > now}
        kept = tuple(name for name in endpoints if name not in self.until)
        if len(kept) == len(endpoints):
            return default
        return kept if len(kept) != 1 else kept[0]
