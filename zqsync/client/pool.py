"""SocketPool: connected job/call sockets (DEALER) reused across requests.

This module carries the correctness argument of docs/design.md ("The pool's rules"); the
rule numbers below refer to it.

* Sockets are bucketed by ``(owner, address)``; the owner is ``(pid, hub)``
  under gevent and ``(pid, thread)`` otherwise (rule 1, ``owner.py``).
* A lease is exclusive (rule 2): a socket is in one bucket *or* in one lease.
* An exception in a lease body, ``BaseException`` included, affects only the
  request that raised it (rule 3). A socket that receives replies (DEALER) is
  closed with ``linger=0`` instead of parked: its request may be on the wire,
  and the late reply must never reach the next lessee. A send-only socket
  (PUSH) has no reply to go stale, and its queue holds other callers' jobs:
  it is parked as after a clean exit (a ``Congested``, a timeout or a killed
  greenlet queued nothing, since ZeroMQ takes a frame whole or not at all),
  and only a ``zmq.ZMQError`` discards it, with the normal linger.
* A closed socket is never parked; a full bucket closes the surplus (rule 4).
* At most ``pool_size`` sockets per ``(owner, address)`` are in flight; excess
  callers wait on a per-address permit, bounded by ``lease(timeout=)``
  (rules 5 and 6).
* A lease inside a lease raises, on one pool or across pools (rule 7).
* Owners that ended (thread finished, hub destroyed) are swept when a new
  owner appears, on a lease at most every ``SWEEP_INTERVAL``, and by the
  process's sweeper thread every ``lifecycle.SWEEP_EVERY`` seconds (rule 8).
* After ``fork`` the child disowns every inherited socket (``lifecycle.py``:
  pyzmq is told it is closed, so no libzmq call is ever made on it in the
  child, where it would drain the parent's I/O thread mailbox), kills the
  greenlets copied in the middle of a lease, and builds a fresh context
  lazily. ``os.register_at_fork`` and a pid check on every lease both detect
  a fork, because C-level forks skip the hook; one reset runs (rule 9).
* The pool owns its context and sets ``MAX_SOCKETS``; exceeding it raises
  `PoolError`, never aborts (rule 10).
* Every socket has a bounded linger (rule 11); waits are gevent-level for green
  sockets (rule 12, ``transport.py``).
* A send-only pool's context starts its libzmq I/O thread under Linux's
  ``SCHED_BATCH`` when that is safe (``iosched.py``): a job's wake-up no
  longer preempts the caller, and jobs queued meanwhile leave in one write.

``Client.enqueue`` first tries ``express.py``: one non-blocking send on an
idle socket of the bucket, in place under this pool's lock, declining to the
full lease on a fork, contention, first use, a full high-water mark or any
error; its docstring says how each rule above still holds.

Liveness. A socket that receives replies (DEALER) sends ZMTP heartbeats
(``ZQSYNC_HEARTBEAT`` seconds apart, dead after three unanswered): it carries
one request at a time, so the worker's libzmq always reads its connection and
answers, and a cut link is noticed in about three intervals. A send-only
socket (PUSH) sends none: a worker whose receive high-water mark is full stops
reading the connection, the heartbeats would go unanswered, and the client
would drop a healthy, merely busy connection with every job queued on it; and
a heartbeat reply arriving as the socket closes makes the kernel reset the
connection, losing the unsent tail. PUSH sockets use TCP keepalive instead
(idle and interval ``ZQSYNC_HEARTBEAT`` rounded up to whole seconds, three
probes): the worker's kernel answers it whatever the worker's backlog, so it
cannot kill a busy connection, and it sends no data, so closing stays a clean
FIN. It notices a dead host on an idle connection; a connection with
unacknowledged data is given up by the kernel's own retransmission limit.
A PUSH connection to a dead host holds at most its high-water mark of jobs;
ZeroMQ then sends the rest to the other workers listed.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
import warnings
import weakref
from typing import Any, Callable, Optional, Union

import greenlet
import zmq

from .. import _common, fdlimit
from ..errors import PoolError, ZqsyncWarning
from ..settings import ClientSettings
from . import iosched, lifecycle
from .owner import Owner, current_owner
from .permits import new_permits
from .process import getpid

log = logging.getLogger(__name__)

Address = Union[str, tuple]
#: Socket types that never receive: an error in a lease cannot leave a stale reply behind (rule 3).
SEND_ONLY = frozenset({zmq.PUSH, zmq.PUB})
#: TCP keepalive probes before a send-only socket's idle connection counts as dead.
KEEPALIVE_PROBES = 3
#: Seconds between two searches for owners that ended (rule 8).
SWEEP_INTERVAL = 1.0
#: Seconds between two probes of `SocketPool.check_fds`.
FD_CHECK_INTERVAL = 1.0

#: greenlet -> pool, for every lease in progress (nested-lease detection).
_holders: dict[Any, "SocketPool"] = {}


class SocketPool:
    """A pool of connected sockets of one type, keyed per owner and per address.

    :param socket_type: ``zmq.DEALER`` (jobs with ``send_only=True``, calls) or ``zmq.PUSH`` (any connecting type works).
    :param settings: the `ClientSettings` the pool
        reads (a client passes its own); default: ``ZQSYNC_*`` variables, then
        the defaults. The pool uses ``pool_size`` (sockets per ``(owner,
        address)``, in flight and idle), ``lease_timeout`` (seconds, the default
        bound on waiting for a free slot), ``linger`` (seconds a cleanly closed
        socket may spend flushing; a DEALER discarded after an error uses 0,
        rule 3), ``hwm`` (messages), ``max_sockets`` (the context's
        ``MAX_SOCKETS``), ``heartbeat`` and ``connect_timeout``.
    :param overrides: any of those fields, replacing the value in ``settings``.
    :param peers: addresses this pool is expected to dial, for the budget warning.
    :param options: extra ``{zmq option: value}`` applied to every new socket.
    :param send_only: treat the sockets as send-only (TCP keepalive, not ZMTP heartbeats; a discard keeps
        the linger; ``unsent_at_close`` counted), as the client's job DEALERs, which only ever receive a
        worker's stopping notice. Default: ``True`` for PUSH and PUB, ``False`` otherwise.

    Sockets are ``zmq.green`` sockets when the caller runs under a gevent hub,
    plain ``zmq`` sockets otherwise. The pool is safe to share across threads,
    hubs and forks. Construction emits `ZqsyncWarning` when
    ``pool_size * peers`` exceeds ``max_sockets``.
    """

    def __init__(
        self,
        socket_type: int,
        *,
        settings: Optional[ClientSettings] = None,
        peers: int = 1,
        options: Optional[dict[int, Any]] = None,
        send_only: Optional[bool] = None,
        **overrides: Any,
    ) -> None:
        resolved = settings.with_overrides(**overrides) if settings else ClientSettings.from_env(**overrides)
        self.socket_type = socket_type
        self.send_only = socket_type in SEND_ONLY if send_only is None else send_only
        self.pool_size = resolved.pool_size
        self.lease_timeout = resolved.lease_timeout
        self.max_sockets = resolved.max_sockets
        self._linger_ms = int(resolved.linger * 1000)
        self._heartbeat_ms = int(resolved.heartbeat * 1000)
        self._connect_timeout_ms = int(resolved.connect_timeout * 1000)
        self._hwm = resolved.hwm
        self._options = dict(options or {})
        self._lock = _common.native_lock()
        self._closed = False
        self._addresses: set[Any] = set()
        self._warned_budget = False
        self._stats = dict.fromkeys(
            ("opened", "reused", "discarded_poisoned", "discarded_full", "discarded_stopping", "discarded_drained",
             "kept_after_error", "waits", "peak_in_flight", "stale_replies", "forks_detected", "swept",
             "unsent_at_close", "fd_exhausted"),
            0,
        )
        self._stats_wait_seconds = 0.0
        self._fds_checked = -FD_CHECK_INTERVAL  # when check_fds last probed (monotonic seconds)
        self._reset_state(os.getpid())
        self._check_budget(peers)
        lifecycle.track(self, on_fork=_holders.clear)

    # -- state -------------------------------------------------------------

    def _reset_state(self, pid: int) -> None:
        self._context: Optional[zmq.Context] = None
        self._idle: dict[tuple, list[zmq.Socket]] = {}
        self._permits: dict[tuple, Any] = {}
        self._owners: dict[tuple, Owner] = {}
        self._next_sweep = 0.0
        self._leased: dict[zmq.Socket, Any] = {}  # socket -> holder greenlet
        self._sent: dict[zmq.Socket, int] = {}  # send-only socket -> messages handed to it
        self._retired: weakref.WeakSet[zmq.Socket] = weakref.WeakSet()  # to close when their lease ends
        self._dedicated: set[zmq.Socket] = set()  # open_dedicated's, outside every bucket and permit
        self._in_flight = 0
        self._live = 0
        # Written last: a thread racing the reset still sees a mismatch (redis-py's _checkpid).
        self._pid = pid

    def _after_fork_in_child(self) -> None:
        """Drop everything inherited from the parent without closing it (rule 9)."""
        self._stats["forks_detected"] += 1
        me = greenlet.getcurrent()
        doomed = [holder for holder in self._leased.values() if holder is not me]
        for sock in [*self._leased, *self._dedicated, *(sock for bucket in self._idle.values() for sock in bucket)]:
            _common.disown(sock)
        if self._context is not None:
            _common.orphans.append(self._context)
        self._lock = _common.native_lock()
        self._reset_state(os.getpid())
        _kill_copied_greenlets(doomed)

    def _check_fork(self) -> None:
        if self._pid == os.getpid():
            return
        # A fork the hook did not see (C-level fork): one reset, under the lock.
        lock = self._lock
        if lock.acquire(timeout=5.0):
            try:
                if self._pid != os.getpid():
                    self._after_fork_in_child()
            finally:
                lock.release()
        else:  # the lock was held across a C-level fork by a thread that no longer exists
            self._after_fork_in_child()

    def _context_for_process(self) -> zmq.Context:
        context = self._context
        if context is None:
            context = zmq.Context(io_threads=1)
            limit = context.get(zmq.SOCKET_LIMIT)
            context.set(zmq.MAX_SOCKETS, min(self.max_sockets, limit))
            if self.send_only:
                iosched.batch_io_threads(context)  # jobs leave in batches, not one wake-up each (iosched.py)
            self._context = context
        return context

    def _check_budget(self, peers: int) -> None:
        if self._warned_budget or self.pool_size * peers <= self.max_sockets:
            return
        self._warned_budget = True
        warnings.warn(
            f"SocketPool may need {self.pool_size} x {peers} = {self.pool_size * peers} sockets, "
            f"more than the context's MAX_SOCKETS {self.max_sockets}: lower ZQSYNC_POOL_SIZE "
            "or raise ZQSYNC_MAX_SOCKETS (and ulimit -n); leases past the budget raise PoolError",
            ZqsyncWarning,
            stacklevel=3,
        )

    # -- leasing -----------------------------------------------------------

    def lease(self, address: Address, *, timeout: Optional[float] = None, fresh: bool = False) -> "Lease":
        """Lease a connected socket for exclusive use in a ``with`` block.

        :param address: an endpoint such as ``"tcp://127.0.0.1:5556"``, or a
            tuple of endpoints that one socket connects to (ZeroMQ then
            balances across them).
        :param timeout: seconds to wait for a free slot when ``pool_size``
            sockets to this address are already leased by this owner.
            Default: the pool's ``lease_timeout``.
        :param fresh: open a new socket even if one is idle (a probe's new connection, ``health.py``);
            it takes a permit like any other and is parked or discarded the same way.
        :returns: a context manager yielding the socket. On a clean exit the
            socket returns to the pool. On an exception (which propagates) a
            DEALER is closed with ``linger=0``; a PUSH is parked unless the
            exception is a ``zmq.ZMQError`` (rule 3).
        :raises PoolError: the wait ran out, the lease is nested inside
            another lease, the pool is closed, or the socket budget is spent.

        Blocks (cooperatively under gevent) only while waiting for a slot.
        Use the result in a ``with`` statement at once: the slot is taken
        when ``lease`` returns and given back when the block ends.
        """
        pid = getpid()
        holder = self._check_can_lease(pid)
        if len(self._owners) > 1 and time.monotonic() >= self._next_sweep:
            self._sweep()
        owner = current_owner(pid)
        key = (owner.key, address)
        permits = self._permits.get(key) or self._register(key, owner, address)
        self._acquire(permits, address, self.lease_timeout if timeout is None else timeout)
        sock = self._take_socket(key, permits, owner, address, holder, fresh)
        return Lease(self, key, permits, holder, sock, self._pid)

    def _check_can_lease(self, pid: int) -> Any:
        """The calling greenlet (or thread), after the fork check (rule 9) and the nested-lease check (rule 7).

        :raises PoolError: the pool is closed, or the caller already holds a lease.
        """
        if self._pid != pid:
            self._check_fork()
        if self._closed:
            raise PoolError("this SocketPool is closed")
        holder = greenlet.getcurrent()
        if holder in _holders:
            raise PoolError(
                "nested lease: this greenlet/thread already holds a pooled socket; finish that "
                "request before starting another (a nested lease can deadlock on the pool's cap)"
            )
        return holder

    def _take_socket(self, key: tuple, permits: Any, owner: Owner, address: Address, holder: Any,
                     fresh: bool) -> zmq.Socket:
        """An idle socket of the bucket (unless ``fresh``), or a new one, now leased by ``holder``; the permit
        is given back on failure."""
        _holders[holder] = self
        try:
            return (None if fresh else self._checkout(key, holder)) or self._open(address, owner, holder)
        except BaseException:
            _holders.pop(holder, None)
            permits.release()
            raise

    def _acquire(self, permits: Any, address: Address, timeout: float) -> None:
        if permits.acquire(blocking=False):
            return
        started = time.monotonic()
        acquired = permits.acquire(blocking=True, timeout=timeout)
        self._stats["waits"] += 1
        self._stats_wait_seconds += time.monotonic() - started
        if not acquired:
            raise PoolError(
                f"no pooled socket to {address!r} came free within {timeout:.3f} s: "
                f"{self.pool_size} are in use by this process/hub. Raise ZQSYNC_POOL_SIZE "
                "(or pool_size=), lower concurrency, or pass a longer lease timeout"
            )

    def _register(self, key: tuple, owner: Owner, address: Address) -> Any:
        with self._lock:
            permits = self._permits.get(key)
            if permits is None:
                if owner.key not in self._owners:
                    self._sweep_dead_owners()
                    self._owners[owner.key] = owner
                    lifecycle.start_sweeper()
                permits = self._permits[key] = new_permits(owner, self.pool_size)
                if address not in self._addresses:
                    self._addresses.add(address)
                    self._check_budget(len(self._addresses))
            return permits

    def _checkout(self, key: tuple, holder: Any) -> Optional[zmq.Socket]:
        """An idle socket of this bucket, now in flight for ``holder``; ``None`` if none is idle."""
        with self._lock:
            bucket = self._idle.get(key)
            while bucket:
                sock = bucket.pop()
                if not sock.closed:
                    self._stats["reused"] += 1
                    self._enter_flight(sock, holder)
                    return sock
        return None

    def _open(self, address: Address, owner: Owner, holder: Any) -> zmq.Socket:
        if self._live >= self.max_sockets:
            # Checked here rather than left to libzmq's EMFILE: a zmq.green
            # socket whose construction fails raises again from its __del__.
            raise self._budget_error()
        if owner.green:
            import zmq.green as zmq_green

            socket_class: Any = zmq_green.Socket
        else:
            socket_class = zmq.Socket
        try:
            sock = socket_class(self._context_for_process(), self.socket_type)
        except zmq.ZMQError as exc:
            if exc.errno not in fdlimit.FD_ERRNOS:
                raise
            code = fdlimit.out_of_fds()  # EMFILE is also libzmq's own socket limit
            if code is None:
                raise self._budget_error() from exc
            self._out_of_fds(code)
            raise PoolError(f"no file descriptor left for a new socket ({exc}): {fdlimit.CLIENT_HINT}") from exc
        return self._counted(sock, address, lambda: self._enter_flight(sock, holder))

    def _counted(self, sock: zmq.Socket, address: Address, record: Callable[[], None]) -> zmq.Socket:
        """``sock`` configured for ``address`` and counted open, ``record()`` run under the lock; closed
        again if configuring it fails."""
        try:
            self._configure(sock, address)
        except BaseException:
            sock.close(linger=0)
            raise
        with self._lock:
            self._stats["opened"] += 1
            self._live += 1
            record()
        return sock

    def open_dedicated(self, address: Address) -> zmq.Socket:
        """A plain (never ``zmq.green``) socket to ``address``, configured as the pool's, outside its
        buckets and its ``pool_size`` cap; the caller owns it (``waits.py`` multiplexes long-polls on it)
        and closes it with `close_dedicated`. It counts against ``max_sockets``, and the pool's
        context terminates only after it is closed. After a fork the child disowns it (rule 9).

        :raises PoolError: the pool is closed or the socket budget is spent.
        """
        if self._pid != os.getpid():
            self._check_fork()
        if self._closed:
            raise PoolError("this SocketPool is closed")
        if self._live >= self.max_sockets:
            raise self._budget_error()
        sock = zmq.Socket(self._context_for_process(), self.socket_type)
        return self._counted(sock, address, lambda: self._dedicated.add(sock))

    def close_dedicated(self, sock: zmq.Socket) -> None:
        """Close a socket of `open_dedicated` at once (``linger=0``: it only carries requests whose
        waiters are gone); the context terminates now if the pool was closed and nothing else is open."""
        with self._lock:
            if sock not in self._dedicated:
                return
            self._dedicated.discard(sock)
            self._live -= 1
        sock.close(linger=0)
        self._term_if_closed()

    def check_fds(self) -> None:
        """A request failed or a job was dropped: if this process is out of descriptors now, the likely
        cause (libzmq retries a connect whose ``socket()`` failed and says nothing), count and log it.
        Probes at most once per ``FD_CHECK_INTERVAL`` seconds (a drop can be a fast path of its own)."""
        now = time.monotonic()
        if now - self._fds_checked < FD_CHECK_INTERVAL:
            return
        self._fds_checked = now
        code = fdlimit.out_of_fds()
        if code is not None:
            self._out_of_fds(code)

    def _out_of_fds(self, code: int) -> None:
        self._stats["fd_exhausted"] += 1
        fdlimit.report(f"zqsync client pid {os.getpid()}", code, fdlimit.CLIENT_HINT)

    def _budget_error(self) -> PoolError:
        return PoolError(
            f"the zmq context's socket budget is spent (MAX_SOCKETS {self.max_sockets}, {self._live} open): "
            "raise ZQSYNC_MAX_SOCKETS (and ulimit -n) or lower ZQSYNC_POOL_SIZE"
        )

    def _configure(self, sock: zmq.Socket, address: Address) -> None:
        configure(sock, address, linger_ms=self._linger_ms, hwm=self._hwm, heartbeat_ms=self._heartbeat_ms,
                  connect_timeout_ms=self._connect_timeout_ms, send_only=self.send_only, options=self._options)

    def _enter_flight(self, sock: zmq.Socket, holder: Any) -> None:
        """Record ``sock`` as leased by ``holder``. Caller holds the lock."""
        self._leased[sock] = holder
        self._in_flight += 1
        if self._in_flight > self._stats["peak_in_flight"]:
            self._stats["peak_in_flight"] = self._in_flight

    def _leave_flight(self, sock: zmq.Socket, pid: int) -> bool:
        """Forget a leased socket. ``False`` if it was inherited across a fork."""
        if pid != self._pid:
            return False
        self._leased.pop(sock, None)
        self._in_flight -= 1
        return True

    def _park(self, key: tuple, sock: zmq.Socket, pid: int) -> None:
        surplus = None
        with self._lock:
            if not self._leave_flight(sock, pid):
                return  # inherited: dropped, never closed (rule 9)
            bucket = self._idle.setdefault(key, [])
            if sock.closed:
                self._forget(sock)
                return
            if sock in self._retired:
                surplus = sock
                self._stats["discarded_stopping"] += 1
                self._forget(sock)
            elif key not in self._permits:  # drained while leased (drain)
                surplus = sock
                self._stats["discarded_drained"] += 1
                self._forget(sock)
            elif self._closed or len(bucket) >= self.pool_size:
                surplus = sock
                self._stats["discarded_full"] += 1
                self._forget(sock)
            else:
                bucket.append(sock)
        if surplus is not None:
            surplus.close()

    def _discard(self, sock: zmq.Socket, pid: int) -> None:
        with self._lock:
            if not self._leave_flight(sock, pid):
                return
            self._stats["discarded_poisoned"] += 1
            if not sock.closed:
                self._forget(sock)
        # A DEALER's late reply must never reach another caller: drop everything now.
        # A PUSH queues other callers' jobs: they get the normal linger (rule 3).
        sock.close(linger=None if self.send_only else 0)

    def _forget(self, sock: zmq.Socket) -> None:
        """Count an open socket as closed. Caller holds the lock."""
        self._live -= 1
        self._sent.pop(sock, None)

    def retire(self, sock: zmq.Socket) -> None:
        """Close the leased ``sock`` with the normal linger when its lease ends, instead of parking it
        (its peer is stopping: ``notices.py``)."""
        self._retired.add(sock)

    def drain(self, stale: Callable[[Address], bool]) -> None:
        """Close the sockets to every address for which ``stale(address)`` is true, in every owner's bucket
        (their worker left the client's discovered endpoints: ``discovery.py``).

        Idle ones are closed now with the normal linger, so what they queued is still flushed; leased ones
        are closed the same way when their lease ends, after the request in flight. Never blocks on the
        network. A later lease of such an address opens a new socket.
        """
        if self._pid != os.getpid():
            self._check_fork()
        with self._lock:
            keys = [key for key in self._permits if stale(key[1])]
            idle = [sock for key in keys for sock in self._idle.pop(key, [])]
            for key in keys:
                del self._permits[key]
            for sock in idle:
                self._forget(sock)
            self._stats["discarded_drained"] += len(idle)
        for sock in idle:
            lifecycle.close_foreign(sock, self._linger_ms)

    def sent_on(self, sock: zmq.Socket) -> int:
        """Messages handed to the leased send-only ``sock`` so far."""
        return self._sent.get(sock, 0)

    def note_sent(self, sock: zmq.Socket) -> None:
        """Count one message handed to a leased send-only socket (for ``unsent_at_close``)."""
        self._sent[sock] = self._sent.get(sock, 0) + 1  # one holder per socket: no race

    def _sweep(self) -> None:
        # Owners end silently (a thread returns, a hub is destroyed), so look
        # for dead ones at most every SWEEP_INTERVAL seconds, and whenever a new
        # owner appears (_register).
        with self._lock:
            self._next_sweep = time.monotonic() + SWEEP_INTERVAL
            self._sweep_dead_owners()

    def sweep(self) -> None:
        """Close the idle sockets of owners that ended (the sweeper thread's round); never blocks long."""
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._sweep_dead_owners()

    def _sweep_dead_owners(self) -> None:
        """Close the idle sockets of owners that ended. Caller holds the lock."""
        dead = [key for key, owner in self._owners.items() if not owner.alive()]
        for owner_key in dead:
            del self._owners[owner_key]
            for key in [k for k in self._permits if k[0] == owner_key]:
                del self._permits[key]
                for sock in self._idle.pop(key, []):
                    lifecycle.close_foreign(sock, self._linger_ms)
                    self._forget(sock)
                    self._stats["swept"] += 1

    # -- reporting and shutdown ------------------------------------------

    def note_stale_reply(self) -> None:
        """Count a reply that arrived for a request nobody waits for any more."""
        self._stats["stale_replies"] += 1

    def stats(self) -> dict[str, float]:
        """Counters for this pool in this process.

        :returns: a dict with ``opened``, ``reused``, ``discarded_poisoned``
            (closed after an error in the lease), ``discarded_stopping`` (its
            worker sent a stopping notice), ``discarded_drained`` (its worker
            left the discovered endpoints, `drain`), ``discarded_full``,
            ``kept_after_error`` (send-only sockets parked after an error,
            rule 3), ``waits``, ``wait_seconds`` (float seconds),
            ``peak_in_flight``, ``stale_replies``, ``forks_detected``,
            ``swept``, ``unsent_at_close`` (messages possibly dropped when a
            close's linger ran out, an upper bound: see `close`),
            ``fd_exhausted`` (a socket could not be made, or a request failed or a job was dropped,
            while this process had no file descriptor left: also logged at ERROR, ``fdlimit.py``),
            ``in_flight`` and ``open`` (sockets open now).
        """
        with self._lock:
            result: dict[str, float] = dict(self._stats)
            result["wait_seconds"] = self._stats_wait_seconds
            result["in_flight"] = self._in_flight if self._pid == os.getpid() else 0
            result["open"] = self._live if self._pid == os.getpid() else 0
        return result

    def close(self, *, linger: Optional[float] = None) -> None:
        """Close idle sockets and, once none is in flight, the context.

        :param linger: seconds the idle sockets may spend flushing queued
            messages (default: the pool's linger). Never blocks longer than
            about that, even with peers unreachable (rule 11).

        Blocks until every queued message was handed to the kernel's TCP
        buffers (which then deliver it to a live worker, even after this
        process exits: the connection closes with a FIN, never a reset) or
        until ``linger`` ran out; libzmq then discards what is left. For a
        send-only pool, a ``linger`` that ran out adds to the ``unsent_at_close``
        counter and logs a WARNING. libzmq does not tell how long its queues
        are, so the count is an upper bound: per socket still flushing, the
        messages handed to it, but at most its high-water mark per endpoint.
        With ``linger=0``, or with sockets still leased (closed when their
        lease ends, without waiting), nothing is counted.

        Sockets still leased are closed when their lease ends, and the context once the last one has.

        Idempotent.
        """
        if self._pid != os.getpid():
            self._check_fork()
        linger_ms = self._linger_ms if linger is None else int(linger * 1000)
        with self._lock:
            self._closed = True
            idle = [(sock, address) for (_, address), bucket in self._idle.items() for sock in bucket]
            self._idle.clear()
            queued_at_most = sum(self._queued_at_most(sock, address) for sock, address in idle)
            for sock, _ in idle:
                self._forget(sock)
            context, in_flight = self._context, self._in_flight + len(self._dedicated)
            if in_flight == 0:
                self._context = None
        for sock, _ in idle:
            lifecycle.close_foreign(sock, linger_ms)
        if context is None or in_flight:
            return
        started = time.monotonic()
        context.term()  # waits for every socket's linger
        if linger_ms and queued_at_most and time.monotonic() - started >= linger_ms / 1000 - 0.01:
            self._stats["unsent_at_close"] += queued_at_most
            log.warning(
                "closing: the linger of %.3f s ran out before the worker(s) took every queued message: up to %d "
                "left unsent and dropped (worker stalled, stopped or unreachable; raise linger= to wait longer)",
                linger_ms / 1000, queued_at_most,
            )

    def _term_if_closed(self) -> None:
        """After a lease ends: terminate the context that `close` left to the last lease in flight."""
        if not self._closed:
            return
        with self._lock:
            if self._in_flight or self._dedicated or self._context is None or self._pid != os.getpid():
                return
            context, self._context = self._context, None
        context.term()

    def _queued_at_most(self, sock: zmq.Socket, address: Address) -> int:
        """An upper bound on the messages libzmq may still queue for ``sock``. Caller holds the lock."""
        sent = self._sent.get(sock, 0)
        endpoints = 1 if isinstance(address, str) else len(address)
        return min(sent, self._hwm * endpoints) if self._hwm else sent

    def __repr__(self) -> str:
        return f"<SocketPool type={self.socket_type} pool_size={self.pool_size} pid={self._pid}>"


def configure(sock: zmq.Socket, address: Address, *, linger_ms: int, hwm: int, heartbeat_ms: int,
              connect_timeout_ms: int, send_only: bool, options: dict[int, Any]) -> None:
    """Set a new pooled socket's options and connect it to ``address`` (the sync and the asyncio pools'
    sockets are configured alike: ``zqsync/aio/pool.py``). Times in milliseconds, ``hwm`` in messages."""
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    # Queue only to completed connections: a send to a peer that never
    # answered then waits (bounded by the caller's deadline) instead of
    # being queued and delivered, stale, much later; and with several
    # endpoints, messages go only to the ones that are up.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    endpoints = (address,) if isinstance(address, str) else address
    if any("://[" in endpoint for endpoint in endpoints):
        sock.setsockopt(zmq.IPV6, 1)  # only for IPv6 literals: host names keep resolving to IPv4
    _configure_liveness(sock, heartbeat_ms, send_only)
    # A connect attempt is abandoned and redialled after connect_timeout
    # instead of waiting out the kernel's growing SYN retry delay.
    if connect_timeout_ms:
        sock.setsockopt(zmq.CONNECT_TIMEOUT, connect_timeout_ms)
    # The identity names the process, so a peer can count sockets per process.
    sock.setsockopt(zmq.IDENTITY, f"zq-{os.getpid()}-{secrets.token_hex(4)}".encode())
    for option, value in options.items():
        sock.setsockopt(option, value)
    for endpoint in endpoints:
        sock.connect(endpoint)


def _configure_liveness(sock: zmq.Socket, heartbeat_ms: int, send_only: bool) -> None:
    """ZMTP heartbeats on sockets that receive, TCP keepalive on send-only ones (module docstring)."""
    if not heartbeat_ms:
        return
    if send_only:
        seconds = max(1, math.ceil(heartbeat_ms / 1000))
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, seconds)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, seconds)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)
    else:
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * heartbeat_ms)


