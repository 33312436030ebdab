"""Long-polls and confirms that hold no pooled socket: one multiplexed DEALER per owner and worker.

(Confirmed enqueues use it too, with ``send_within``: 50 greenlets of a hub then have 50 confirms
in flight, where exclusive leases allowed ``pool_size``; ``docs/design.md`` says why rules 2 and 3
of the pool need not hold on a channel.)

``Client.result`` waits on a worker's ``zqsync.result`` for up to ``lookups.LONG_POLL``
seconds a round. On a pooled socket every waiter held one of the ``pool_size`` sockets its
hub may have to that worker for the whole wait, so a few waiters starved the hub's calls
(500 greenlets waiting, pool size 4: 192 failed with ``PoolError``, and a quick call waited
5 s for a socket).

`Waits` keeps, per owner (a gevent hub, or a thread outside gevent: ``owner.py``)
and rpc address, one `Channel`: a DEALER outside the pool's cap
(``SocketPool.open_dedicated``) on which any number of long-polls travel at once, each
reply matched to its waiter by request id. The worker answers each long-poll on its own,
so replies come back in any order.

Under gevent one greenlet at a time, the channel's *reader*, touches the socket. Waiters
queue their frames and sleep on an ``AsyncResult``; the reader sends what is queued,
reads every reply and hands each to its waiter, and sleeps until the socket's ``FD``
signals or a new frame is queued. Only the reader reads ``EVENTS``, after its last
operation and before it sleeps, so no edge of ZeroMQ's edge-triggered ``FD`` is lost
(``transport.py``), and the socket is a plain ``zmq.Socket`` driven with ``NOBLOCK``
only, so no zmq.green watcher of it exists to consume one. The reader ends when no waiter
is left; the next waiter starts another.

Outside gevent a thread waits for one reply at a time, so its channel has one waiter at a
time, which sends and receives itself (``transport.py``'s blocking calls with a deadline).

A reply for a waiter that gave up (its timeout, a ``gevent.Timeout`` or a kill) is dropped
by id and counted as a stale reply. Unlike a pooled DEALER after an error (pool rule 3),
the socket is kept: no reply can reach a waiter it was not meant for. A ZeroMQ error closes
the channel, and its waiters get `PoolError`, which ``lookups.py``
treats as a worker gone for this round. Channels of owners that ended are closed when a new
channel opens; after a fork the child opens its own (the pool disowns the parent's sockets).
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, Optional, Union

import zmq

from .. import _common
from ..errors import PoolError
from ..wire import envelope
from . import transport
from .owner import Owner, current_owner
from .pool import Address, SocketPool
from .process import getpid

#: What `Channel.request` returns for a frame that did not leave within its ``send_within``.
UNSENT = object()


class Channel:
    """The long-polls of one owner to one rpc address, on one socket (module docstring)."""

    def __init__(self, pool: SocketPool, owner: Owner, sock: zmq.Socket) -> None:
        self.pool, self.owner, self.sock = pool, owner, sock
        self.closed = False
        self._waiting: dict[str, Any] = {}  # request id -> AsyncResult (gevent) or True (a thread's one waiter)
        self._outbox: collections.deque[tuple[str, bytes]] = collections.deque()
        self._reader: Any = None
        self._wake: Any = None
        self._watcher: Any = None

    @property
    def busy(self) -> bool:
        """Whether a waiter or a reader is using the socket now."""
        return bool(self._waiting) or self._reader is not None

    def request(self, frame: bytes, request_id: str, timeout: float,
                send_within: Optional[float] = None) -> Union[envelope.Reply, None, object]:
        """Send ``frame`` and wait up to ``timeout`` seconds for the reply to ``request_id``.

        Blocks the calling greenlet (cooperatively) or thread.

        :param send_within: seconds the frame may wait to leave (no connection yet: ``ZMQ_IMMEDIATE``,
            or the high-water mark); ``None``: the whole ``timeout``.
        :returns: the reply; ``None`` if the deadline ran out; `UNSENT` if the frame did not
            leave within ``send_within`` (it never will: it was taken back).
        :raises PoolError: the channel failed (a ZeroMQ error) or was closed.
        """
        if self.closed:
            raise PoolError("this long-poll channel is closed")
        send_within = timeout if send_within is None else min(send_within, timeout)
        if self.owner.green:
            return self._green_request(frame, request_id, timeout, send_within)
        return self._thread_request(frame, request_id, timeout, send_within)

    def _thread_request(self, frame: bytes, request_id: str, timeout: float,
                        send_within: float) -> Union[envelope.Reply, None, object]:
        deadline = time.monotonic() + timeout
        self._waiting[request_id] = True
        try:
            if not transport.send(self.sock, frame, send_within):
                return UNSENT if send_within < timeout else None
            while True:
                data = transport.recv(self.sock, max(0.0, deadline - time.monotonic()))
                if data is None:
                    return None
                reply = envelope.decode_reply(data)
                if reply.id == request_id:
                    return reply
                self.pool.note_stale_reply()  # an earlier request of this thread that gave up
        except zmq.ZMQError as exc:
            self.closed = True
            raise PoolError(f"the long-poll socket failed: {exc}") from exc
        finally:
            self._waiting.pop(request_id, None)
            if self.closed:  # closed meanwhile from another thread (a drain, the client's close): ours to close
                self._close_socket()

    def _green_request(self, frame: bytes, request_id: str, timeout: float,
                       send_within: float) -> Union[envelope.Reply, None, object]:
        import gevent
        from gevent.event import AsyncResult, Event

        answer = AsyncResult()
        self._waiting[request_id] = answer
        self._outbox.append((request_id, frame))
        try:
            if self._reader is None:
                self._wake = self._wake or Event()
                self._reader = gevent.spawn(self._read)
            else:
                self._wake.set()
            answer.wait(send_within)
            if not answer.ready() and send_within < timeout:
                if any(queued == request_id for queued, _ in self._outbox):
                    return UNSENT  # still queued: leaving _waiting below takes it back
                answer.wait(timeout - send_within)
            return answer.get() if answer.ready() else None
        finally:
            self._waiting.pop(request_id, None)
            if not self._waiting and self._wake is not None:
                self._wake.set()  # the reader sees that nobody is left, and ends

    def _read(self) -> None:
        """The reader greenlet: send, receive and dispatch until no waiter is left."""
        try:
            while self._waiting and not self.closed:
                self._flush()
                self._dispatch()
                events = int(self.sock.get(zmq.EVENTS))  # after the last operation, before sleeping
                if events & zmq.POLLIN or (self._outbox and events & zmq.POLLOUT):
                    continue
                self._sleep()
        except zmq.ZMQError as exc:
            self.closed = True
            self._fail(f"the long-poll socket failed: {exc}")
        finally:
            self._reader = None
            if self.closed:
                self._fail("the client was closed")
                self._close_socket()

    def _fail(self, why: str) -> None:
        for answer in self._waiting.values():
            if not answer.ready():
                answer.set_exception(PoolError(why))

    def _flush(self) -> None:
        while self._outbox:
            request_id, frame = self._outbox[0]
            if request_id in self._waiting:
                try:
                    self.sock.send(frame, zmq.NOBLOCK)
                except zmq.Again:  # no connection yet (IMMEDIATE), or the high-water mark: after the next signal
                    return
            self._outbox.popleft()

    def _dispatch(self) -> None:
        while True:
            try:
                data = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = envelope.decode_reply(data)
            answer = self._waiting.get(reply.id)
            if answer is None:
                self.pool.note_stale_reply()
            else:
                answer.set(reply)

    def _sleep(self) -> None:
        """Until the socket's ``FD`` signals or a waiter queues a frame (or leaves)."""
        if self._watcher is None:
            from gevent import get_hub

            self._watcher = get_hub().loop.io(self.sock.get(zmq.FD), 1)
        self._wake.clear()
        self._watcher.start(self._wake.set)
        try:
            self._wake.wait()
        finally:
            self._watcher.stop()

    def close(self) -> None:
        """Close the socket now if no greenlet uses it, else when its reader ends (after its waiters'
        deadlines at the latest). Safe from any thread: it wakes nothing in the owner's hub, and a thread's
        request in progress closes the socket itself when it ends."""
        self.closed = True
        if not self.busy:
            self._close_socket()

    def _close_socket(self) -> None:
        self._watcher = None  # stopped after every sleep; dropped, not touched: its loop may be another thread's
        self.pool.close_dedicated(self.sock)  # once: the pool forgets it


