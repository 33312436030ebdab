"""Deadline-bounded send and receive for plain and green (``zmq.green``) sockets.

A green socket is driven at the C level: the operation is tried with
``NOBLOCK`` through ``zmq.Socket``'s own methods (not zmq.green's, which read
``EVENTS`` after every operation: a ``poll`` and a ``getpid`` system call
each), and only when it would block does the calling greenlet wait on a
gevent io watcher for the socket's ``FD``. That descriptor is edge-triggered,
so ``EVENTS`` is read once before each wait: an edge that came before the
wait is not missed. The deadline is the watcher wait's own timeout, so no
``gevent.Timeout`` is armed for an operation that does not wait, and a
caller's ``gevent.Timeout`` propagates untouched (docs/design.md, pool rule
12). A plain socket uses ``RCVTIMEO``/``SNDTIMEO`` with a blocking call:
measured on loopback, that costs the same as a bare blocking call, where a
``poll`` first added about 4 us per round trip.

``timeout`` is seconds as a float: ``0`` makes one non-blocking attempt,
``None`` waits without bound.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

import zmq


def _is_green(sock: zmq.Socket) -> bool:
    return type(sock).__module__.startswith("zmq.green")


def _ms(timeout: Optional[float]) -> int:
    return -1 if timeout is None else max(0, math.ceil(timeout * 1000))


class _Expired(Exception):
    """Our own deadline ran out while waiting on a green socket's descriptor."""


def _green(sock: zmq.Socket, operation: Callable[[], Any], event: int, timeout: Optional[float]) -> Any:
    """Run ``operation`` (a C-level ``NOBLOCK`` call) until it succeeds, waiting cooperatively for
    ``event`` (``POLLIN``/``POLLOUT``); ``None`` once ``timeout`` seconds ran out."""
    from gevent.socket import wait_read

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return operation()
        except zmq.Again:
            pass
        if _events(sock) & event:
            continue  # ready already: the edge came before we looked
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        try:
            wait_read(_fd(sock), remaining, _Expired)
        except _Expired:
            return None


_get = zmq.Socket.get  # C-level: zmq.green's get() would run its own state check after EVENTS


def _events(sock: zmq.Socket) -> int:
    return int(_get(sock, zmq.EVENTS))


def _fd(sock: zmq.Socket) -> int:
    return int(_get(sock, zmq.FD))


_c_send = zmq.backend.Socket.send  # C-level: neither zmq.green's EVENTS check nor the sugar layer
_c_recv = zmq.backend.Socket.recv


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