def _kill_copied_greenlets(doomed: list[Any]) -> None:
    """Kill greenlets copied into a forked child in the middle of a lease.

    Their sockets are the parent's: were one to wake (its watcher is stopped,
    but zmq.green also polls every 11.6 s), a libzmq call in the child would
    drain the parent's mailbox signal. The kill is scheduled on the hub and
    lands before they run again. Plain greenlets (a thread's main one) are
    never copied mid-wait, so only gevent Greenlets are killed.
    """
    for holder in doomed:
        if not holder.dead and hasattr(holder, "kill"):
            holder.kill(block=False)


class Lease:
    """One socket leased from a `SocketPool`; a context manager yielding the socket.

    Leaving the ``with`` block cleanly parks the socket. Leaving it by an
    exception, ``BaseException`` included, discards a socket that receives
    replies; a send-only socket is parked unless the exception is a
    ``zmq.ZMQError`` (pool rule 3).
    """

    __slots__ = ("_pool", "_key", "_permits", "_holder", "socket", "_pid")

    def __init__(self, pool: SocketPool, key: tuple, permits: Any, holder: Any, sock: zmq.Socket, pid: int) -> None:
        self._pool, self._key, self._permits, self._holder = pool, key, permits, holder
        self.socket, self._pid = sock, pid

    def __enter__(self) -> zmq.Socket:
        return self.socket

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        _holders.pop(self._holder, None)
        try:
            if exc_type is None:
                self._pool._park(self._key, self.socket, self._pid)
            else:
                self._pool.check_fds()
                if self._pool.send_only and not issubclass(exc_type, zmq.ZMQError):
                    self._pool._stats["kept_after_error"] += 1
                    self._pool._park(self._key, self.socket, self._pid)
                else:
                    self._pool._discard(self.socket, self._pid)
        finally:
            self._permits.release()
            self._pool._term_if_closed()
