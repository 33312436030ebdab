"""Deadline-bounded send and receive for plain and green (``zmq.green``) sockets.

zmq.green ignores ``RCVTIMEO``/``SNDTIMEO`` (docs/design.md, pool rule 12), so a
green socket waits under a ``gevent.Timeout``; only our own timer is
swallowed, and a caller's ``gevent.Timeout`` propagates untouched (gevent's
``except Timeout as ex: if ex is not timer: raise`` idiom). A plain socket
uses ``RCVTIMEO``/``SNDTIMEO`` with a blocking call: measured on loopback,
that costs the same as a bare blocking call, where a ``poll`` first added
about 4 us per round trip.

``timeout`` is seconds as a float: ``0`` makes one non-blocking attempt,
``None`` waits without bound.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import zmq


def _is_green(sock: zmq.Socket) -> bool:
    return type(sock).__module__.startswith("zmq.green")


def _ms(timeout: Optional[float]) -> int:
    return -1 if timeout is None else max(0, math.ceil(timeout * 1000))


def _green_wait(operation: Callable[[], Any], timeout: Optional[float]) -> Any:
    import gevent

    timer = gevent.Timeout._start_new_or_dummy(timeout)
    try:
        return operation()
    except gevent.Timeout as ex:
        if ex is not timer:
            raise
        return None
    finally:
        timer.close()


def send(sock: zmq.Socket, frame: bytes, timeout: Optional[float]) -> bool:
    """Send one frame, waiting at most ``timeout`` seconds for the socket to accept it.

    Blocks only the calling greenlet on a green socket.

    :returns: ``True`` if ZeroMQ took the frame, ``False`` if the deadline ran out.
    :raises zmq.ZMQError: any error other than "would block".
    """
    try:
        sock.send(frame, zmq.NOBLOCK)  # the common case: room in the pipe, no wait, no option to set
        return True
    except zmq.Again:
        if timeout == 0:
            return False
    try:
        if _is_green(sock):
            return _green_wait(lambda: sock.send(frame) or True, timeout) is True
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
            return sock.recv(zmq.NOBLOCK)
        if _is_green(sock):
            return _green_wait(sock.recv, timeout)
        sock.setsockopt(zmq.RCVTIMEO, _ms(timeout))
        return sock.recv()
    except zmq.Again:
        return None
