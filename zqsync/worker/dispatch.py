"""The prefork supervisor's router: each call and job goes to a child that asked for work.

The load-balancing broker pattern. Every child has private ``ipc://``
backends of its own, bound here: a PUSH for its jobs and a DEALER for its
calls (and their replies). A child offers work by sending *credits*
(its jobs endpoint, ``slot``, a count, how many jobs it has read so far, and how much work of that kind
it has started so far) to the shared credits socket: up to
`CREDITS_MAX` outstanding, never more than its free task slots, so the
router need not wait for a round trip per message. Each time work it got has
started, the child sends one such message (with zero or more new credits),
which also acknowledges that work (``server.py``). The router keeps the send time of
each piece of work a child has not acknowledged yet, in order, and its started counts pop them, so
a late acknowledgement of earlier work does not acknowledge what was sent after it. A child whose
oldest unacknowledged work was sent more than `SUSPECT_AFTER` seconds ago is passed over while a
sibling is not suspected (the work waits for that sibling's credits), and
when every child is suspected, the one silent for the shortest time gets it: so a child whose hub is blocked (a task that never
yields, a SIGSTOP) gets at most its remaining credits' worth of messages
(``CREDITS_MAX - 1`` at most, only those sent within ``SUSPECT_AFTER`` of its
block) and then nothing while a sibling is free; a child whose slots are full
has no credits. The broker reads the public sockets only while some child has a
credit: unrouted work waits in the public queues, where the clients'
congestion control sees it. Confirmed jobs need no task slot, only to be
journaled, so they travel on ``admit`` credits, which a child offers while
it can admit one; the broker reads each rpc message's ``kind`` to choose.
An rpc message that has no credit of its kind yet is held, in arrival order,
up to `HOLD_MAX` of each kind. Past that many calls the public rpc
socket is not read (as a standalone worker stops receiving past
``WAITING_CALLS``). Confirmed jobs never stop it: they are held one per job
id (a client's resend under the same id only updates where the answer goes),
and past `HOLD_MAX` of them a new one is dropped unacknowledged, so its
client sends it again (``admission.py`` does the same in a child). The
worker's own calls (``zqsync.*``: ping, stats, job status) need no credit:
each goes at once to an open child, in turn, which answers it outside its
task pool, so they answer while every child is busy and while the confirms
wait.

The router counts the jobs it sends each child. When a child exits, those it never read are lost
with it: counted in `Dispatcher.jobs_lost`, and logged by the supervisor. A child that stops
reads its backend until `END_OF_JOBS`, which the router sends after the last job it routes
there, and reports what it read; a SIGKILLed child's count is from its last credit message.
On a stop the router sends the stopping notice to the public jobs socket's clients (``stopping.py``)
and routes what they still send, as a standalone worker reads it.

One native thread runs the loop and owns every socket; the supervisor's main
thread asks it to act through `Dispatcher.call`. The supervisor still
never imports gevent.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

import msgpack
import zmq

from ..logs import RateLimitedLog
from .stopping import BATCH, DRAIN_QUIET, Peers

log = logging.getLogger(__name__)

SLOT, ADMIT, ADMIN = b"slot", b"admit", b"admin"
#: The last message on a child's jobs backend: the router sends it no more jobs.
END_OF_JOBS = b""
#: What the router sends instead of a malformed job (not one frame, or empty): the child counts it as malformed.
MALFORMED = b"\xc1"
#: rpc messages of one kind the router holds while no child has a credit of that kind; past that many
#: calls it stops reading, past that many confirmed jobs it drops new ones unacknowledged.
HOLD_MAX = 1000
#: Task names of the worker's own calls (``registry.RESERVED_PREFIX``).
ADMIN_PREFIX = "zqsync."
#: Most credits of one kind a child holds at once (never more than its free slots).
CREDITS_MAX = 8
#: Seconds after which a child that has not acknowledged the work sent to it is passed over
#: while a sibling is not: its hub is probably blocked.
SUSPECT_AFTER = 0.05


class _Route:
    __slots__ = ("jobs", "rpc", "open", "sent", "read", "unacked", "started")

    def __init__(self, jobs: zmq.Socket, rpc: zmq.Socket) -> None:
        self.jobs, self.rpc, self.open = jobs, rpc, True
        self.sent = self.read = 0  # jobs sent to the child; jobs it said it read (its credit messages)
        # Per credit kind: when each piece of work the child has not acknowledged yet was sent (oldest
        # first), and how much work of that kind its credit messages said it started.
        self.unacked: dict[bytes, collections.deque[float]] = {SLOT: collections.deque(), ADMIT: collections.deque()}
        self.started = {SLOT: 0, ADMIT: 0}

    def acknowledge(self, kind: bytes, started: int) -> None:
        """Pop the send times of the work a credit message says started (its running total)."""
        pending = self.unacked[kind]
        for _ in range(min(started - self.started[kind], len(pending))):
            pending.popleft()
        self.started[kind] = max(self.started[kind], started)

    def unacked_since(self) -> Optional[float]:
        """When the oldest work the child has not acknowledged was sent (``time.monotonic``), or ``None``."""
        return min((pending[0] for pending in self.unacked.values() if pending), default=None)


class _Closed:
    open = False


_CLOSED = _Closed()


class Dispatcher:
    """Routes the public ``jobs_front`` (ROUTER) and ``rpc_front`` (ROUTER) sockets to children with credit.

    :param context: the supervisor's context.
    :param directory: where the private ``ipc://`` endpoints live.
    :param jobs_front: the bound public jobs socket; from `start` on, only the loop uses it.
    :param rpc_front: the bound public rpc socket; likewise.
    """

    def __init__(self, context: zmq.Context, directory: str, jobs_front: zmq.Socket, rpc_front: zmq.Socket) -> None:
        self.context, self.directory = context, directory
        self.jobs_front, self.rpc_front = jobs_front, rpc_front
        self.credits = context.socket(zmq.PULL)
        self.credits.bind(f"ipc://{directory}/credits")
        self.routes: dict[bytes, _Route] = {}
        self.ready: dict[bytes, collections.deque[bytes]] = {SLOT: collections.deque(), ADMIT: collections.deque()}
        # Held messages by kind, oldest first: calls under a sequence number, confirmed jobs under their id.
        self.held: dict[bytes, collections.OrderedDict[Any, list[bytes]]] = {
            SLOT: collections.OrderedDict(), ADMIT: collections.OrderedDict()}
        self._sequence = itertools.count()
        self.shed = 0  # confirmed jobs dropped unacknowledged past HOLD_MAX
        self._shed_log = RateLimitedLog(log)
        self._turns = 0  # round-robin counter for the messages sent without a credit
        self.stopping = False  # set by refuse_calls: the children refuse rpc work, no credit needed
        self.jobs_ended = False  # set by end_jobs: the public jobs socket is not read any more
        self.backlog: collections.deque[bytes] = collections.deque()  # jobs read while stopping, not yet routed
        self.peers = Peers(jobs_front, jobs_front.getsockopt_string(zmq.LAST_ENDPOINT))
        self.reading_all = False  # stopping: the public jobs socket is read into the backlog, credit or not
        self.lost = 0
        self.jobs_lost = 0  # plain jobs lost with children that exited (remove_child) or not sendable
        self.last_job = time.monotonic()
        self._commands: queue.Queue = queue.Queue()
        self._wake = context.socket(zmq.PAIR)
        self._wake.bind(f"inproc://zqsync-dispatch-{id(self)}")
        self._waker = context.socket(zmq.PAIR)
        self._waker.connect(f"inproc://zqsync-dispatch-{id(self)}")
        self._thread = threading.Thread(target=self._loop, name="zqsync-dispatch", daemon=True)
        self._running = True

    def start(self) -> None:
        """Start the loop's native thread; from then on only it touches the sockets. Returns at once."""
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the loop still runs (it ends only on `stop`, or on a bug, which it logs)."""
        return self._thread.is_alive()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
        """Run ``fn(*args)`` in the loop's thread; blocks until it returns (at most ``timeout`` seconds).

        :raises TimeoutError: the loop did not run it within ``timeout`` (it died, or is stuck).
        """
        future: Future = Future()
        self._commands.put((fn, args, future))
        try:
            self._waker.send(b"", zmq.NOBLOCK)
        except zmq.Again:  # the waker's pipe is full: the loop has wake-ups enough, or is gone
            pass
        return future.result(timeout)

    def stop(self) -> None:
        """End the loop and close every socket it owns (the public ones too)."""
        if self.alive:
            self.call(setattr, self, "_running", False)
            self._thread.join(5.0)
        self._waker.close(linger=0)

    # -- run in the loop's thread (through call) -----------------------------

    def add_child(self, name: str) -> tuple[str, str]:
        """Bind the backends of a new child; returns its ``(jobs, rpc)`` endpoints."""
        endpoints = (f"ipc://{self.directory}/jobs-{name}", f"ipc://{self.directory}/rpc-{name}")
        jobs, rpc = self.context.socket(zmq.PUSH), self.context.socket(zmq.DEALER)
        for sock, endpoint in ((jobs, endpoints[0]), (rpc, endpoints[1])):
            sock.setsockopt(zmq.LINGER, 1000)
            sock.bind(endpoint)
        self.routes[endpoints[0].encode()] = _Route(jobs, rpc)
        return endpoints

    def close_child(self, jobs_endpoint: str) -> None:
        """Route no more work to this child (it is retiring), and send it `END_OF_JOBS`; its replies
        still flow."""
        route = self.routes.get(jobs_endpoint.encode())
        if route is not None:
            route.open = False
            _end_jobs(route)
        self._forget_credits()

    def remove_child(self, jobs_endpoint: str, read: Optional[int]) -> int:
        """Forget an exited child and close its backends; returns how many plain jobs were lost with it.

        Those are the jobs sent to it and not read by it: ``read`` if the child reported it before exiting
        (``None``: it was killed), else what its last credit message said. For a child killed while it
        ran jobs, this counts at most ``CREDITS_MAX`` of them that started just before the kill too (the
        credit message saying so died with it). Added to `jobs_lost`."""
        self._read_credits()
        route = self.routes.pop(jobs_endpoint.encode(), None)
        self._forget_credits()
        if route is None:
            return 0
        route.jobs.close()
        route.rpc.close()
        lost = max(0, route.sent - (route.read if read is None else read))
        self.jobs_lost += lost
        return lost

    def read_all_jobs(self) -> None:
        """From now on read the public jobs socket whether or not a child has a credit, into `backlog`,
        as a stopping worker reads its socket into memory: what a client flushes must not wait in its
        buffers for the unbind, and what is in flight is read before the notice (``stopping.py``)."""
        self.reading_all = True
        self.last_job = time.monotonic()

    def notify_stopping(self) -> int:
        """Send the stopping notice to every client that sent on the public jobs socket (``stopping.py``);
        returns how many. Clients that send later are told when they do."""
        self.reading_all = True
        return self.peers.notify_all()

    def stop_jobs(self, endpoint: str) -> None:
        """Unbind the public jobs endpoint; the jobs already queued in it are still routed."""
        self.jobs_front.unbind(endpoint)
        self.last_job = time.monotonic()

    def end_jobs(self) -> int:
        """Read the public jobs socket no more: drop what is left in its queue and the `backlog`
        (returns how many), and send every child `END_OF_JOBS`, after the last job routed to it."""
        count = self.discard_jobs() + len(self.backlog)
        self.backlog.clear()
        self.jobs_ended = True
        for route in self.routes.values():
            _end_jobs(route)
        return count

    def refuse_calls(self) -> None:
        """The children have been told to stop: from now on every rpc message goes on at once, credit or
        not. A stopping child refuses a call (``WorkerStopping``) and leaves a confirmed job unacknowledged
        for its client to send again, so no caller waits out its deadline in the router."""
        self.stopping = True

    def jobs_drained(self) -> bool:
        """Whether no job has come for ``DRAIN_QUIET`` seconds and none waits in the public jobs queue."""
        return time.monotonic() - self.last_job > DRAIN_QUIET and not self.jobs_front.poll(0)

    def jobs_routed(self) -> bool:
        """Whether every job read while stopping has been routed to a child."""
        return not self.backlog

    def discard_jobs(self) -> int:
        """Read and drop what is left in the public jobs queue; returns how many."""
        count = 0
        while self.jobs_front.poll(0):
            self.jobs_front.recv_multipart()
            count += 1
        return count

    # -- the loop ------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while self._running:
                self._turn()
        except Exception:
            log.exception("the prefork router failed")
        finally:
            for route in self.routes.values():
                route.jobs.close()
                route.rpc.close()
            for sock in (self.credits, self._wake, self.jobs_front, self.rpc_front):
                sock.close()

    def _turn(self) -> None:
        poller = zmq.Poller()
        for sock in (self._wake, self.credits, *(route.rpc for route in self.routes.values())):
            poller.register(sock, zmq.POLLIN)
        if not self.jobs_ended and (self.reading_all or self._usable(SLOT) is not None):
            poller.register(self.jobs_front, zmq.POLLIN)
        if len(self.held[SLOT]) < HOLD_MAX:
            poller.register(self.rpc_front, zmq.POLLIN)
        events = dict(poller.poll(100))
        if self._wake in events:
            self._run_commands()
        self._read_credits()
        for route in list(self.routes.values()):
            if route.rpc in events:
                self.rpc_front.send_multipart(route.rpc.recv_multipart())
        if self.reading_all and not self.jobs_ended:
            self._take_jobs()
        while self._route_call() | self._route_job():  # both, each round
            pass

    def _read_credits(self) -> None:
        """Take the children's credit messages: ``[child, kind, new credits, jobs read so far, work of
        that kind started so far]``."""
        while self.credits.poll(0):
            name, kind, count, read, started = self.credits.recv_multipart()
            route = self.routes.get(name)
            if route is None:
                continue
            route.read = max(route.read, int(read))
            route.acknowledge(kind, int(started))
            if route.open:
                self.ready[kind].extend([name] * int(count))

    def _route_call(self) -> bool:
        """Read the public rpc queue (while fewer than `HOLD_MAX` calls are held), send the worker's
        own calls on at once, and route held messages to children with credits; ``False`` if nothing moved."""
        moved = False
        while len(self.held[SLOT]) < HOLD_MAX:
            try:
                frames = self.rpc_front.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            kind, job_id = credit_of(frames[-1])
            if kind == ADMIN or self.stopping:
                self._route_any(frames)
            else:
                self._hold(kind, job_id, frames)
            moved = True
        for kind, held in self.held.items():
            while held and (self.stopping or self._usable(kind) is not None):
                frames = held.popitem(last=False)[1]
                self._route_any(frames) if self.stopping else self._route(frames, "rpc", kind)
                moved = True
        return moved

    def _hold(self, kind: bytes, job_id: Optional[str], frames: list[bytes]) -> None:
        """Hold an rpc message until a child has a ``kind`` credit: a call in line, a confirmed job under its
        id (a resend replaces the frames it holds), or, past `HOLD_MAX` of them, not at all."""
        held = self.held[kind]
        key: Any = job_id
        if kind == SLOT or key is None:  # a confirm without a valid id: its child answers it with an error
            key = next(self._sequence)
        if kind == SLOT or key in held or len(held) < HOLD_MAX:
            held[key] = frames
        else:
            self.shed += 1
            self._shed_log.warning("shed", "dropped a confirmed job unacknowledged: %d are held waiting for a "
                                   "child to admit them; its client sends it again (%d so far)", len(held), self.shed)

    def _route_any(self, frames: list[bytes]) -> None:
        """Send an rpc message to the next open child that can take it, credit or not: one of the worker's
        own calls, or any message once the children are stopping (`refuse_calls`)."""
        routes = [route for route in self.routes.values() if route.open]
        self._turns += 1
        for index in range(len(routes)):
            try:
                routes[(self._turns + index) % len(routes)].rpc.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:  # that child is gone (its backend has no peer): try the next
                continue
        self._drop("rpc", "no child is running to answer it")

    def _route_job(self) -> bool:
        """Route the next job (of the backlog while stopping, else of the public queue) if some child has a
        slot credit; ``False`` if none moved."""
        if self.jobs_ended or self._usable(SLOT) is None:
            return False
        if self.reading_all:  # _take_jobs reads the public queue
            if not self.backlog:
                return False
            frame = self.backlog.popleft()
        else:
            try:
                frame = self._take_job()
            except zmq.Again:
                return False
        self._route([frame], "jobs", SLOT)
        return True

    def _take_job(self) -> bytes:
        """One job of the public queue (``MALFORMED`` if it is not one frame). :raises zmq.Again: none."""
        frames = self.jobs_front.recv_multipart(zmq.NOBLOCK)  # [client identity, job]
        self.last_job = time.monotonic()
        return self.peers.frame(frames) or MALFORMED

    def _take_jobs(self) -> None:
        """While stopping: read up to `stopping.BATCH` jobs of the public queue into the backlog."""
        for _ in range(BATCH):
            try:
                self.backlog.append(self._take_job())
            except zmq.Again:
                return

    def _forget_credits(self) -> None:
        """Drop the queued credits of children that are closed or gone."""
        for kind, names in self.ready.items():
            self.ready[kind] = collections.deque(name for name in names if self.routes.get(name, _CLOSED).open)

    def _route(self, frames: list[bytes], socket: str, kind: bytes) -> None:
        """Send ``frames`` to the child of the next usable ``kind`` credit (`_usable`: there is one)."""
        ready = self.ready[kind]
        index = self._usable(kind)
        assert index is not None
        name = ready[index]
        del ready[index]
        route = self.routes[name]
        try:
            getattr(route, socket).send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self._drop(socket, "the child that asked for it is gone")
            return
        route.unacked[kind].append(time.monotonic())
        if socket == "jobs":
            route.sent += 1

    def _usable(self, kind: bytes) -> Optional[int]:
        """Index in ``ready[kind]`` of the credit to use next, or ``None`` if none may be used now.

        The first credit, except that children which have not acknowledged their work for
        `SUSPECT_AFTER` seconds are passed over (even with no other credit yet) while some
        open child is not suspected: its credits will come. When every open child is suspected
        (on a busy machine a healthy child can be slow to acknowledge), the first credit of the
        one silent for the shortest time: a blocked child has been silent the longest."""
        ready = self.ready[kind]
        if not ready:
            return None
        now = time.monotonic()
        since = {name: route.unacked_since() for name, route in self.routes.items()}
        silent = {name: now - when for name, when in since.items() if when is not None and now - when > SUSPECT_AFTER}
        if not silent:
            return 0
        if all(name in silent for name, route in self.routes.items() if route.open):
            return min(range(len(ready)), key=lambda index: silent.get(ready[index], 0.0))
        return next((index for index, name in enumerate(ready) if name not in silent), None)

    def _drop(self, kind: str, why: str) -> None:
        self.lost += 1
        if kind == "jobs":
            self.jobs_lost += 1
        log.warning("dropped a %s message: %s (%d dropped so far)", "job" if kind == "jobs" else "call", why, self.lost)

    def _run_commands(self) -> None:
        while self._wake.poll(0):
            self._wake.recv()
        while True:
            try:
                fn, args, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)


def _end_jobs(route: _Route) -> None:
    try:
        route.jobs.send(END_OF_JOBS, zmq.NOBLOCK)
    except zmq.Again:  # the child is gone: nothing more reaches it anyway
        pass


def credit_of(body: bytes) -> tuple[bytes, Optional[str]]:
    """The credit an rpc message needs, `kind_of` its request (``SLOT`` for a malformed body: its
    child answers it with an error), and the request's ``id`` (``None`` unless it is a str)."""
    try:
        request = msgpack.unpackb(body, raw=False, max_bin_len=len(body), max_str_len=len(body))
        request_id = request.get("id")
        return kind_of(request.get("kind"), request.get("task")), request_id if isinstance(request_id, str) else None
    except Exception:  # msgpack raises several unrelated types on bad input, and a body may not be a map
        return SLOT, None


def kind_of(kind: Any, task: Any) -> bytes:
    """``ADMIT`` for a confirmed job, ``ADMIN`` for a call of the worker's own (``zqsync.*``, no credit
    needed), ``SLOT`` for anything else. The router and the children apply this one rule."""
    if kind == "confirm":
        return ADMIT
    if kind == "call" and isinstance(task, str) and task.startswith(ADMIN_PREFIX):
        return ADMIN
    return SLOT
