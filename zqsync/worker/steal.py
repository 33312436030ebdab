"""Work stealing from a direct prefork child whose hub is blocked (``direct.py``, issue 22).

A direct child reads its clients' connections itself (its ROUTERs bind the supervisor's listening
sockets), so while a task blocks its hub (CPU-bound work, an unpatched C call) libzmq keeps queueing
work there, for the task to end, while a sibling may be free. Each direct child therefore runs a
`Relay`: a native thread that is idle while its hub stamps its seat (``seats.py``), and once the stamp
is older than `STEAL_AFTER` seconds reads the child's jobs and rpc ROUTERs itself and forwards what it
reads to a sibling whose stamp is fresh and that has free task slots, over a DEALER to that sibling's
*stolen-work* ROUTER, ``ipc://DIR/stolen-PID`` in the supervisor's private directory:

* a plain job as ``[JOB, body]``;
* an rpc message (a call, a confirmed job, an admin call) as ``[CALL, client routing id, body]``. The
  sibling runs it as its own and answers on that socket; the answer ``[client routing id, body]`` comes
  back to the relay's DEALER, and the relay sends it on the rpc ROUTER the request came from (the client's
  connection lives there), whether or not the hub runs again by then.

*Overflow:* while the hub runs but its stamps have said for `STEAL_AFTER` seconds that every task slot is
busy, the jobs receiver reads no job (it waits for a slot: ``receiving.py``), and the relay hands the plain
jobs queued on the jobs ROUTER to a sibling with free slots the same way. Calls are not taken then: the
hub keeps reading them (they wait for a slot in greenlets), so there they stay.

The relay reads a message only when a sibling can take it (fresh, with free slots not yet used up by what
was sent since its last stamp, and its DEALER writable): it never drops what it read. If every sibling is
blocked or full, the work stays queued where it is.

libzmq sockets are not thread-safe, but one may pass between threads through a full memory barrier: every
use of the ROUTERs, by the hub (its `Reader`s) and by the relay, holds one native lock. The hub's
receivers park on the sockets' edge-triggered descriptors, which a read or send by the relay can consume,
so after it touched them the relay wakes the hub (a libev async watcher) to give its parked readers a look
(`Reader.kick`). The relay needs the GIL: a task in pure Python gives it up every switch interval, and the
relay shortens that interval once it has forwarded work (`STEAL_SWITCH_INTERVAL`, until the hub stamps
again) so that each of its steps does not wait 5 ms; a C call that holds the GIL stops the relay too (the
watchdog's hard limit ends it). An idle relay sleeps `IDLE_POLL` seconds at a time (it polls its DEALERs
only while an answer is due);
a stealing one polls the sockets only while a sibling can take work, so a healthy child that merely looks
blocked (its process was descheduled) costs a few wake-ups, not a busy loop.
"""

from __future__ import annotations

import collections
import logging
import sys
from typing import Any, Callable, Optional, cast

import zmq

from .._common import native_lock
from .seats import FREE, HANDED, PID, STOLEN, TICK, WIDTH, Seats, now
from .watchdog import _original

log = logging.getLogger(__name__)

#: Seconds without a stamp from its hub after which a child's relay steals its work.
STEAL_AFTER = 0.05
#: Seconds a stealing relay waits for input before it looks again; and an idle one (replies only).
STEAL_POLL, IDLE_POLL = 0.005, 0.02
#: The interpreter's switch interval while a relay steals (seconds; restored after).
STEAL_SWITCH_INTERVAL = 0.0005
#: Seconds between two looks for siblings to connect to (a new child's row in the seats).
RECONNECT_EVERY = 0.5
#: Milliseconds a closed DEALER (or stolen-work ROUTER) keeps flushing what it had queued.
LINGER = 1000
#: The first frame of forwarded work.
JOB, CALL = b"j", b"c"


def stolen_endpoint(directory: str, pid: int) -> str:
    """The stolen-work ROUTER of the child ``pid``."""
    return f"ipc://{directory}/stolen-{pid}"


