"""AsyncSocketPool: connected ``zmq.asyncio`` DEALER sockets, keyed per running event loop and per process.

The rules of the sync pool (docs/design.md, "The pool's rules"), for asyncio:

* Sockets are bucketed by ``(owner, address)``; the owner is ``(pid, event loop)``, the loop
  running the caller. A ``zmq.asyncio`` socket watches its descriptor from one loop, so no
  socket is ever handed to another loop, nor to another thread (each runs its own loop).
* A lease is exclusive: a socket is in one bucket *or* in one lease (``async with``).
* Leaving a lease by any exception, ``asyncio.CancelledError`` and timeouts included, discards
  the socket: a socket that receives replies is closed with ``linger=0`` (its request may be on
  the wire: a late reply must never reach the next lessee); a send-only one keeps its linger,
  so the jobs it queued are still flushed (a cancelled send sent nothing: ZeroMQ takes a frame
  whole or not at all).
* At most ``pool_size`` sockets per ``(owner, address)`` are in flight; further callers wait,
  first come first served, up to the lease's timeout, then get `PoolError`.
* After ``fork`` the child disowns every inherited socket and context (pyzmq is told they are
  closed; no libzmq call is made on them in the child) and builds its own: ``os.register_at_fork``
  and a pid check on every lease both notice a fork.
* The idle sockets of loops that were closed (or collected) are closed when a new loop leases,
  by the sync pools' sweeper thread (``client/lifecycle.py``), and at `AsyncSocketPool.close`.

The pool is shared by every thread of a process; its maps are guarded by a real thread lock
that is never held across an ``await``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import weakref
from typing import Any, Optional

import zmq
import zmq.asyncio

from .. import _common
from ..client import lifecycle
from ..client.pool import Address, configure
from ..errors import PoolError
from ..settings import ClientSettings

_serials = itertools.count(1)


class Permits:
    """A first-in, first-out counting semaphore of one event loop, with a bounded wait.

    A released permit goes to the oldest waiter directly, so nobody overtakes the queue.
    """

    def __init__(self, value: int) -> None:
        self._value = value
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self, timeout: float) -> bool:
        """Take a permit, waiting at most ``timeout`` seconds; ``False`` if none came free."""
        if self._value > 0 and not self._waiters:
            self._value -= 1
            return True
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter  # type: ignore[no-any-return]
        except BaseException:
            if _granted(waiter):
                self.release()  # handed a permit as the caller was cancelled: pass it on
            raise
        finally:
            timer.cancel()
            if not _granted(waiter):
                _remove(self._waiters, waiter)

    def busy(self) -> bool:
        """Whether a new caller would wait."""
        return self._value <= 0 or bool(self._waiters)

    def release(self) -> None:
        """Give a permit back: to the oldest waiter still waiting, else to the count."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self._value += 1


def _granted(waiter: asyncio.Future) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.result() is True


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


def _remove(waiters: collections.deque, waiter: asyncio.Future) -> None:
    try:
        waiters.remove(waiter)
    except ValueError:
        pass


