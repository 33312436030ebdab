"""Enqueue's express lane: one non-blocking send on an idle pooled job socket (a send-only DEALER), in place.

`try_send` is what ``Client.enqueue`` tries first. It either hands the
frame to ZeroMQ at once and returns ``True``, or touches nothing and returns
``False``; the caller then takes the full path (``SocketPool.lease`` and
congestion control), which applies every rule on its own.

It bypasses the lease object, the permit wait and congestion control's
timers, and keeps the pool's rules (docs/design.md, "The pool's rules") as
follows:

* **Fork check on every call (rule 9).** The pid (``process.getpid``: right
  after any fork, C-level ones included) is compared with the pool's pid
  before anything else; after a fork the lane declines and the full lease
  resets the pool.
* **Per-owner keying (rule 1).** The owner key is `current_owner`'s, as a
  lease's (its per-thread caches carry the pid and the hub).
* **Exclusive lease (rule 2).** The socket stays in its idle bucket and is
  used only while the pool's lock is held, without yielding (a C-level
  ``NOBLOCK`` send never waits), so no other lessee can hold it at the same
  time. The lock is taken without blocking: if another thread holds it, the
  lane declines (contention goes to the full path).
* **The cap and its fairness (rules 5 and 6).** The lane sends only if a
  permit of the owner is free and nobody queues for one; otherwise it
  declines, so it never overtakes a waiter. It reads the permits rather than
  taking one: the send neither yields nor releases the lock, so for its
  duration it is the one user of that free permit, and nothing can observe
  the difference.
* **Errors (rule 3).** Only a send that succeeds is counted. ``EAGAIN``
  (the high-water mark is full) and any other ``ZMQError`` make the lane
  decline: the full path then waits under congestion control, or meets the
  error inside a lease, which discards the socket. A send either queues the
  whole frame or nothing, so a declined attempt never queued half a job.
* **Nested leases (rule 7).** A caller that holds a lease is declined; the
  full lease raises `PoolError`.
* **First use** (no bucket, no idle socket) and a closed pool decline too.
  Owners that ended are swept by the full path and the sweeper thread
  (rule 8); the lane never creates an owner or a socket.

Stopping notices (``notices.py``): every `notices.CHECK_EVERY` sends
on a socket, the lane reads ``ZMQ_EVENTS`` and declines if something is
waiting to be read, so the full path looks for the notice and retires the
socket. The caller passes the address with stopping workers left out.

Congestion control: the lane runs only for an address that is not marked
congested. A successful non-blocking send is what BLOCK and an unmarked DROP
would do first, and clears nothing that is set; a marked address (early drop)
always takes the full path.
"""

from __future__ import annotations

from typing import Any

import zmq
from greenlet import getcurrent

from . import notices
from .owner import current_owner
from .pool import SocketPool, _holders
from .process import getpid

_c_send = zmq.backend.Socket.send  # the C-level send, even on a zmq.green socket: no EVENTS poll after it
_c_get: Any = zmq.backend.Socket.get  # returns an int for EVENTS
# Plain ints: pyzmq's enum members cost an enum operation each time they are combined.
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def try_send(pool: SocketPool, address: Any, frame: bytes) -> bool:
    """Send ``frame`` on an idle socket of ``pool`` for ``address`` without waiting.

    :param pool: a send-only `SocketPool` (the client's job DEALERs, or PUSH).
    :param address: the endpoint (or tuple of endpoints) the bucket is keyed by.
    :param frame: the encoded request, bytes.
    :returns: ``True`` if ZeroMQ took the frame; ``False`` if the lane declined
        (see the module docstring) and nothing was sent.

    Never blocks and never raises a ``ZMQError``.
    """
    pid = getpid()
    if pool._pid != pid or pool._closed or getcurrent() in _holders:
        return False
    key = (current_owner(pid).key, address)
    permits = pool._permits.get(key)
    lock = pool._lock
    if permits is None or not lock.acquire(False):
        return False
    try:
        bucket = pool._idle.get(key)
        if not bucket or not permits.available():
            return False
        sock = bucket[-1]
        sent = pool._sent
        count = sent.get(sock, 0)
        if not count % notices.CHECK_EVERY and _c_get(sock, _EVENTS) & _POLLIN:
            return False  # maybe a worker's stopping notice: the full path reads it
        try:
            _c_send(sock, frame, _NOBLOCK)
        except zmq.ZMQError:
            return False
        pool._stats["reused"] += 1
        sent[sock] = count + 1  # SocketPool.note_sent, inline: the lock is held
        return True
    finally:
        lock.release()
