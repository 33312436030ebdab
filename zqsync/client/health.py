"""Which workers a client holds to be down, per process, by endpoint string; probes with backoff.

A worker is *down* when a client could not reach it: a confirm attempt found no connection to hand
itself to within ``probe_timeout`` (nothing was sent), or a confirm attempt went unanswered and a
**probe** then found no connection either, or it stayed silent past the failover bound
(``rendezvous.py``). Confirmed jobs that prefer a down worker start with the next one in rendezvous
order at once (`Route`).

A probe is one ``zqsync.ping`` on a *new* DEALER from the client's call pool (a pooled socket may hold
a connection to a host that is gone; a new one must complete the TCP and ZMTP handshakes), bounded
by ``probe_timeout`` once it has a socket (`ping`). A down worker is probed again, in the
background, when a job that prefers it is routed ``probe_backoff`` seconds after it went down,
then after twice that, and so on up to ``probe_backoff_max``; it is *up* again as soon as a probe
is answered. So a dead worker costs the client one probe per backoff period, and no job waits for
it.

The background probe is a greenlet of the caller's hub under gevent, else a daemon thread: either
leases from the pool like any caller (never inside another lease, on its own owner's sockets, pool
rules 1, 5 and 7). The view belongs to one process: a forked child starts with every worker up and
no probe in flight (the parent's probe threads do not exist in the child).

State is keyed by endpoint string and an endpoint the view has not seen is up, so endpoints may come
and go (re-resolved names): a vanished one's entry is never consulted again. The view knows nothing
of what an endpoint is, so it can hold the health of any peer a client routes to.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

import zmq

from ..errors import CallTimeout, PoolError, ProtocolError
from ..wire import envelope
from . import transport
from .owner import current_owner
from .process import getpid, new_id

log = logging.getLogger(__name__)

#: ``probe(endpoint)``: ``True`` it answered, ``False`` no connection could be made, ``None`` it is
#: connected but silent (a busy worker's libzmq completes the handshake while its hub is blocked), or
#: the probe could not run (no free pooled socket).
Probe = Callable[[str], Optional[bool]]


class Unsent(CallTimeout):
    """A request no connection took within its bound: it never left this process."""


class _Down:
    __slots__ = ("backoff", "next_probe")

    def __init__(self, backoff: float) -> None:
        self.backoff = backoff
        self.next_probe = time.monotonic() + backoff


class Health:
    """The endpoints a client holds to be down, and their probes (one view per client and process).

    :param probe: what a probe does (`Probe`; the client's is `ping`).
    :param backoff: seconds from going down to the first probe (float > 0).
    :param backoff_max: the longest interval between two probes, seconds; the interval doubles up to it.
    :param probe_timeout: a probe's bound, seconds (`ping` takes up to twice that).
    """

    def __init__(self, probe: Probe, *, backoff: float, backoff_max: float, probe_timeout: float) -> None:
        self._probe = probe
        self.backoff = min(backoff, backoff_max)
        self.backoff_max = backoff_max
        self.probe_timeout = probe_timeout
        self._reset(os.getpid())

    def _reset(self, pid: int) -> None:
        self._down: dict[str, _Down] = {}
        self._checking: set[str] = set()
        self._pid = pid

    def _state(self) -> dict[str, _Down]:
        if self._pid != getpid():  # a forked child: nothing the parent knew or probes is ours
            self._reset(os.getpid())
        return self._down

    def down(self, endpoint: str) -> bool:
        """Whether ``endpoint`` is down. Never blocks: a probe that is due starts in the background."""
        entry = self._state().get(endpoint)
        if entry is None:
            return False
        now = time.monotonic()
        if now >= entry.next_probe:
            # Claimed for the probe's length: were it never to report (its hub gone), the next is due after.
            entry.next_probe = now + 2 * self.probe_timeout + entry.backoff
            _spawn(self._probe_down, endpoint, entry)
        return True

    def mark_down(self, endpoint: str) -> None:
        """Hold ``endpoint`` down from now on, until a probe is answered (already down: unchanged)."""
        down = self._state()
        if endpoint not in down:
            down[endpoint] = _Down(self.backoff)
            log.warning("worker at %s is not reachable: confirmed jobs that prefer it go to the next worker; "
                        "probing it after %.3g s, then backing off up to %.3g s", endpoint, self.backoff,
                        self.backoff_max)

    def check(self, endpoint: str) -> bool:
        """After an unanswered attempt: probe ``endpoint`` now (blocks up to ``2 * probe_timeout``), unless
        another caller is probing it. Marks it down if no connection could be made.

        :returns: whether ``endpoint`` is down now.
        """
        if endpoint in self._state():
            return True
        if endpoint in self._checking:
            return False
        self._checking.add(endpoint)
        try:
            unreachable = self._probe(endpoint) is False
        finally:
            self._checking.discard(endpoint)
        if unreachable:
            self.mark_down(endpoint)
        return unreachable

    def endpoints_down(self) -> list[str]:
        """The endpoints down now, sorted."""
        return sorted(self._state())

    def _probe_down(self, endpoint: str, entry: _Down) -> None:
        """A background probe of a down ``endpoint``: up if it answers, else the next probe after a longer wait."""
        try:
            answered = self._probe(endpoint) is True
        except Exception:  # a probe must never kill its greenlet's hub or thread loudly; the next one retries
            log.exception("probing worker %s failed", endpoint)
            answered = False
        down = self._state()
        if down.get(endpoint) is not entry:
            return
        if answered:
            del down[endpoint]
            log.info("worker at %s answers again: confirmed jobs that prefer it go to it again", endpoint)
        else:
            entry.backoff = min(entry.backoff * 2, self.backoff_max)
            entry.next_probe = time.monotonic() + entry.backoff


def _spawn(function: Callable[..., None], *args: Any) -> None:
    """Run ``function(*args)`` in a greenlet of the caller's hub under gevent, else in a daemon thread."""
    if current_owner().green:
        import gevent

        gevent.spawn(function, *args)
    else:
        threading.Thread(target=function, args=args, name="zqsync-probe", daemon=True).start()


def ping(pool: Any, rpc: str, timeout: float) -> Optional[bool]:
    """A `Probe`: ``zqsync.ping`` to the rpc endpoint ``rpc`` on a new socket of the call ``pool``,
    waiting up to ``timeout`` seconds for a free slot, then up to ``timeout`` for the handshake and the
    answer (a wait for the slot is this process's congestion, not the worker's).

    A socket that got its answer stays pooled; any other is discarded (pool rule 3).
    """
    try:
        ask(pool, rpc, "zqsync.ping", timeout)
    except Unsent:
        return False
    except (CallTimeout, PoolError, ProtocolError, zmq.ZMQError):
        return None
    return True


def ask(pool: Any, rpc: str, task: str, timeout: float) -> envelope.Reply:
    """Call ``task`` (no arguments) at the rpc endpoint ``rpc`` on a new socket of the call ``pool``, as
    `ping` does; returns the reply, ``ok`` or not.

    :raises Unsent: no connection took the request within ``timeout`` seconds.
    :raises CallTimeout: no answer within ``timeout`` seconds of sending.
    :raises PoolError: no socket came free within ``timeout`` seconds.
    :raises ProtocolError: a malformed reply.
    """
    request_id = new_id()
    frame = envelope.encode_request("call", request_id, task, (), {}, deadline=timeout)
    with pool.lease(rpc, timeout=timeout, fresh=True) as sock:
        deadline = time.monotonic() + timeout
        if not transport.send(sock, frame, timeout):
            raise Unsent(task, timeout, [rpc])
        while True:
            data = transport.recv(sock, max(0.0, deadline - time.monotonic()))
            if data is None:
                raise CallTimeout(task, timeout, [rpc])
            reply = envelope.decode_reply(data)
            if reply.id == request_id:
                return reply
