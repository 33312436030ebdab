"""The worker's fast receive path: C-level reads that drain before waiting, and tasks run inline.

`Reader` reads one socket from one greenlet with C-level ``NOBLOCK``
receives until ``EAGAIN``, and only then waits, once, on the socket's file
descriptor. ``zmq.green`` instead reads ``EVENTS`` (a ``poll`` and a
``getpid`` system call) after every operation and arms a ``gevent.Timeout``
per wait. The descriptor is edge-triggered: another greenlet sending on the
same socket may consume the edge that announced new input, so every sender
calls `Reader.kick` after its send. If the reader is parked, the kick
schedules one look at the socket for the end of this hub iteration, shared
by every reply sent in it (a confirm batch's acknowledgements, the replies
of tasks that woke together): it reads ``EVENTS`` once and wakes the reader
only if a message waits. Waking the reader on every kick instead cost it a
read that failed with ``EAGAIN``, two greenlet switches and a new wait.

`Reader.reply` sends a reply at the C level too: one call of the backend's
``send`` per frame (``zmq.backend.Socket.send``), past pyzmq's Python
``Socket.send`` and ``send_multipart``, whose per-frame type checks cost
more than the sends themselves (2.1 against 0.4 us for a two-frame reply).

`run_inline` runs one task in the receiving greenlet itself, holding
a slot of the task pool, so a task that finishes without yielding costs no
greenlet spawn. If the task yields to the hub (it waits on I/O, sleeps, or
is preempted by a ``gevent.Timeout``), a hub callback scheduled beforehand
runs first and hands the receiving role over to a new greenlet, so
receiving never waits on a task; the old greenlet finishes the task and
exits. A task that never yields blocks the hub whichever greenlet runs it:
the watchdog's soft and hard limits (``watchdog.py``) bound it exactly as
in a pool greenlet, since they act on the process's main thread.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, cast

import gevent
import gevent.pool
import zmq
from gevent.hub import Waiter

from .._common import native_lock, on_fork_in_child

#: libev/libuv readiness flag for a read watcher.
READ = 1
#: Messages a reader takes in a row (each maybe run inline) before it lets the hub run.
YIELD_EVERY = 64
#: The backend's C-level send of one frame: ``_send(socket, frame, flags)`` (pyzmq's sugar ``Socket``
#: subclasses it).
_send = zmq.backend.Socket.send
#: The backend's C-level receive of one frame, and its option read (``RCVMORE``), past pyzmq's Python
#: ``recv_multipart``: 4,100 fewer instructions per two-frame message (callgrind).
_recv, _get, _RCVMORE = zmq.backend.Socket.recv, zmq.backend.Socket.get, int(zmq.RCVMORE)
#: Flags of every frame but a message's last, and of its last.
_MORE, _LAST = zmq.SNDMORE | zmq.NOBLOCK, zmq.NOBLOCK


class Reader:
    """C-level reads of ``sock`` (a ``zmq.green`` or plain socket) for one greenlet at a time.

    :param sock: the socket to read; its other users send with `reply`
        (or call `kick` after their own sends).
    :param lock: a native lock every libzmq call on ``sock`` holds: another thread's too, which makes the
        socket safe to share (a direct prefork child's relay, ``steal.py``); by default one of its own.
    """

    def __init__(self, sock: zmq.Socket, lock: Any = None) -> None:
        self.sock = sock
        self._lock = lock if lock is not None else native_lock()
        self.raw: zmq.Socket = zmq.Socket.shadow(sock.underlying)
        _quiet(sock)
        self._hub = gevent.get_hub()
        self._watcher = self._hub.loop.io(self.raw.getsockopt(zmq.FD), READ)
        self._waiter: Optional[Waiter] = None
        self._streak = 0  # messages read since the hub last ran
        self._looking = False  # a look for the parked reader is scheduled (kick)

    def recv(self) -> bytes:
        """One single-frame message; blocks this greenlet only when the socket's queue is empty.

        Every `YIELD_EVERY` messages read without waiting it yields to the hub first (before
        reading, so a greenlet killed there holds no message): under a flood of tasks run inline, the
        hub must still run signals, the watchdog and the other sockets' greenlets."""
        return cast(bytes, self._read(self.raw.recv))

    def recv_multipart(self) -> list[bytes]:
        """One message's frames; blocks and yields as `recv` does."""
        return cast(list, self._read(self._frames))

    def _frames(self, flags: int) -> list[bytes]:
        raw = self.raw
        frames = [_recv(raw, flags)]
        while _get(raw, _RCVMORE):
            frames.append(_recv(raw, flags))
        return frames

    def _read(self, receive: Callable[[int], Any]) -> Any:
        self._fair()
        while True:
            with self._lock:
                try:
                    return receive(zmq.NOBLOCK)
                except zmq.Again:
                    pass
            self._wait()

    def _fair(self) -> None:
        self._streak += 1
        if self._streak >= YIELD_EVERY:
            self._streak = 0
            gevent.sleep(0)

    def reply(self, envelope: list[bytes], body: bytes) -> None:
        """Send one message, the frames of ``envelope`` then ``body``, with C-level ``NOBLOCK``
        sends (module docstring); then wake the reader. Never blocks.

        :raises zmq.Again: the peer's queue is full (only a ``ZMQ_ROUTER_MANDATORY`` ROUTER says so, on
            the first frame, before anything is queued; without it libzmq drops the message unsaid).
        :raises zmq.ZMQError: the socket is closed.
        """
        if self.sock.closed:  # the shadow must never touch a freed socket
            raise zmq.ZMQError(zmq.ENOTSOCK)
        raw = self.raw
        try:
            with self._lock:
                for frame in envelope:
                    _send(raw, frame, _MORE)
                _send(raw, body, _LAST)
        finally:
            self.kick()

    def kick(self) -> None:
        """After a send on the socket: a send may have consumed the edge that announced new input, so a
        parked reader gets a look at the socket once this hub iteration's callbacks run (`_look`);
        several kicks in one iteration share it. Never blocks."""
        if self._waiter is not None and not self._looking:
            self._looking = True
            self._hub.loop.run_callback(self._look)

    def _look(self) -> None:
        """In the hub: wake the parked reader if a message waits (or the socket closed: it then fails)."""
        self._looking = False
        waiter = self._waiter
        if waiter is not None and self._readable():
            self._waiter = None
            waiter.switch(None)

    def _readable(self) -> bool:
        """Whether a message waits (or the socket closed: a read then fails). Holds the lock, never across the
        wake-up: the woken reader takes it itself."""
        with self._lock:
            return self.sock.closed or bool(cast(int, self.raw.get(zmq.EVENTS)) & zmq.POLLIN)

    def _wait(self) -> None:
        self._streak = 0
        waiter = self._waiter = Waiter(self._hub)
        self._watcher.start(waiter.switch, None)
        try:
            waiter.get()
        finally:
            self._watcher.stop()
            self._waiter = None


def _quiet(sock: zmq.Socket) -> None:
    """Stop a ``zmq.green`` socket's own persistent read watcher, which reads ``EVENTS`` (two system
    calls) on every wake-up of the descriptor. What that socket keeps: ``NOBLOCK`` operations and
    ``zmq.green`` polls (own watchers); what it loses: prompt wake-ups of *blocking* green sends and
    receives (they fall back to pyzmq's 11.6 s re-check), which the worker no longer makes on it."""
    watcher = getattr(sock, "_state_event", None)
    if watcher is not None:
        watcher.stop()


class TaskSlots(gevent.pool.Pool):
    """The worker's task slots: a ``gevent.pool.Pool`` that a task run inline also holds, cheaply.

    `run_inline` holds a slot for the greenlet that runs the task with `hold` and gives it back with
    `release`, in a ``finally``. ``Pool.add`` would also link the greenlet to the pool so that its death
    frees the slot, and ``discard`` unlink it: a bound method made and a link list searched per task,
    which cost about a tenth of a trivial plain job's CPU on the worker. Everything else is the
    pool's own (``free_count``, ``wait_available``, ``spawn``, ``kill``, ``join``, membership).
    It relies on the pool's semaphore (``_semaphore``) and discard hook (``_discard``), which gevent's
    ``Pool`` has used since 1.0; `tests/unit/test_task_slots.py` holds it to the pool's contract.
    """

    def hold(self, greenlet: Any) -> None:
        """Count ``greenlet`` as running in a slot; one must be free (never blocks).

        :raises gevent.pool.PoolFull: every slot is taken.
        """
        if not self._semaphore.acquire(blocking=False):
            raise gevent.pool.PoolFull()
        self.greenlets.add(greenlet)
        self._empty_event.clear()

    def release(self, greenlet: Any) -> None:
        """Give back the slot `hold` took for ``greenlet`` (as the pool does when a spawned greenlet ends)."""
        self._discard(greenlet)


#: Bumped in a forked child: a hand-off callback copied into a child by a task that forked must not run
#: there (`run_inline`). A counter read, not ``os.getpid()``, which is a system call per task.
_forks = [0]
on_fork_in_child(lambda: _forks.__setitem__(0, _forks[0] + 1))


def run_inline(slots: TaskSlots, hand_off: Callable[[], None], fn: Callable[..., Any], *args: Any) -> bool:
    """Run ``fn(*args)`` in the calling greenlet, holding one slot of ``slots`` (which must have a free one).

    :param hand_off: called from the hub if ``fn`` yields before it returns: it must start a new
        greenlet that takes over the caller's receiving loop. Not called in a child that ``fn``
        forked: the child's copy of the worker must never read the inherited sockets.
    :returns: ``True`` if the caller is still the receiver, ``False`` if it handed off (it must then
        return once ``fn`` is done). Exceptions of ``fn`` propagate, after the slot is released.
    """
    current, generation = gevent.getcurrent(), _forks[0]
    handed = False

    def yielded() -> None:
        nonlocal handed
        handed = True
        if _forks[0] == generation:  # a task that forked: its child must never take over the worker's sockets
            hand_off()

    slots.hold(current)
    callback = gevent.get_hub().loop.run_callback(yielded)
    try:
        fn(*args)
    finally:
        callback.stop()
        slots.release(current)
    return not handed


__all__ = ["Reader", "TaskSlots", "run_inline"]
