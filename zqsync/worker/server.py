"""Worker: jobs (ROUTER) on port N and rpc (ROUTER) on port N+1, tasks in a gevent pool.

Receiving a job waits for a free slot in the task pool (``gevent.pool.Pool``),
so a busy worker stops draining its jobs socket, the high-water mark fills,
and the clients' congestion control sees it.

Both receivers read at C level and drain their socket before waiting on
it, and run a job or call inline, in the receiving greenlet, when a slot
is free (no greenlet spawn when it finishes without yielding); a task that
yields hands receiving over to a new greenlet (``inline.py``). A call that
finds every slot taken waits for one in a greenlet of its own, as below.

Standalone, the worker binds both sockets. As a child of a prefork
supervisor (``supervisor.py``) it connects them to its private backends
instead (rpc requests then carry the supervisor's routing id in front of
the client's), and asks for work: one credit when a slot is free
(``dispatch.py``).

The worker's own ``zqsync.*`` calls (ping, stats) never wait for a task
slot: they run in a greenlet of their own as soon as they are read. Calls
that wait for a slot wait in greenlets too (at most :data:`WAITING_CALLS`),
so the rpc socket keeps being read, and a ping answers while the pool is full.
Confirmed jobs past :data:`~zqsync.worker.admission.ADMISSIONS` in flight are held unacknowledged
(``admission.py``), so a full confirm backlog does not stop the reading either.

Shutdown (gunicorn's arbiter model): signal handlers only record the signal;
the main greenlet acts on it. They are Python-level handlers, not gevent's:
Python runs them between two bytecodes even while a task blocks the hub,
and the watchdog's native thread (``watchdog.py``) then kills that task at
the end of the grace period (at once for a cold stop), so a stop never
waits on a task. TERM/INT is warm, in this order:

1. Take no more jobs. Standalone, the worker sends a stopping notice to
   every client that sent on its jobs (ROUTER) socket and keeps reading;
   those clients flush and close that socket and send to their other
   workers (``stopping.py``, ``client/notices.py``). Once no job has come
   for ``DRAIN_QUIET`` seconds the endpoint is unbound.
   Under a supervisor, the child reads its backend queue up to the router's
   end-of-jobs mark (sent after the last job routed to it), disconnects, and
   writes how many jobs it read for the supervisor's count (``dispatch.py``).
2. Drain: the jobs already in the socket's queue stay readable after the
   unbind (measured: all of a full 1000-message queue, even seconds later,
   whatever the linger) and are read into memory.
3. Run them, and finish in-flight tasks, within ``graceful_timeout``; jobs
   still not started then are counted (``jobs_discarded_on_stop``) and
   logged: ``discarded N queued plain jobs on shutdown``. So are pending
   in-memory retries of plain jobs (the scheduler logs their ids). Tasks
   still running then are killed, and counted (``killed N of M task(s)``:
   those that finished before the kill reached them ran, and are not).
   A receiver that reads a job while the stop is under way keeps it in the
   backlog; one that runs a task inline is left to finish it.
4. Calls: in-flight calls are answered; calls that arrive meanwhile are
   refused at once with a ``WorkerStopping`` error (not run, safe to retry
   elsewhere), and confirmed jobs are not acknowledged (their clients send
   them again). The rpc socket closes once the in-flight calls are answered.

Residual window, honestly: a job sent in the instant of the unbind by a
client that has not looked for the notice yet (it looks every 16 sends) is
lost uncounted. Before the notice, what the client's queue and both kernels'
buffers held was lost (24,409-35,000 jobs behind a busy worker; the
scenario is ``tests/integration/test_stop_notice.py``). Confirmed jobs have no such window.

A second TERM/INT, QUIT, or the end of the grace period is cold: in-flight
tasks are killed (confirmed ones stay pending in the journal and run after
the next start), calls still waiting for a slot are refused (``WorkerStopping``),
and queued plain jobs are discarded with a count. A worker that killed
tasks exits with status :data:`~zqsync.worker.watchdog.KILLED_EXIT` (1), and counts
them (``tasks_killed_on_stop``).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
import weakref
from functools import partial
from typing import Any, Optional

import gevent
import gevent.event
import gevent.lock
import gevent.pool
import zmq
import zmq.green
import zmq.utils.monitor

from .. import _common
from ..errors import ProtocolError, WorkerShutdown, WorkerStopping
from ..logs import RateLimitedLog
from ..settings import WorkerSettings
from ..wire.envelope import encode_error
from .admission import ADMISSIONS, HELD_CONFIRMS, Admissions, HeldConfirms
from .dispatch import ADMIN, SLOT, kind_of
from .inline import Reader, run_inline
from .intake import Intake, intake_for, quiesce
from .queues import build_queues, yield_to_higher
from .registry import Registry
from .runner import Runner
from .scheduler import build_scheduler
from .watchdog import KILLED_EXIT, Watchdog, original_signal

log = logging.getLogger(__name__)

#: Distinct client identities remembered for ``zqsync.stats``.
MAX_IDENTITIES = 10_000
#: Seconds a warm shutdown waits after the last task before closing its sockets.
REPLY_DRAIN = 0.25
#: Counters of what a stop refused or discarded (``zqsync.stats``).
STOP_COUNTERS = ("jobs_discarded_on_stop", "calls_refused_on_stop", "confirms_ignored_on_stop", "tasks_killed_on_stop")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
COLD_SIGNALS = (signal.SIGQUIT,)
#: Calls waiting for a task slot at once; past it the rpc socket is not read until one starts.
WAITING_CALLS = 1000
#: The worker's own ``zqsync.*`` calls answered at once (they need no task slot).
ADMIN_CALLS = 64
#: Seconds between two looks of the main greenlet for a recorded stop signal.
SIGNAL_POLL = 0.05


def _after_fork(worker: "weakref.ReferenceType[Worker]") -> None:
    alive = worker()
    if alive is not None:
        alive._after_fork_in_child()


class Worker:
    """A zqsync worker serving one registry.

    :param registry: the tasks to run.
    :param settings: a :class:`~zqsync.settings.WorkerSettings` (bind endpoint,
        concurrency, graceful timeout, HWM, journal, CURVE, ...); default: its defaults.
    :param ready_file: a path where the bound base endpoint is written once
        the worker is listening (for supervisors and tests).
    :param parent_pid: if given, shut down (warm) once this process is no
        longer the worker's parent, i.e. when whoever started it died without
        stopping it. Checked every second.
    :param backend: ``(jobs, rpc)`` endpoints to *connect* to instead of
        binding (set by the prefork supervisor): the worker's intake is then a
        :class:`~zqsync.worker.intake.SupervisedIntake`, else a :class:`~zqsync.worker.intake.StandaloneIntake`.
    :param intake: how work reaches the worker (``intake.py``), instead of the one ``backend`` chooses.
    :param overrides: :class:`~zqsync.settings.WorkerSettings` fields that
        replace those of ``settings`` (``Worker(registry, concurrency=4)``).
    :raises ConfigurationError: an unknown or invalid setting, naming it.

    Must run in a process with a gevent hub; ``zqsync worker`` monkey-patches
    first, as gunicorn's gevent worker does.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        settings: Optional[WorkerSettings] = None,
        ready_file: Optional[str] = None,
        parent_pid: Optional[int] = None,
        backend: Optional[tuple[str, str]] = None,
        intake: Optional[Intake] = None,
        **overrides: Any,
    ) -> None:
        self.settings = (settings or WorkerSettings()).replace(**overrides)
        self.registry = registry
        self.bind_address = self.settings.bind
        self.concurrency = self.settings.concurrency
        self.graceful_timeout = self.settings.graceful_timeout
        self.ready_file = ready_file
        self.max_message_size = self.settings.max_message_size
        self.hwm = self.settings.hwm
        self.parent_pid = parent_pid
        self.curve_secret_key = self.settings.curve_secret_key
        self.intake = intake or intake_for(self.settings, backend, ready_file)
        self.endpoint: Optional[str] = None
        self.watchdog = Watchdog(hard_grace=self.settings.hard_grace)
        self.runner = Runner(registry, builtins={"zqsync.stats": self.stats, "zqsync.ping": lambda: "pong"},
                             watchdog=self.watchdog, remote_tracebacks=self.settings.remote_tracebacks)
        self.runner.counters.update(dict.fromkeys(STOP_COUNTERS, 0))
        self.identities: collections.Counter[bytes] = collections.Counter()
        self.started_at = time.time()
        self._slots = gevent.pool.Pool(self.concurrency)
        self.queues = build_queues(self.settings.queues, self.concurrency)
        self._calls = gevent.pool.Group()
        self._waiting = gevent.pool.Pool(WAITING_CALLS)
        self._admin = gevent.pool.Pool(ADMIN_CALLS)
        self._backlog: collections.deque[bytes] = collections.deque()
        self._stopping = False
        self._replied_at = 0.0
        self._admissions = Admissions(ADMISSIONS)
        self._held = HeldConfirms(HELD_CONFIRMS)
        self._shed_log = RateLimitedLog(log)
        self._admitter: Optional[gevent.Greenlet] = None  # admits the held confirms (_admit_held)
        self.runner.counters["confirms_shed"] = 0
        self.scheduler = build_scheduler(
            self.runner, self._slots, self.settings.state_dir, synchronous=self.settings.journal_sync,
            busy_timeout=self.settings.journal_busy_timeout, keep_done=self.settings.keep_done,
            keep_dead=self.settings.keep_dead,
        )
        self.runner.builtins.update(self.scheduler.book.builtins())
        self._signals: list[int] = []
        self._stop_deadline: Optional[float] = None
        self._greenlets: list[gevent.Greenlet] = []
        self._receivers: list[gevent.Greenlet] = []
        self._queue_receivers: list[gevent.Greenlet] = []
        self._context: Optional[zmq.Context] = None
        self._sockets: list[zmq.Socket] = []

    # -- sockets -----------------------------------------------------------

    def bind(self) -> str:
        """Make both sockets and let the intake bind or connect them; returns the worker's endpoint.

        :raises ConfigurationError: malformed bind endpoint.
        :raises zmq.ZMQError: the address is in use or unavailable.
        """
        context = self._context = zmq.green.Context()
        self.jobs = context.socket(self.intake.jobs_type)
        self.rpc = context.socket(zmq.ROUTER)
        self._sockets += [self.jobs, self.rpc]
        _common.on_fork_in_child(partial(_after_fork, weakref.ref(self)))
        for sock in (self.jobs, self.rpc):
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.RCVHWM, self.hwm)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_size)
        self.endpoint = self.scheduler.book.worker = self.intake.open(context, self.jobs, self.rpc, self._report)
        for queue in self.queues:
            self._sockets.append(queue.bind(context, hwm=self.hwm, max_message_size=self.max_message_size,
                                            curve_secret_key=self.curve_secret_key))
        return self.endpoint

    def _after_fork_in_child(self) -> None:
        """A task forked: in the child, nothing may touch the worker's sockets again.

        The child's copies of the worker's greenlets (receivers, monitors, the
        scheduler's loops, other tasks) would otherwise wake on the inherited
        sockets, whose libzmq state is shared with the parent's I/O thread, and
        steal its signals; and the orphan loop would claim the parent's
        journaled jobs. So stop every inherited watcher, keep the sockets
        referenced but never closed, and kill every copied greenlet except
        the one that forked. The child gets the default stop signals back:
        TERM ends it, as any process, instead of stopping a worker it is not.
        """
        for signum in STOP_SIGNALS:
            original_signal(signum, signal.SIG_DFL)
        current = gevent.getcurrent()
        for sock in [*self._sockets, *self.intake.sockets]:
            _common.disown(sock)
        _common.orphans.append(self._context)
        copies = [*self._receivers, *self._greenlets, *self.intake.greenlets, *self.scheduler.greenlets(),
                  *self.watchdog.greenlets(), *self._slots.greenlets, *self._calls.greenlets,
                  *self._waiting.greenlets, *self._admin.greenlets,
                  *(greenlet for queue in self.queues for greenlet in queue.pool.greenlets)]
        for greenlet in copies:
            if greenlet is not current and not greenlet.dead:
                greenlet.kill(block=False)

    # -- serving -----------------------------------------------------------

    def serve(self) -> int:
        """Bind (if not yet bound), serve until a stop signal, shut down; returns the exit status:
        0, or :data:`~zqsync.worker.watchdog.KILLED_EXIT` if the stop killed tasks.

        Blocks the calling greenlet. Installs SIGTERM, SIGINT and SIGQUIT handlers (Python-level,
        in the main thread: call it there), and starts the watchdog (``watchdog.py``).
        """
        for signum in STOP_SIGNALS:
            original_signal(signum, self._on_signal)
        self.watchdog.start()
        return self.run()

    def run(self) -> int:
        """Bind (if not yet bound), serve until :meth:`stop` (or a stop signal :meth:`serve` handles),
        shut down; returns the exit status as :meth:`serve` does.

        Blocks the calling greenlet; runs in any thread with a gevent hub of its own (the in-process
        worker of ``zqsync.testing``). By itself it installs no signal handler and starts no watchdog
        thread: time limits then hold for tasks that yield (``gevent.Timeout``), not for those that block the hub.
        """
        if self.endpoint is None:
            self.bind()
        self.scheduler.start()
        self._readers = (Reader(self.jobs), Reader(self.rpc))
        self._receivers = [gevent.spawn(self._receive_jobs), gevent.spawn(self._receive_calls)]
        self._admitter = gevent.spawn(self._admit_held)
        self._greenlets.append(self._admitter)
        self._queue_receivers = [gevent.spawn(queue.receive, self.scheduler.run_plain) for queue in self.queues]
        self._receivers += self._queue_receivers
        for queue in self.queues:
            log.info("queue %r on %s, concurrency %d", queue.name, queue.endpoint, queue.concurrency)
        self.intake.start(self._slots, self._admissions)
        if self.parent_pid is not None:
            self._greenlets.append(gevent.spawn(self._watch_parent, self.parent_pid))
        log.info("zqsync worker pid %d serving %d task(s) %s, concurrency %d",
                 os.getpid(), len(self.registry), self.intake.describe(), self.concurrency)
        self._write_ready_file()
        while not self._signals:
            gevent.sleep(SIGNAL_POLL)
        self.shutdown(warm=self._warm())
        killed = self.runner.counters["tasks_killed_on_stop"]
        return KILLED_EXIT if killed else 0

    def stop(self, *, warm: bool = True) -> None:
        """Ask the worker to stop, as a TERM (``warm``) or QUIT signal would; returns at once.
        Safe to call from any thread (the serving greenlet acts on it within ``SIGNAL_POLL`` seconds)."""
        self._on_signal(signal.SIGTERM if warm else signal.SIGQUIT)

    def _warm(self) -> bool:
        return len(self._signals) < 2 and not any(signum in COLD_SIGNALS for signum in self._signals)

    def _on_signal(self, signum: int, frame: Any = None) -> None:
        """Record a stop signal, and tell the watchdog when to kill tasks that still block the hub:
        at the end of the grace period, or at once for a cold stop. The main greenlet does the rest
        (gunicorn's arbiter). Runs between two bytecodes of whatever holds the main thread."""
        self._signals.append(signum)
        now = time.monotonic()
        if self._stop_deadline is None:
            self._stop_deadline = now + self.graceful_timeout
        self.watchdog.kill_tasks_at(self._stop_deadline if self._warm() else now)
        self.watchdog.kill_if_due()  # cold, and this handler interrupted a task: it ends here

    def _watch_parent(self, parent_pid: int) -> None:
        while os.getppid() == parent_pid:
            gevent.sleep(1.0)
        log.warning("parent process %d is gone: shutting down", parent_pid)
        self._on_signal(signal.SIGTERM)

    def _write_ready_file(self) -> None:
        if self.ready_file and self.endpoint:
            _common.write_ready_file(self.ready_file, self.endpoint)

    def _receive_jobs(self) -> None:
        """Read jobs while a slot is free (C-level, draining before waiting: ``inline.py``), each run
        inline in this greenlet unless another took the slot meanwhile."""
        current, reader = gevent.getcurrent(), self._readers[0]
        while self._receivers[0] is current and not self._stopping:
            self._slots.wait_available()
            yield_to_higher(self.queues)  # the named queues rank above the --bind jobs socket
            frame = self.intake.read_job(reader)
            if frame is None:
                continue
            if self._stopping:  # read while a stop's kill was on its way: the stop runs or counts it
                self._backlog.append(frame)
                return
            if not self._slots.free_count():  # a call took the slot meanwhile
                self._wait_for_slot(frame)
            elif not self._inline(0, self.scheduler.run_plain, frame):
                return
            self.intake.took(SLOT)

    def _wait_for_slot(self, frame: bytes) -> None:
        """Run a job once a slot is free; a stop that kills the wait keeps the job in the backlog."""
        try:
            self._slots.spawn(self.scheduler.run_plain, frame)
        except gevent.GreenletExit:
            self._backlog.append(frame)
            raise

    def _receive_calls(self) -> None:
        # A call needs a task slot: with one free (and no call waiting), it runs
        # inline in this greenlet (inline.py); else it waits for one in a greenlet
        # of its own (up to WAITING_CALLS of them; past that, receiving stops). The
        # worker's own calls need no slot and run at once. A confirmed job needs only
        # to be journaled, so it is admitted without a task slot and without a
        # greenlet: handed to the journal's writer thread, and acknowledged from the
        # hub right after its group commit (scheduler.py), up to ADMISSIONS at once
        # and a backlog bound; the journal, not the task pool, buffers it. Past
        # ADMISSIONS it is held unacknowledged (admission.py): receiving goes on.
        # The worker's own zqsync.* calls take no slot either: a long-poll
        # (zqsync.result) or a cancel must not wait behind the tasks it is about.
        current, reader = gevent.getcurrent(), self._readers[1]
        while self._receivers[1] is current:
            frames = reader.recv_multipart()
            envelope = frames[: self.intake.envelope]
            self._note_identity(envelope[-1])
            decoded = self._decode(frames)
            self.intake.took(self._receive_call(envelope, decoded))

    def _inline(self, index: int, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` in receiver ``index`` (0: jobs, 1: rpc), which holds a free slot. If it
        yields, a new receiver takes over (and, under a supervisor, the slot credit counts as used);
        returns whether the caller is still the receiver."""
        current = self._receivers[index]

        def hand_off() -> None:
            if index:
                self._calls.add(current)  # an in-flight call: the rpc socket closes after it answers
            elif self._stopping:  # the stop left this task to finish: it takes no more jobs
                return
            self._receivers[index] = gevent.spawn(self._receive_calls if index else self._receive_jobs)
            self.intake.took(SLOT)

        return run_inline(self._slots, hand_off, fn, *args)

    def _receive_call(self, envelope: list[bytes], decoded: Any) -> Optional[bytes]:
        """Start or answer one rpc message. Returns the credit it used (``dispatch.py``) if its start is
        already under way, ``None`` if none (a standalone worker, the worker's own calls) or if
        :meth:`_start_call` reports the start itself."""
        kind = SLOT if isinstance(decoded, bytes) else kind_of(decoded[0].kind, decoded[0].task)
        if isinstance(decoded, bytes):
            self._reply(envelope, decoded)
        elif self._stopping:
            self._refuse(envelope, decoded[0])
        elif decoded[0].kind == "confirm":
            self._admit(envelope, *decoded)
        elif kind == ADMIN or self.runner.is_builtin(decoded[1]):
            self._admin.spawn(self._answer, self.runner.answer_call, envelope, *decoded)
        elif self._slots.free_count() and not len(self._waiting):
            if not self._inline(1, self._answer, self.runner.answer_call, envelope, *decoded):
                return None  # handed off: the credit was counted then
        else:
            self._waiting.spawn(self._start_call, envelope, *decoded)
            return None
        return None if kind == ADMIN else kind

    def _admit(self, envelope: list[bytes], request: Any, task: Any) -> None:
        """Journal a confirmed job now if an admission place is free and none is held before it; else hold
        it, unacknowledged, for :meth:`_admit_held` (``admission.py``), so the rpc socket keeps being read.
        Past the hold's bound it is left unacknowledged: its client sends it again."""
        if not self._held and self._admissions.free_count():
            self._journal(envelope, request, task)
        elif not self._held.hold(request.id, (envelope, request, task)):
            self.runner.counters["confirms_shed"] += 1
            self._shed_log.warning("shed", "left a confirmed job unacknowledged: %d are held waiting for the "
                                   "journal and the backlog; its client sends it again", len(self._held))

    def _admit_held(self) -> None:
        """Journal the held confirmed jobs, oldest first, as admission places free up (a greenlet)."""
        while True:
            self._held.wait()
            self._admissions.wait_available()
            self._journal(*self._held.pop())

    def _journal(self, envelope: list[bytes], request: Any, task: Any) -> None:
        """Take an admission place (one is free) and hand a confirmed job to the journal; answered later."""
        self._admissions.acquire()
        self.runner.answer_confirm(request, task, partial(self._acknowledge, envelope))

    def _ignore_held(self) -> None:
        """On stop: the held confirmed jobs stay unacknowledged (never journaled here); their clients send
        them again, to a peer or to this worker's next start."""
        if self._admitter is not None:
            self._admitter.kill()
        self.runner.counters["confirms_ignored_on_stop"] += self._held.clear()

    def _start_call(self, envelope: list[bytes], request: Any, task: Any) -> None:
        """Wait for a task slot and run the call in it; a stop that kills the wait refuses the call."""
        try:
            self._calls.add(self._slots.spawn(self._answer, self.runner.answer_call, envelope, request, task))
        except gevent.GreenletExit:
            self._refuse(envelope, request)
        finally:
            self.intake.took(SLOT)

    def _refuse(self, envelope: list[bytes], request: Any) -> None:
        """While stopping: refuse a call at once (not run); leave a confirmed job unacknowledged,
        so that its client sends it again, to a peer or to this worker's next start."""
        if request.kind == "confirm":
            self.runner.counters["confirms_ignored_on_stop"] += 1
            return
        self.runner.counters["calls_refused_on_stop"] += 1
        self._reply(envelope, encode_error(request.id, WorkerStopping.__name__,
                                           "the worker is stopping and did not run this call; retry it"))

    def _decode(self, frames: list[bytes]) -> Any:
        if len(frames) != self.intake.envelope + 1:
            self.runner.counters["malformed"] += 1
            body_frames = len(frames) - self.intake.envelope
            return encode_error("", ProtocolError.__name__, f"expected one body frame, got {body_frames}")
        return self.runner.decode_rpc(frames[-1])

    def _note_identity(self, identity: bytes) -> None:
        if len(self.identities) < MAX_IDENTITIES or identity in self.identities:
            self.identities[identity] += 1

    def _answer(self, answer: Any, envelope: list[bytes], request: Any, task: Any) -> None:
        try:
            reply = answer(request, task)
        except gevent.GreenletExit:
            stopped = encode_error(request.id, WorkerShutdown.__name__, "the worker stopped before the task finished")
            self._reply(envelope, stopped)
            raise
        self._reply(envelope, reply)

    def _acknowledge(self, envelope: list[bytes], reply: bytes) -> None:
        """Answer a confirmed job (in the hub, or in the receiver for an answer given at once); a reply
        that cannot be sent leaves the job unacknowledged, and its client sends it again."""
        self._admissions.release()
        try:
            self._reply(envelope, reply)
        except zmq.ZMQError as exc:
            log.warning("could not answer a confirmed job of client %r: %s", envelope[-1], exc)

    def _reply(self, envelope: list[bytes], reply: bytes) -> None:
        self._replied_at = time.monotonic()
        try:
            self._readers[1].send_multipart([*envelope, reply])
        except zmq.Again:
            log.warning("dropped a reply: client %r is not reading", envelope[-1])

    def shutdown(self, *, warm: bool = True) -> None:
        """Stop taking jobs, drain the jobs queue, run (warm) or discard (cold) what is queued, finish
        or kill in-flight tasks, and close the sockets. See the module docstring for the order.

        A warm shutdown waits up to ``graceful_timeout`` seconds, and turns
        cold if another stop signal arrives meanwhile. Blocks the calling greenlet.
        """
        self._stopping = True
        self._ignore_held()
        self.scheduler.book.close()
        self._stop_receiving()
        self.scheduler.discard_plain_pending()
        self.scheduler.pause()
        self._stop_taking_jobs()
        rpc = gevent.spawn(self._retire_rpc)
        if warm and self._busy():
            self._finish_in_flight()
        self._discard_backlog("not started within the grace period" if warm else "cold shutdown")
        self._waiting.kill(timeout=1.0)  # calls still waiting for a slot are refused, not run
        self._admissions.join(timeout=5.0)
        if self.watchdog.killed:
            log.warning("stop: killed %d task(s) that blocked the worker past the grace period", self.watchdog.killed)
            self.runner.counters["tasks_killed_on_stop"] += self.watchdog.killed
        if self._running():
            self._kill_running()
        rpc.join(timeout=5.0 + REPLY_DRAIN)
        if not self.rpc.closed:
            rpc.kill()
            self.rpc.close(linger=0)
        self.scheduler.stop()
        gevent.killall(self._greenlets)
        self.watchdog.stop()
        self.intake.close()
        self.jobs.close(linger=0)  # unbound or disconnected, and read to the end
        for queue in self.queues:
            if queue.sock is not None:
                queue.sock.close(linger=0)
        if self._context is not None:
            self._context.term()
        log.info("zqsync worker pid %d stopped", os.getpid())

    def _stop_receiving(self) -> None:
        """Kill the job receivers and the credit offers (``_stopping`` is set). A jobs receiver that runs a
        task inline (it yielded, and has not handed off yet) is a task in flight: it is left to finish, and
        receives no more. A receiver that reads a job while the kill is on its way keeps it in the backlog
        (:meth:`_receive_jobs`)."""
        jobs = [receiver for receiver in self._receivers[:1] if receiver not in self._slots]
        gevent.killall([*jobs, *self._queue_receivers])
        self.intake.stop_offering()

    def _stop_taking_jobs(self) -> None:
        """Unbind (standalone) or disconnect (supervised) the jobs socket, reading into memory every
        job already in its queue; then the named queues' sockets."""
        where = self.intake.stop_taking_jobs(self._backlog.append)
        for queue in self.queues:  # their queued jobs join the backlog, run in the default pool
            if queue.peers is not None:
                quiesce(queue.peers, self._backlog.append)
        log.info("stopped taking jobs from %s; %d queued plain job(s) to run", where, len(self._backlog))

    def _discard_backlog(self, reason: str) -> None:
        if self._backlog:
            count = len(self._backlog)
            self._backlog.clear()
            self.runner.counters["jobs_discarded_on_stop"] += count
            log.warning("discarded %d queued plain jobs on shutdown (%s)", count, reason)

    def _kill_running(self) -> None:
        """Kill the tasks still running, and count (``tasks_killed_on_stop``) and log those the kill ended:
        a task that finished before the kill reached it (a timer that fired first) ran, and is not counted."""
        running = [greenlet for pool in self._pools() for greenlet in list(pool)]
        for pool in self._pools():
            pool.kill(timeout=1.0)
        killed = sum(1 for greenlet in running if isinstance(greenlet.value, gevent.GreenletExit))
        log.warning("cold shutdown: killed %d of %d task(s) still running", killed, len(running))
        self.runner.counters["tasks_killed_on_stop"] += killed

    def _retire_rpc(self) -> None:
        """Close the rpc socket once the in-flight calls are answered (refusing new ones meanwhile)."""
        while len(self._calls) or len(self._waiting) or len(self._admin):
            self._calls.join(timeout=0.05)
        self._admissions.join(timeout=5.0)
        # Closing a TCP socket with unread input (a client's heartbeat, say)
        # makes the kernel send RST, and a client that had not yet read our
        # last reply loses it with the connection. Give the last replies (results,
        # or WorkerShutdown errors) a moment to be read first.
        gevent.sleep(max(0.0, self._replied_at + REPLY_DRAIN - time.monotonic()))
        gevent.killall(self._receivers[1:])
        self.intake.unwatch(self.rpc)
        self.rpc.close(linger=1000)
        log.info("stopped taking calls")

    def _busy(self) -> bool:
        """Tasks running (any queue), jobs queued in memory, or calls waiting for a slot."""
        return bool(self._running() or self._backlog or len(self._waiting))

    def _finish_in_flight(self) -> None:
        log.info("warm shutdown: waiting up to %.1f s for %d task(s) and %d queued job(s)",
                 self.graceful_timeout, self._running(), len(self._backlog))
        deadline = self._stop_deadline or time.monotonic() + self.graceful_timeout
        signals_before = len(self._signals)
        while self._busy() and len(self._signals) == signals_before:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not self._backlog:  # wait for the tasks, or for the calls waiting to take a free slot
                if self._running():
                    for pool in self._pools():
                        pool.join(timeout=min(0.1, remaining))
                else:
                    self._waiting.join(timeout=min(0.1, remaining))
            elif self._slots.free_count():
                self._slots.spawn(self.scheduler.run_plain, self._backlog.popleft())
            else:
                self._slots.wait_available(timeout=min(0.1, remaining))

    def _pools(self) -> list[gevent.pool.Pool]:
        return [self._slots, *(queue.pool for queue in self.queues)]

    def _running(self) -> int:
        return sum(len(pool) for pool in self._pools())

    # -- introspection -----------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for ``zqsync.stats`` calls: this process's, or under a prefork supervisor the whole worker's.

        Standalone: :meth:`local_stats`. Under a supervisor, every child's
        local stats gathered over their admin sockets (``fleet.py``; blocks
        the calling greenlet up to ``fleet.GATHER_TIMEOUT``, 1.0 s, for a
        child that does not answer) and merged:

        - every counter of :meth:`local_stats` (``jobs_*``, ``plain_received``,
          ``confirmed_*``, ``calls_*``, ``in_flight``, ...): the sum over the
          children that answered;
        - ``durations``: per task and ``"*"``, ``count`` and ``p50``/``p90``/``p99``
          seconds over the children's merged samples;
        - ``identities_by_pid`` (summed), ``identities`` and ``clients`` (concatenated);
        - ``pid``, ``uptime``, ``state`` and ``tasks``: those of the child that answered;
        - ``supervisor``: ``{"pid", "started" (epoch seconds), "uptime" (seconds),
          "processes" (configured), "restarts", "jobs_lost_in_children"}`` (plain jobs
          routed to children that exited without reading them: ``supervisor.py``);
        - ``children``: one entry per child, sorted by pid: ``{"pid", "state",
          "uptime", "in_flight", "counters": {its counters}, "durations"}``;
          ``state`` is ``up``, ``busy`` (every slot taken), ``stopping`` or
          ``unreachable`` (no answer within 1.0 s: its hub is blocked, or it is
          stopped; then only ``pid`` and ``state`` are meaningful);
        - ``unreachable``: how many children did not answer.
        """
        return self.intake.stats(self.local_stats, self._report)

    def _report(self) -> dict[str, Any]:
        return {"stats": self.local_stats(), "samples": self.runner.durations.samples()}

    def _state(self) -> str:
        if self._stopping:
            return "stopping"
        return "busy" if not self._slots.free_count() else "up"

    def local_stats(self) -> dict[str, Any]:
        """This process's counters.

        :returns: the runner's counters (see below), ``pid``, ``uptime`` (seconds),
            ``state`` (``up``, ``busy``: every slot taken, ``stopping``), ``tasks`` (names),
            ``identities_by_pid``: ``{client pid: distinct socket identities
            seen on rpc}``, ``identities`` (distinct rpc identities, as str),
            when the worker binds its own sockets, ``connections_jobs`` /
            ``connections_rpc`` and ``disconnections_jobs`` /
            ``disconnections_rpc``: TCP connections accepted and lost since start;
            ``durations``: per task and ``"*"``, ``count`` and ``p50``/``p90``/``p99``
            seconds over recent runs; ``clients``: the stats of the
            zqsync clients that tasks in this process use; and ``queues``:
            per named queue, its ``endpoint``, ``concurrency`` and ``running`` tasks.

        Job counters: ``jobs_received`` counts every job this process took in,
        ``plain_received`` (on the jobs socket) plus ``confirmed_accepted``
        (newly journaled; ``confirmed_received`` also counts duplicates and
        refusals); ``jobs_replayed`` the journaled jobs it took over from a
        process that is gone. Each ends as ``jobs_succeeded``, ``jobs_failed``
        (``jobs_dead`` if it had retries), ``unknown_task`` or
        ``jobs_discarded_on_stop``; ``jobs_retried`` counts failed attempts
        run again. ``confirms_shed`` counts confirmed jobs left unacknowledged because the hold of those
        waiting for an admission place was full (``admission.py``; their clients send them again).
        ``calls_received`` = ``calls_succeeded`` + ``calls_failed``
        (+ those in flight); ``timed_out`` counts both kinds.
        """
        by_pid: collections.Counter[str] = collections.Counter()
        for identity in self.identities:
            parts = identity.split(b"-")
            by_pid[parts[1].decode() if len(parts) == 3 and parts[0] == b"zq" else "?"] += 1
        return {
            **self.runner.counters,
            "pid": os.getpid(),
            "uptime": time.time() - self.started_at,
            "state": self._state(),
            "tasks": self.registry.names(),
            "identities_by_pid": dict(by_pid),
            "identities": [identity.decode("utf-8", "replace") for identity in self.identities],
            **self.intake.connections,
            "durations": self.runner.durations.percentiles(),
            "clients": [client.stats() for client in _common.live_clients()],
            "queues": {queue.name: queue.stats() for queue in self.queues},
        }
