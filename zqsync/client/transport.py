"""Deadline-bounded send and receive for plain and green (``zmq.green``) sockets.

``timeout`` is seconds as a float: ``0`` makes one non-blocking attempt,
``None`` waits without bound. Every operation first tries ``NOBLOCK``.

A plain socket that must wait uses ``RCVTIMEO``/``SNDTIMEO`` with a blocking
call: measured on loopback, that costs the same as a bare blocking call,
where a ``poll`` first added about 4 us per round trip.

A green socket is driven at the C level (``zmq.backend.Socket``'s methods):
zmq.green's own send and receive read ``EVENTS`` after every operation, a
``poll`` and a ``getpid`` system call each. Only an operation that would
block waits, on the socket's ``FD`` under a deadline of its own (docs/design.md,
pool rule 12: zmq.green ignores ``RCVTIMEO``/``SNDTIMEO``; only our own
deadline is swallowed, and a caller's ``gevent.Timeout`` propagates
untouched). The wait keeps ZeroMQ's edge-triggered protocol:

* The ``FD`` turns readable when a command reaches the socket, and whoever
  next reads ``EVENTS`` or operates on the socket consumes that signal. So
  ``EVENTS`` is read after the last operation, before sleeping; a command
  that comes later leaves the ``FD`` readable until the wait sees it.
* zmq.green keeps a watcher of its own on the ``FD``, whose callback reads
  ``EVENTS``. A run of it queued in a loop iteration that first ran our
  greenlet would come after our wait was armed and consume the edge of a
  reply that arrived meanwhile: the wait would sleep through the reply
  until its deadline (``tests/integration/test_green_wait.py``). So the wait
  borrows that watcher: stopping it drops any queued run, the wait runs on
  it, and its own callback is put back after. Outside a wait the socket is
  an ordinary zmq.green socket.
* Nothing else can consume an edge during the wait: a pooled socket has one
  lessee at a time (pool rule 2), and the sweeper and the express lane touch
  idle sockets only.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

import zmq

_c_send = zmq.backend.Socket.send  # C-level, even on a zmq.green socket: no EVENTS poll after it
_c_recv = zmq.backend.Socket.recv
_c_get = zmq.backend.Socket.get


def _is_green(sock: zmq.Socket) -> bool:
    return type(sock).__module__.startswith("zmq.green")


def _ms(timeout: Optional[float]) -> int:
    return -1 if timeout is None else max(0, math.ceil(timeout * 1000))


class _Expired(Exception):
    """Our own deadline ran out while waiting on a green socket's descriptor."""


def _green(sock: zmq.Socket, operation: Callable[[], Any], event: int, timeout: Optional[float]) -> Any:
    """Retry ``operation`` (a C-level ``NOBLOCK`` call) until it succeeds, waiting cooperatively for
    ``event`` (``zmq.POLLIN``/``zmq.POLLOUT``) in between; ``None`` once ``timeout`` seconds ran out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return operation()
        except zmq.Again:
            pass
        if not int(_c_get(sock, zmq.EVENTS)) & event and not _wait(sock, deadline):
            return None


def _wait(sock: zmq.Socket, deadline: Optional[float]) -> bool:
    """Sleep until the socket's ``FD`` signals, on zmq.green's own watcher of it, borrowed for the
    wait (module docstring); ``False`` if ``deadline`` (monotonic seconds, ``None``: none) passed first."""
    from gevent.socket import wait as wait_on_watcher

    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        return False
    watcher = _watcher(sock)
    callback = watcher.callback
    watcher.stop()  # also drops a run of it already queued in this loop iteration
    try:
        wait_on_watcher(watcher, remaining, _Expired)
    except _Expired:
        return False
    finally:
        if _watcher(sock) is watcher:  # zmq.green did not close the socket meanwhile
            watcher.start(callback)
    return True


def _watcher(sock: zmq.Socket) -> Any:
    """zmq.green's own io watcher of the socket's ``FD``; ``None`` once the socket is closed."""
    return None if sock.closed else getattr(sock, "_state_event", None)


def send(sock: zmq.Socket, frame: bytes, timeout: Optional[float]) -> bool:
    """Send one frame, waiting at most ``timeout`` seconds for the socket to accept it.

    Blocks only the calling greenlet on a green socket.

    :returns: ``True`` if ZeroMQ took the frame, ``False`` if the deadline ran out.
    :raises zmq.ZMQError: any error other than "would block".
    """
    try:
        _c_send(sock, frame, zmq.NOBLOCK)  # the common case: room in the pipe, no wait, no option to set
        return True
    except zmq.Again:
        if timeout == 0:
            return False
    if _is_green(sock):
        return _green(sock, lambda: _c_send(sock, frame, zmq.NOBLOCK) or True, zmq.POLLOUT, timeout) is True
    try:
        sock.setsockopt(zmq.SNDTIMEO, _ms(timeout))
        sock.send(frame)
        return True
    except zmq.Again:
        return False


def recv(sock: zmq.Socket, timeout: Optional[float]) -> Optional[bytes]:
    """Receive one frame, waiting at most ``timeout`` seconds.

    Blocks only the calling greenlet on a green socket.

    :returns: the frame's bytes, or ``None`` if the deadline ran out.
    :raises zmq.ZMQError: any error other than "would block".
    """
    try:
        if timeout == 0:
            return _c_recv(sock, zmq.NOBLOCK)
        if _is_green(sock):
            return _green(sock, lambda: _c_recv(sock, zmq.NOBLOCK), zmq.POLLIN, timeout)
        sock.setsockopt(zmq.RCVTIMEO, _ms(timeout))
        return sock.recv()
    except zmq.Again:
        return None
