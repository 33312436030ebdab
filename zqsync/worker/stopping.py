"""A stopping worker's notice to its job clients (DEALER to ROUTER), and its drain.

Job sockets are DEALER (client) to ROUTER (worker), so a worker can speak to
every client connection that sent it a job. On TERM, a standalone worker does
not unbind at once (that would drop what is in flight in the client's queue
and both kernels' buffers): it sends every identity it has received from a
``stopping`` notice (`encode_notice`) and keeps reading. It reads what is in
flight first, until quiet (at most ``READ_FIRST``): a client that closed its
socket after its last job answers a message written to it with a TCP reset,
and a reset makes this side's kernel throw away what it still holds of that
connection (thousands of jobs, when the worker's queue was full). A client that
sees the notice discards its socket (libzmq flushes its queue within the
linger) and routes around the worker (``zqsync/client/notices.py``). A
connection that never sent has nothing in flight. The worker unbinds once no
job has arrived for ``quiet`` seconds (every notified client has gone or
fallen silent), or at ``limit``.

A prefork supervisor does the same on its public jobs socket, from its router thread (``dispatch.py``):
this module imports no gevent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack
import zmq

#: The notice's ``notice`` field.
STOPPING = "stopping"
#: Jobs read in a row while draining before the hub gets a turn.
BATCH = 1000
#: Seconds without a job after which a stopping worker's jobs queue counts as drained.
DRAIN_QUIET = 0.2
#: Most seconds a stopping worker reads what its clients still send before it unbinds (then again after).
DRAIN_LIMIT = 5.0
#: Most seconds a stopping worker reads what is in flight before it sends its notice (see above).
READ_FIRST = 1.0
#: Identities remembered per socket (the oldest are forgotten past it; a forgotten one is told when it sends).
MAX_PEERS = 10_000


def encode_notice(endpoint: str, also: tuple[str, ...] = ()) -> bytes:
    """The one-frame notice: ``{"v": 1, "notice": "stopping", "endpoint": ENDPOINT}``, and ``"also": [ENDPOINT,
    ...]`` when the worker's jobs socket is bound to more endpoints (a direct prefork child: its slot's and the
    public one, which a client that did not expand the slots sent to)."""
    notice: dict[str, object] = {"v": 1, "notice": STOPPING, "endpoint": endpoint}
    if also:
        notice["also"] = list(also)
    return msgpack.packb(notice)


class Peers:
    """The identities that sent on a ROUTER jobs socket, and the notice once stopping."""

    def __init__(self, sock: zmq.Socket, endpoint: str) -> None:
        self.sock, self.endpoint = sock, endpoint
        #: The endpoint the notice names (clients leave it out for a while): ``endpoint``, or ``""`` for none.
        self.named = endpoint
        #: More endpoints the notice names (the socket's other binds).
        self.also: tuple[str, ...] = ()
        self.seen: dict[bytes, None] = {}  # insertion-ordered, bounded by MAX_PEERS
        self.notified: set[bytes] = set()
        self.stopping = False

    def receive(self, flags: int = 0) -> bytes:
        """Read one job (``[identity, frame]``); returns the frame. Blocks unless ``flags`` says NOBLOCK.

        :raises zmq.Again: NOBLOCK and nothing to read."""
        return self.frame(self.sock.recv_multipart(flags))

    def frame(self, frames: list[bytes]) -> bytes:
        """The job of a message read from the ROUTER (``[identity, frame]``), its sender remembered."""
        identity, *rest = frames
        if identity not in self.seen or (self.stopping and identity not in self.notified):
            self.seen[identity] = None
            if len(self.seen) > MAX_PEERS:
                del self.seen[next(iter(self.seen))]
            if self.stopping:
                self._notify(identity)
        return rest[0] if len(rest) == 1 else b""  # a job is one frame: any other count decodes as malformed

    def notify_all(self) -> int:
        """Send the notice to every identity seen so far (never blocks); returns how many."""
        self.stopping = True
        for identity in self.seen:
            self._notify(identity)
        return len(self.notified)

    def _notify(self, identity: bytes) -> None:
        try:
            self.sock.send_multipart([identity, encode_notice(self.named, self.also)], zmq.NOBLOCK)
        except zmq.ZMQError:  # gone, or its queue full: it stops sending or the quiet period ends it
            return
        self.notified.add(identity)


def drain(receive: Callable[[int], bytes], sock: zmq.Socket, keep: Callable[[bytes], None], *,
          quiet: float, limit: float, pause: Callable[[], None], done: Callable[[], bool] = lambda: False) -> None:
    """Read jobs with ``receive(flags)`` into ``keep`` until ``done()``, or none arrives for ``quiet`` seconds,
    or ``limit`` seconds have passed. Calls ``pause()`` after every `BATCH` jobs (a flood must not
    block a gevent hub: pass ``gevent.sleep``). Blocks (cooperatively with ``zmq.green`` sockets)."""
    deadline = time.monotonic() + limit
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sock.poll(int(min(quiet, remaining) * 1000)):
            return
        for _ in range(BATCH):
            try:
                keep(receive(zmq.NOBLOCK))
            except zmq.Again:
                break
        pause()