class Waits:
    """A client's long-poll channels, per owner and rpc address (module docstring).

    :param pool: the client's call pool: the channels' sockets come from its context and settings.
    """

    def __init__(self, pool: SocketPool) -> None:
        self.pool = pool
        self._lock = _common.native_lock()
        self._pid = os.getpid()
        self._channels: dict[tuple, Channel] = {}

    def request(self, address: Address, frame: bytes, request_id: str, timeout: float,
                send_within: Optional[float] = None) -> Union[envelope.Reply, None, object]:
        """One request to ``address`` on the caller's channel: `Channel.request`.

        :raises PoolError: the pool is closed, the socket budget is spent, or the channel failed.
        """
        return self._channel(address).request(frame, request_id, timeout, send_within)

    def _channel(self, address: Address) -> Channel:
        pid = getpid()
        if pid != self._pid:  # a forked child: the pool disowns the parent's sockets; forget them
            self._lock, self._pid, self._channels = _common.native_lock(), pid, {}
        owner = current_owner(pid)
        key = (owner.key, address)
        channel = self._channels.get(key)
        if channel is not None and not channel.closed:
            return channel
        with self._lock:
            self._close_dead_owners()
            channel = self._channels[key] = Channel(self.pool, owner, self.pool.open_dedicated(address))
        return channel

    def _close_dead_owners(self) -> None:
        """Forget closed channels, and close those of owners that ended (caller holds the lock): nothing
        of a destroyed hub or a finished thread runs on them any more."""
        for key, channel in list(self._channels.items()):
            if not channel.owner.alive():
                del self._channels[key]
                channel.closed = True
                channel._close_socket()
            elif channel.closed:  # its socket is closed, or will be when its reader ends
                del self._channels[key]

    def drain(self, stale: Callable[[Address], bool]) -> None:
        """Close the channels to every address for which ``stale(address)`` is true (their worker left the
        discovered endpoints): idle ones now, busy ones when their last waiter is done."""
        with self._lock:
            if self._pid != os.getpid():
                return
            channels = [self._channels.pop(key) for key in list(self._channels) if stale(key[1])]
        for channel in channels:
            channel.close()

    def close(self) -> None:
        """Close every channel of this process: now if idle, else when its reader ends."""
        with self._lock:
            channels = list(self._channels.values()) if self._pid == os.getpid() else []
            self._channels = {}
        for channel in channels:
            channel.close()
