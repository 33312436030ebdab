"""Congestion control for enqueue over the job sockets (send-only DEALER; PUSH works too): BLOCK, or DROP with early drop.

Follows zenoh's congestion control (zenoh PRs 1627 and 1740):

* ``BLOCK`` waits up to the send deadline for the peer's high-water mark to
  make room, then raises `Congested`.
* ``DROP`` waits at most ``wait_before_drop`` seconds, then drops the message
  and marks the peer congested. While marked, every further message makes one
  non-blocking attempt and never waits: a success sends it and clears the
  mark, a failure drops it at once (early drop).

zenoh's first version could leave the flag set forever when the consumer
drained between the deadline expiring and the flag being set. Here only a
sender clears the mark, by a successful non-blocking attempt that every
marked message makes, so a drained peer is un-marked by the very next
message whatever the interleaving: the mark cannot stick.

The mark is per peer address and per process, shared by every hub and thread
(set operations are atomic under the GIL); a forked child starts unmarked.

A socket's first send under DROP may wait up to `CONNECT_GRACE`
instead of ``wait_before_drop``: with ``ZMQ_IMMEDIATE`` nothing can be sent
before the TCP and ZMTP handshakes complete, which takes more than a
millisecond on a busy machine (over 0.1 s with the CPUs loaded), and a healthy
worker must not lose the first job of every new socket. The price: a new
socket's first DROP job to an absent worker waits that long, once.
"""

from __future__ import annotations

import enum
import logging
import weakref
from typing import Any, Optional

import zmq

from .. import _common
from ..errors import Congested
from ..logs import RateLimitedLog
from . import transport

log = logging.getLogger(__name__)

#: Seconds between two log lines about drops to one address.
DROP_LOG_INTERVAL = 10.0
#: Seconds a socket's first DROP send may wait for its connection to complete (a handshake took
#: over 0.1 s on a 2-core machine with its CPUs loaded; the wait ends as soon as the job goes out).
CONNECT_GRACE = 1.0


class CongestionControl(enum.Enum):
    """What ``enqueue`` does when the worker cannot take a job right now."""

    BLOCK = "block"
    DROP = "drop"

    @classmethod
    def parse(cls, value: "CongestionControl | str") -> "CongestionControl":
        """Accept a member or its name/value, case-insensitively."""
        if isinstance(value, cls):
            return value
        return cls(str(value).lower())


class CongestionState:
    """Per-process congestion marks and drop counters, keyed by peer address."""

    def __init__(self) -> None:
        self._reset()
        _common.on_fork_in_child(self._reset)

    def _reset(self) -> None:
        self._marked: set[Any] = set()
        self._tried: weakref.WeakSet[Any] = weakref.WeakSet()
        self.drops = 0
        self._log = RateLimitedLog(log, DROP_LOG_INTERVAL)

    def is_marked(self, address: Any) -> bool:
        """Whether ``address`` is currently marked congested in this process."""
        return address in self._marked

    def send(
        self,
        sock: zmq.Socket,
        frame: bytes,
        address: Any,
        mode: CongestionControl,
        *,
        send_timeout: Optional[float],
        wait_before_drop: float,
    ) -> bool:
        """Hand ``frame`` to ZeroMQ under ``mode``.

        :param send_timeout: BLOCK's deadline in seconds (``None``: no bound).
        :param wait_before_drop: DROP's wait in seconds for an unmarked peer.
        :returns: ``True`` if sent, ``False`` if dropped (DROP only).
        :raises Congested: BLOCK and the deadline ran out.
        """
        sent = transport.send(sock, frame, self.budget(sock, address, mode, send_timeout, wait_before_drop))
        return self.outcome(address, mode, sent, send_timeout)

    def budget(self, sock: Any, address: Any, mode: CongestionControl, send_timeout: Optional[float],
               wait_before_drop: float) -> Optional[float]:
        """How long (seconds, ``None``: no bound) a send under ``mode`` may wait for room; the pure half of
        `send`, shared with the asyncio client (``zqsync/aio``), which does its own waiting."""
        if mode is CongestionControl.BLOCK:
            return send_timeout
        return 0.0 if address in self._marked else self._wait_for(sock, wait_before_drop)

    def outcome(self, address: Any, mode: CongestionControl, sent: bool, send_timeout: Optional[float]) -> bool:
        """Record a send's result under ``mode`` (mark, unmark, count a drop); ``sent`` as `send` returns it.

        :raises Congested: BLOCK and the frame was not sent.
        """
        if sent:
            self._marked.discard(address)
            return True
        if mode is CongestionControl.BLOCK:
            raise Congested(address, send_timeout or 0.0)
        self._marked.add(address)
        self._dropped(address)
        return False

    def _wait_for(self, sock: Any, wait_before_drop: float) -> float:
        if sock in self._tried:
            return wait_before_drop
        self._tried.add(sock)
        return max(wait_before_drop, CONNECT_GRACE)

    def _dropped(self, address: Any) -> None:
        self.drops += 1
        self._log.warning(address, "dropped a job for %s: worker congested or absent (CongestionControl.DROP)", address)


#: The process-wide state every client shares.
STATE = CongestionState()
