"""Deadline-bounded send and receive on ``zmq.asyncio`` sockets (the asyncio twin of ``client/transport.py``).

``timeout`` is seconds as a float: ``0`` makes one non-blocking attempt, ``None`` waits without
bound. A send first tries ``NOBLOCK``. A wait is pyzmq's: the socket's
``SNDTIMEO``/``RCVTIMEO``, set before each wait, arm a timer on the loop that fails the future
with ``zmq.Again``, so no task is created per request. Cancelling the awaiting task cancels the
future: a cancelled send sent nothing, and the pool discards the socket of a cancelled receive.
"""

from __future__ import annotations

import math
from typing import Optional

import zmq
import zmq.asyncio


def _ms(timeout: Optional[float]) -> int:
    return -1 if timeout is None else max(0, math.ceil(timeout * 1000))


async def send(sock: zmq.asyncio.Socket, frame: bytes, timeout: Optional[float]) -> bool:
    """Send one frame, waiting at most ``timeout`` seconds for room; ``False`` if the deadline ran out.

    :raises zmq.ZMQError: any error other than "would block".
    """
    try:
        await sock.send(frame, zmq.NOBLOCK)  # the common case: room in the pipe, no option to set
        return True
    except zmq.Again:
        if timeout == 0:
            return False
    try:
        sock.setsockopt(zmq.SNDTIMEO, _ms(timeout))
        await sock.send(frame)
        return True
    except zmq.Again:
        return False


async def recv(sock: zmq.asyncio.Socket, timeout: Optional[float]) -> Optional[bytes]:
    """Receive one frame, waiting at most ``timeout`` seconds; ``None`` if the deadline ran out.

    :raises zmq.ZMQError: any error other than "would block".
    """
    try:
        if timeout == 0:
            return await sock.recv(zmq.NOBLOCK)  # type: ignore[no-any-return]
        sock.setsockopt(zmq.RCVTIMEO, _ms(timeout))
        return await sock.recv()  # type: ignore[no-any-return]
    except zmq.Again:
        return None