class AsyncSocketPool:
    """Connected ``zmq.asyncio`` sockets of one type, keyed per ``(pid, running loop)`` and per address.

    :param socket_type: ``zmq.DEALER``.
    :param settings: the `ClientSettings` to read ``pool_size``,
        ``lease_timeout`` (seconds), ``linger`` (seconds), ``hwm`` (messages), ``heartbeat`` and
        ``connect_timeout`` from (as `SocketPool` does).
    :param options: extra ``{zmq option: value}`` for every new socket (CURVE keys).
    :param send_only: sockets that only send (job sockets): TCP keepalive instead of ZMTP
        heartbeats, and a discard keeps the linger.
    """

    def __init__(self, socket_type: int, *, settings: ClientSettings, options: Optional[dict[int, Any]] = None,
                 send_only: bool = False) -> None:
        self.socket_type = socket_type
        self.send_only = send_only
        self.pool_size = settings.pool_size
        self.lease_timeout = settings.lease_timeout
        self._settings = settings
        self._options = dict(options or {})
        self._lock = _common.native_lock()
        self._closed = False
        self._stats = dict.fromkeys(("opened", "reused", "discarded", "discarded_full", "waits", "forks_detected",
                                     "swept"), 0)
        self._reset_state(os.getpid())
        lifecycle.track(self)

    def _reset_state(self, pid: int) -> None:
        self._context: Optional[zmq.Context] = None
        self._idle: dict[tuple, list[zmq.asyncio.Socket]] = {}
        self._permits: dict[tuple, Permits] = {}
        self._loops: dict[int, weakref.ReferenceType] = {}  # owner serial -> its loop
        self._serial: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._leased: set[zmq.asyncio.Socket] = set()
        self._live = 0  # sockets open now
        self._pid = pid  # written last: a thread racing the reset still sees a mismatch

    def _after_fork_in_child(self) -> None:
        """Disown everything inherited from the parent, never closing it (the sync pool's rule 9)."""
        self._stats["forks_detected"] += 1
        for sock in [*self._leased, *(sock for bucket in self._idle.values() for sock in bucket)]:
            _common.disown(sock)
        if self._context is not None:
            _common.orphans.append(self._context)
        self._lock = _common.native_lock()
        self._reset_state(os.getpid())

    # -- leasing -------------------------------------------------------------

    def lease(self, address: Address, *, timeout: Optional[float] = None) -> "Lease":
        """Lease a connected socket of the running loop for exclusive use: ``async with pool.lease(a) as sock``.

        :param address: an endpoint, or a tuple of endpoints one socket connects to.
        :param timeout: seconds to wait for a free slot when ``pool_size`` sockets to ``address`` are
            leased on this loop; default ``lease_timeout``.
        :returns: an async context manager yielding the socket. A clean exit parks it; any exception
            (which propagates), ``CancelledError`` included, discards it.
        :raises PoolError: on entering: no slot came free in time, or the pool is closed.
        :raises RuntimeError: no event loop runs in this thread.
        """
        return Lease(self, address, self.lease_timeout if timeout is None else timeout)

    def _key(self, address: Address) -> tuple:
        """The bucket of ``address`` for the running loop in this process (after the fork check)."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._after_fork_in_child()
        if self._closed:
            raise PoolError("this AsyncSocketPool is closed")
        loop = asyncio.get_running_loop()
        serial = self._serial.get(loop)
        if serial is None:
            serial = self._register(loop)
        return (serial, address)

    def _register(self, loop: asyncio.AbstractEventLoop) -> int:
        with self._lock:
            self._sweep_closed_loops()
            serial = self._serial[loop] = next(_serials)
            self._loops[serial] = weakref.ref(loop)
        lifecycle.start_sweeper()
        return serial

    def _permits_for(self, key: tuple) -> Permits:
        permits = self._permits.get(key)
        if permits is None:
            with self._lock:
                permits = self._permits.setdefault(key, Permits(self.pool_size))
        return permits

    def _take(self, key: tuple) -> zmq.asyncio.Socket:
        """An idle socket of the bucket or a new one, now leased."""
        with self._lock:
            bucket = self._idle.get(key)
            sock = bucket.pop() if bucket else None
            if sock is None:
                if self._context is None:
                    self._context = zmq.Context(io_threads=1)
                context = self._context
            else:
                self._stats["reused"] += 1
                self._leased.add(sock)
                return sock
        sock = zmq.asyncio.Socket(context, self.socket_type)
        try:
            settings = self._settings
            configure(sock, key[1], linger_ms=int(settings.linger * 1000), hwm=settings.hwm,
                      heartbeat_ms=int(settings.heartbeat * 1000),
                      connect_timeout_ms=int(settings.connect_timeout * 1000), send_only=self.send_only,
                      options=self._options)
        except BaseException:
            sock.close(linger=0)
            raise
        with self._lock:
            self._stats["opened"] += 1
            self._live += 1
            self._leased.add(sock)
        return sock

    def _give_back(self, key: tuple, sock: zmq.asyncio.Socket, pid: int, failed: bool) -> None:
        """End a lease: park the socket after a clean exit, else (or past the cap, or closed) close it."""
        if pid != self._pid:
            return  # inherited across a fork: disowned, never closed
        with self._lock:
            self._leased.discard(sock)
            bucket = self._idle.setdefault(key, [])
            keep = not failed and not self._closed and not sock.closed and len(bucket) < self.pool_size
            if keep:
                bucket.append(sock)
            else:
                self._stats["discarded" if failed else "discarded_full"] += 1
        if not keep:
            sock.close(linger=None if self.send_only or not failed else 0)
            self._forget()

    def _forget(self) -> None:
        """Count a socket as closed; terminate the context once the pool is closed and no socket is open."""
        with self._lock:
            self._live -= 1
            context = self._context if self._closed and self._live == 0 else None
            if context is not None:
                self._context = None
        if context is not None:
            context.term()  # every socket is closed: waits only for their lingers

    # -- sweeping, reporting and shutdown --------------------------------------

    def _sweep_closed_loops(self) -> None:
        """Close the idle sockets of loops that were closed or collected. Caller holds the lock."""
        for serial, ref in list(self._loops.items()):
            loop = ref()
            if loop is not None and not loop.is_closed():
                continue
            del self._loops[serial]
            for key in [key for key in self._permits if key[0] == serial]:
                del self._permits[key]
                for sock in self._idle.pop(key, []):
                    lifecycle.close_foreign(sock, int(self._settings.linger * 1000))
                    self._live -= 1
                    self._stats["swept"] += 1

    def sweep(self) -> None:
        """The sweeper thread's round: close the idle sockets of closed loops. Never blocks long."""
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._sweep_closed_loops()

    def stats(self) -> dict[str, int]:
        """Counters of this pool in this process: ``opened``, ``reused``, ``discarded`` (after an error,
        a timeout or a cancellation), ``discarded_full``, ``waits``, ``forks_detected``, ``swept`` (idle
        sockets of closed loops), ``in_flight`` and ``idle`` (sockets now)."""
        with self._lock:
            result = dict(self._stats)
            result["in_flight"] = len(self._leased)
            result["idle"] = sum(len(bucket) for bucket in self._idle.values())
        return result

    def close(self, *, linger: Optional[float] = None) -> None:
        """Close the idle sockets (leased ones close when their lease ends). Idempotent; never blocks longer
        than about ``linger`` seconds (default the pool's) per idle send-only socket's queue.

        An idle socket of a loop that still runs in another thread is closed from that loop
        (``call_soon_threadsafe``); any other is closed here.
        """
        if self._pid != os.getpid():
            return
        linger_ms = int((self._settings.linger if linger is None else linger) * 1000)
        with self._lock:
            self._closed = True
            idle = [(self._loops[key[0]](), sock) for key, bucket in self._idle.items() for sock in bucket]
            self._idle.clear()
            self._live += 1  # held while closing, so the context outlives the closes below
        for loop, sock in idle:
            self._close_on_its_loop(loop, sock, linger_ms)
        self._forget()

    def _close_on_its_loop(self, loop: Optional[asyncio.AbstractEventLoop], sock: zmq.asyncio.Socket,
                           linger_ms: int) -> None:
        """Close ``sock``, whose descriptor ``loop`` watches, never touching another thread's running loop."""
        if loop is not None and loop.is_running() and _running_loop() is not loop:
            try:
                loop.call_soon_threadsafe(self._close, sock, linger_ms)
                return
            except RuntimeError:  # that loop closed meanwhile
                pass
        if loop is None or loop.is_closed() or _running_loop() is not loop:
            lifecycle.close_foreign(sock, linger_ms)
            self._forget()
        else:
            self._close(sock, linger_ms)

    def _close(self, sock: zmq.asyncio.Socket, linger_ms: int) -> None:
        sock.close(linger=linger_ms)
        self._forget()


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    return asyncio._get_running_loop()


class Lease:
    """One socket leased from an `AsyncSocketPool`: an async context manager yielding it."""

    __slots__ = ("_pool", "_address", "_timeout", "_key", "_permits", "_pid", "socket")

    def __init__(self, pool: AsyncSocketPool, address: Address, timeout: float) -> None:
        self._pool, self._address, self._timeout = pool, address, timeout

    async def __aenter__(self) -> zmq.asyncio.Socket:
        pool = self._pool
        self._key = key = pool._key(self._address)
        self._pid = pool._pid
        self._permits = permits = pool._permits_for(key)
        if permits.busy():
            pool._stats["waits"] += 1
        if not await permits.acquire(max(0.0, self._timeout)):
            raise PoolError(
                f"no pooled socket to {self._address!r} came free within {self._timeout:.3f} s: "
                f"{pool.pool_size} are in use by this event loop. Raise ZQSYNC_POOL_SIZE "
                "(or pool_size=), lower concurrency, or pass a longer lease timeout"
            )
        try:
            self.socket = pool._take(key)
        except BaseException:
            permits.release()
            raise
        return self.socket

    async def __aexit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            self._pool._give_back(self._key, self.socket, self._pid, exc_type is not None)
        finally:
            if self._pid == self._pool._pid:
                self._permits.release()