class Relay:
    """The native thread that steals a blocked child's work (module docstring).

    :param context: the child's context (the relay's DEALERs are plain sockets on it).
    :param jobs: the child's jobs ROUTER; ``rpc``: its rpc ROUTER (any pyzmq socket class).
    :param lock: the native lock every use of ``jobs`` and ``rpc`` holds.
    :param seats: the supervisor's shared table; ``seat``: this child's row.
    :param directory: the supervisor's private directory (the siblings' stolen-work sockets).
    :param wake: thread-safe; wakes the hub to give its parked readers a look.
    """

    def __init__(self, context: zmq.Context, jobs: zmq.Socket, rpc: zmq.Socket, lock: Any, seats: Seats,
                 seat: int, directory: str, wake: Callable[[], None]) -> None:
        self._context: zmq.Context = zmq.Context.shadow(context.underlying)
        self._jobs: zmq.Socket = zmq.Socket.shadow(jobs.underlying)
        self._rpc: zmq.Socket = zmq.Socket.shadow(rpc.underlying)
        self._lock, self._seats, self._seat, self._directory, self._wake = lock, seats, seat, directory, wake
        self._row = seat * WIDTH
        self._dealers: dict[int, tuple[int, zmq.Socket]] = {}  # seat -> (pid, DEALER to its stolen-work socket)
        self._poller = zmq.Poller()  # the DEALERs (and, while stealing, the ROUTERs' descriptors)
        self._awaiting = 0  # rpc messages forwarded and not answered yet: the DEALERs are polled meanwhile
        self._sent: dict[int, list[float]] = {}  # seat -> [its stamp when counted, work sent since]
        #: Routing ids of the clients whose jobs were stolen (the hub remembers them for its stopping notice).
        self.senders: collections.deque[bytes] = collections.deque(maxlen=10_000)
        self._steal = True  # cleared (under the lock) when the child stops taking jobs
        self._running = True
        self._done = native_lock()
        self._switch = sys.getswitchinterval()
        self._full_since: Optional[float] = None  # when the hub's stamps began to say every slot is busy
        self.stolen = 0  # messages forwarded (the relay's own count, for the log)

    def start(self) -> None:
        self._done.acquire()
        _original("_thread", "start_new_thread")(self._run, ())

    def stop_stealing(self) -> None:
        """Take nothing more from the sockets (the hub is about to stop taking jobs); replies still pass."""
        with self._lock:
            self._steal = False

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread (it closes its DEALERs); blocks up to ``timeout`` seconds, the hub too. Idempotent."""
        if self._running:
            self._running = False
            if self._done.acquire(timeout=timeout):
                self._done.release()

    # -- the thread ----------------------------------------------------------

    def _run(self) -> None:
        stealing = overflowing = False
        sleep, connected = _original("time", "sleep"), 0.0
        try:
            while self._running:
                at = now()
                if at >= connected + RECONNECT_EVERY:
                    connected = at
                    self._connect_siblings()
                blocked = self._steal and at - self._seats.floats[self._row + TICK] > STEAL_AFTER
                if blocked != stealing:
                    stealing = blocked
                    self._switched(stealing)
                overflow = self._steal and not blocked and self._full_for() > STEAL_AFTER
                if overflowing and not overflow and self.stolen:
                    log.info("its task slots are free again: handed %d queued job(s) to siblings", self.stolen)
                    self.stolen = 0
                overflowing = overflow
                self._wait(stealing, overflow, sleep)
                touched = self._return_replies()
                if stealing:
                    touched = self._take(self._rpc, CALL, True) | self._take(self._jobs, JOB, True) | touched
                elif overflow:
                    touched = self._take(self._jobs, JOB, False) | touched
                if touched:
                    self._wake()
        except Exception:
            log.exception("the work-stealing relay failed; this child's work waits for its hub")
        finally:
            sys.setswitchinterval(self._switch)
            for _, dealer in self._dealers.values():
                dealer.close()
            self._done.release()

    def _wait(self, stealing: bool, overflow: bool, sleep: Callable[[float], None]) -> None:
        """Wait for a sibling's answer, and while stealing (or overflowing) for input on the ROUTERs that a
        sibling can take; else (zmq_poll of nothing returns at once) sleep."""
        wait = STEAL_POLL if stealing or overflow else IDLE_POLL
        if not (stealing or overflow or self._awaiting):  # idle: one nanosleep, no poll of the DEALERs
            sleep(wait)
            return
        fds: tuple[int, ...] = ()
        if (stealing or overflow) and self._target() is not None:  # else no busy loop on input waiting there
            fds = tuple(cast(int, sock.getsockopt(zmq.FD))
                        for sock in ((self._jobs, self._rpc) if stealing else (self._jobs,)))
        for fd in fds:
            self._poller.register(fd, zmq.POLLIN)
        try:
            if self._poller.sockets:
                self._poller.poll(int(1000 * wait))
            else:
                sleep(wait)
        finally:
            for fd in fds:
                self._poller.unregister(fd)

    def _full_for(self) -> float:
        """Seconds for which the hub's stamps have said every task slot is busy (0 if one is free)."""
        if self._seats.ints[self._row + FREE] > 0:
            self._full_since = None
            return 0.0
        if self._full_since is None:
            self._full_since = now()
        return now() - self._full_since

    def _switched(self, stealing: bool) -> None:
        """The hub stopped stamping (``stealing``) or stamps again: log it, and restore the switch interval."""
        if stealing:
            log.info("the hub has been blocked for %.2f s: stealing its work for free siblings",
                     now() - self._seats.floats[self._row + TICK])
            return
        sys.setswitchinterval(self._switch)
        if self.stolen:
            log.info("the hub runs again: stole %d message(s) for siblings", self.stolen)
        self.stolen = 0

    def _return_replies(self) -> bool:
        """Send every answer a sibling returned to its client, on the rpc ROUTER; whether any was sent."""
        sent = False
        for _, dealer in list(self._dealers.values()):
            while True:
                try:
                    frames = dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._awaiting = max(0, self._awaiting - 1)
                with self._lock:
                    try:
                        self._rpc.send_multipart(frames, zmq.NOBLOCK)
                    except zmq.Again:
                        log.warning("dropped a stolen call's reply: client %r is not reading", frames[0])
                    except zmq.ZMQError:  # the rpc socket closed: the child stops
                        return sent
                sent = True
        return sent

    def _take(self, sock: zmq.Socket, kind: bytes, blocked: bool) -> bool:
        """Read from ``sock`` and forward, while a sibling can take it; whether anything was read. ``blocked``:
        the hub is (else its slots are full), and the relay needs the GIL often."""
        took = False
        while self._running:
            target = self._target()
            if target is None:
                return took
            with self._lock:
                if not self._steal:
                    return took
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return True  # an EAGAIN consumed the descriptor's edge too: the hub must look
            took = True
            seat, dealer = target
            ints = self._seats.ints
            if kind == JOB:
                ints[self._row + STOLEN] += 1
                self.senders.append(frames[0])
                message = [JOB, frames[1] if len(frames) == 2 else b""]
            else:
                message = [CALL, *frames]
            if blocked and not self.stolen:  # the first this episode: the relay needs the GIL often now
                sys.setswitchinterval(STEAL_SWITCH_INTERVAL)
            dealer.send_multipart(message)  # writable (checked): it does not block
            if kind == JOB:
                ints[self._row + HANDED] += 1
            else:
                self._awaiting += 1
            self._sent[seat][1] += 1
            self.stolen += 1
        return took

    def _target(self) -> Optional[tuple[int, zmq.Socket]]:
        """The sibling with the most room: a fresh stamp, free slots beyond what was sent it since, and a
        writable DEALER."""
        ints, floats, at = self._seats.ints, self._seats.floats, now()
        best: Optional[tuple[int, zmq.Socket]] = None
        best_room = 0
        for seat in range(self._seats.count):
            row = seat * WIDTH
            pid = ints[row + PID]
            if seat == self._seat or pid <= 0 or at - floats[row + TICK] > STEAL_AFTER:
                continue
            tick = floats[row + TICK]
            sent = self._sent.get(seat)
            if sent is None or sent[0] != tick:
                sent = self._sent[seat] = [tick, 0]
            room = ints[row + FREE] - int(sent[1])
            if room <= best_room:
                continue
            dealer = self._dealer(seat, pid)
            if cast(int, dealer.get(zmq.EVENTS)) & zmq.POLLOUT:
                best, best_room = (seat, dealer), room
        return best

    def _connect_siblings(self) -> None:
        """A DEALER to every sibling's stolen-work socket, made before it is needed (``IMMEDIATE``: it is
        writable only once connected)."""
        ints = self._seats.ints
        for seat in range(self._seats.count):
            pid = ints[seat * WIDTH + PID]
            if seat != self._seat and pid > 0:
                self._dealer(seat, pid)

    def _dealer(self, seat: int, pid: int) -> zmq.Socket:
        known = self._dealers.get(seat)
        if known is not None and known[0] == pid:
            return known[1]
        if known is not None:  # its child is gone: what is queued to it cannot be delivered
            self._poller.unregister(known[1])
            known[1].close(linger=0)
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, LINGER)  # what it forwarded still reaches the sibling after a close
        dealer.setsockopt(zmq.IMMEDIATE, 1)  # writable only once connected: nothing waits for a peer
        dealer.connect(stolen_endpoint(self._directory, pid))
        self._dealers[seat] = (pid, dealer)
        self._poller.register(dealer, zmq.POLLIN)
        return dealer


__all__ = ["CALL", "JOB", "STEAL_AFTER", "Relay", "stolen_endpoint"]
