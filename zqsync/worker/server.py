"""Worker: jobs (PULL) on port N and rpc (ROUTER) on port N+1, tasks in a gevent pool.

Receiving waits for a free slot in the task pool (``gevent.pool.Pool``), so a
busy worker stops draining its sockets, the high-water marks fill, and the
clients' congestion control sees it.

Standalone, the worker binds both sockets. As a child of a prefork
supervisor (``supervisor.py``) it connects them to the supervisor's proxy
backends instead, and rpc requests then carry the proxy's routing id in
front of the client's.

Shutdown (gunicorn's arbiter model): signal handlers only record the signal;
the main greenlet acts on it. TERM/INT is warm, in this order:

1. Take no more jobs. Standalone, the jobs endpoint is unbound: libzmq then
   closes the listener *and every client connection on it*, so clients
   that list several workers (``ZMQ_IMMEDIATE``) send to the others.
   Under a supervisor, the child reads its backend queue until it is quiet
   (the supervisor has stopped its jobs proxy meanwhile) and disconnects.
2. Drain: the jobs already in the socket's queue stay readable after the
   unbind (measured: all of a full 1000-message queue, even seconds later,
   whatever the linger) and are read into memory.
3. Run them, and finish in-flight tasks, within ``graceful_timeout``; jobs
   still not started then are counted (``jobs_discarded_on_stop``) and
   logged: ``discarded N queued plain jobs on shutdown``. So are pending
   in-memory retries of plain jobs (the scheduler logs their ids).
4. Calls: in-flight calls are answered; calls that arrive meanwhile are
   refused at once with a ``WorkerStopping`` error (not run, safe to retry
   elsewhere), and confirmed jobs are not acknowledged (their clients send
   them again). The rpc socket closes once the in-flight calls are answered.

Residual window, honestly: jobs a client had queued to this worker that had
not reached its process when the connection closed (the client's own
queue for it and both kernels' socket buffers) are lost, and neither side
can count them: libzmq drops a disconnected pipe (``ZMQ_IMMEDIATE``) and the
kernel resets a connection closed with unread data (``TCPAbortOnClose``).
Under a stream to a worker that keeps up this is what was in flight at that
instant (none in most test runs, up to 98 with bursts of 200 jobs; ~1,000
from a client sending flat out); behind a worker whose queues are full it is
what the buffers hold (25,000-48,500 100-byte jobs on loopback, most in the
client's kernel send buffer: ``benchmarks/unbind_experiment.py``). Reading the queue fast before unbinding does not shrink it: the
client refills as fast. Confirmed jobs have no such window.

A second TERM/INT, QUIT, or the end of the grace period is cold: in-flight
tasks are killed (confirmed ones stay pending in the journal and run after
the next start), and queued plain jobs are discarded with a count.
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
import gevent.pool
import zmq
import zmq.green
import zmq.utils.monitor

from .. import _common
from ..errors import ProtocolError, WorkerShutdown, WorkerStopping
from ..settings import WorkerSettings
from ..wire.envelope import encode_error
from .auth import GeventAuthenticator, curve_state
from .binding import bind_pair
from .registry import Registry
from .runner import Runner
from .scheduler import build_scheduler
from .watchdog import Watchdog

log = logging.getLogger(__name__)

#: Distinct client identities remembered for ``zqsync.stats``.
MAX_IDENTITIES = 10_000
#: Confirmed jobs being journaled at once (they share group commits).
ADMISSIONS = 64
#: Seconds a warm shutdown waits after the last task before closing its sockets.
REPLY_DRAIN = 0.25
#: Seconds without a message after which a stopping worker's jobs queue counts as drained.
DRAIN_QUIET = 0.2
#: Most seconds a supervised child spends reading its backend queue before it disconnects.
DRAIN_LIMIT = 5.0
#: Counters of what a stop refused or discarded (``zqsync.stats``).
STOP_COUNTERS = ("jobs_discarded_on_stop", "calls_refused_on_stop", "confirms_ignored_on_stop")
COLD_SIGNALS = (signal.SIGQUIT,)


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
        binding (set by the prefork supervisor).
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
        self.backend = backend
        self.curve_secret_key, self.allow_client_keys = self.settings.curve_secret_key, self.settings.allow_client_keys
        self._authenticator: Any = None
        self.endpoint: Optional[str] = None
        self.watchdog = Watchdog(hard_grace=self.settings.hard_grace)
        self.runner = Runner(registry, builtins={"zqsync.stats": self.stats, "zqsync.ping": lambda: "pong"},
                             watchdog=self.watchdog, remote_tracebacks=self.settings.remote_tracebacks)
        self.runner.counters.update(dict.fromkeys(STOP_COUNTERS, 0))
        self.identities: collections.Counter[bytes] = collections.Counter()
        self.connections: dict[str, int] = {}
        self.started_at = time.time()
        self._slots = gevent.pool.Pool(self.concurrency)
        self._calls = gevent.pool.Group()
        self._calls_waiting = 0
        self._backlog: collections.deque[bytes] = collections.deque()
        self._stopping = False
        self._replied_at = 0.0
        self._admissions = gevent.pool.Pool(ADMISSIONS)
        self.scheduler = build_scheduler(
            self.runner, self._slots, self.settings.state_dir, synchronous=self.settings.journal_sync,
            busy_timeout=self.settings.journal_busy_timeout, keep_done=self.settings.keep_done,
            keep_dead=self.settings.keep_dead,
        )
        self._signals: list[int] = []
        self._wakeup = gevent.event.Event()
        self._greenlets: list[gevent.Greenlet] = []
        self._receivers: list[gevent.Greenlet] = []
        self._context: Optional[zmq.Context] = None
        self._sockets: list[zmq.Socket] = []
        self._envelope = 2 if backend else 1  # frames in front of the body on rpc

    # -- sockets -----------------------------------------------------------

    def bind(self) -> str:
        """Bind (or, under a supervisor, connect) both sockets; returns the base endpoint.

        :raises ConfigurationError: malformed bind endpoint.
        :raises zmq.ZMQError: the address is in use or unavailable.
        """
        context = self._context = zmq.green.Context()
        self.jobs = context.socket(zmq.PULL)
        self.rpc = context.socket(zmq.ROUTER)
        self._sockets += [self.jobs, self.rpc]
        _common.on_fork_in_child(partial(_after_fork, weakref.ref(self)))
        for sock in (self.jobs, self.rpc):
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.RCVHWM, self.hwm)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_size)
        if self.backend:
            self.jobs.connect(self.backend[0])
            self.rpc.connect(self.backend[1])
            self.endpoint = self.bind_address
            return self.endpoint
        if self.allow_client_keys:
            self._authenticator = GeventAuthenticator(context, self.allow_client_keys)
            self._authenticator.start()
        self.endpoint = bind_pair(self.jobs, self.rpc, self.bind_address, curve_secret_key=self.curve_secret_key)
        self._jobs_endpoint = self.jobs.getsockopt_string(zmq.LAST_ENDPOINT)
        self._greenlets += [self._watch_connections(self.jobs, "jobs"), self._watch_connections(self.rpc, "rpc")]
        return self.endpoint

    def _watch_connections(self, sock: zmq.Socket, name: str) -> gevent.Greenlet:
        """Count TCP connections accepted and lost per socket: the peer-side view of client
        socket reuse (few connections) and discard (a disconnection)."""
        monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._sockets.append(monitor)
        keys: dict[int, str] = {
            int(zmq.EVENT_ACCEPTED): f"connections_{name}", int(zmq.EVENT_DISCONNECTED): f"disconnections_{name}",
        }
        for key in keys.values():
            self.connections[key] = 0

        def watch() -> None:
            try:
                while True:
                    event = zmq.utils.monitor.recv_monitor_message(monitor)
                    key = keys.get(event["event"])
                    if key:
                        self.connections[key] += 1
            finally:
                monitor.close(linger=0)

        return gevent.spawn(watch)

    def _after_fork_in_child(self) -> None:
        """A task forked: in the child, nothing may touch the worker's sockets again.

        The child's copies of the worker's greenlets (receivers, monitors, the
        scheduler's loops, other tasks) would otherwise wake on the inherited
        sockets, whose libzmq state is shared with the parent's I/O thread, and
        steal its signals; and the orphan loop would claim the parent's
        journaled jobs. So stop every inherited watcher, keep the sockets
        referenced but never closed, and kill every copied greenlet except
        the one that forked.
        """
        current = gevent.getcurrent()
        for sock in self._sockets:
            _common.disown(sock)
        _common.orphans.append(self._context)
        copies = [*self._receivers, *self._greenlets, *self.scheduler.greenlets(), *self.watchdog.greenlets(),
                  *self._slots.greenlets, *self._admissions.greenlets]
        for greenlet in copies:
            if greenlet is not current and not greenlet.dead:
                greenlet.kill(block=False)

    # -- serving -----------------------------------------------------------

    def serve(self) -> int:
        """Bind (if not yet bound), serve until a stop signal, shut down; returns the exit status 0.

        Blocks the calling greenlet. Installs SIGTERM, SIGINT and SIGQUIT handlers.
        """
        if self.endpoint is None:
            self.bind()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            gevent.signal_handler(signum, self._on_signal, signum)
        self.watchdog.start()
        self.scheduler.start()
        self._receivers = [gevent.spawn(self._receive_jobs), gevent.spawn(self._receive_calls)]
        if self.parent_pid is not None:
            self._greenlets.append(gevent.spawn(self._watch_parent, self.parent_pid))
        where = (f"behind the supervisor's {self.endpoint}" if self.backend
                 else f"on {self.endpoint} (rpc on port +1), {curve_state(self._authenticator)}")
        log.info("zqsync worker pid %d serving %d task(s) %s, concurrency %d",
                 os.getpid(), len(self.registry), where, self.concurrency)
        self._write_ready_file()
        self._wakeup.wait()
        self.shutdown(warm=self._warm())
        return 0

    def _warm(self) -> bool:
        return len(self._signals) < 2 and not any(signum in COLD_SIGNALS for signum in self._signals)

    def _on_signal(self, signum: int) -> None:
        # Only record it; the main greenlet decides what to do (gunicorn's arbiter).
        self._signals.append(signum)
        self._wakeup.set()

    def _watch_parent(self, parent_pid: int) -> None:
        while os.getppid() == parent_pid:
            gevent.sleep(1.0)
        log.warning("parent process %d is gone: shutting down", parent_pid)
        self._on_signal(signal.SIGTERM)

    def _write_ready_file(self) -> None:
        if self.ready_file and self.endpoint:
            _common.write_ready_file(self.ready_file, self.endpoint)

    def _receive_jobs(self) -> None:
        while True:
            self._slots.wait_available()
            frame = self.jobs.recv()
            self._slots.spawn(self.scheduler.run_plain, frame)

    def _receive_calls(self) -> None:
        # A call needs a task slot: spawning it waits for one, with the call in
        # hand, and receiving stops meanwhile. A confirmed job needs only to be
        # journaled, so it is admitted without a task slot, up to a backlog
        # bound (scheduler.py); the journal, not the task pool, buffers it.
        while True:
            frames = self.rpc.recv_multipart()
            envelope = frames[: self._envelope]
            self._note_identity(envelope[-1])
            decoded = self._decode(frames)
            if isinstance(decoded, bytes):
                self._reply(envelope, decoded)
            elif self._stopping:
                self._refuse(envelope, decoded[0])
            elif decoded[0].kind == "confirm":
                self._admissions.spawn(self._answer, self.runner.answer_confirm, envelope, *decoded)
            else:
                self._calls_waiting += 1  # spawning waits for a free slot
                try:
                    self._calls.add(self._slots.spawn(self._answer, self.runner.answer_call, envelope, *decoded))
                finally:
                    self._calls_waiting -= 1

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
        if len(frames) != self._envelope + 1:
            self.runner.counters["malformed"] += 1
            return encode_error("", ProtocolError.__name__, f"expected one body frame, got {len(frames) - self._envelope}")
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

    def _reply(self, envelope: list[bytes], reply: bytes) -> None:
        self._replied_at = time.monotonic()
        try:
            self.rpc.send_multipart([*envelope, reply], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a reply: client %r is not reading", envelope[-1])

    def shutdown(self, *, warm: bool = True) -> None:
        """Stop taking jobs, drain the jobs queue, run (warm) or discard (cold) what is queued, finish
        or kill in-flight tasks, and close the sockets. See the module docstring for the order.

        A warm shutdown waits up to ``graceful_timeout`` seconds, and turns
        cold if another stop signal arrives meanwhile. Blocks the calling greenlet.
        """
        self._stopping = True
        gevent.killall(self._receivers[:1])
        self.scheduler.discard_plain_pending()
        self.scheduler.pause()
        self._stop_taking_jobs()
        rpc = gevent.spawn(self._retire_rpc)
        if warm and (len(self._slots) or self._backlog):
            self._finish_in_flight()
        self._discard_backlog("not started within the grace period" if warm else "cold shutdown")
        self._admissions.join(timeout=5.0)
        if len(self._slots):
            log.warning("cold shutdown: killing %d task(s) still running", len(self._slots))
            self._slots.kill(timeout=1.0)
        rpc.join(timeout=5.0 + REPLY_DRAIN)
        if not self.rpc.closed:
            rpc.kill()
            self.rpc.close(linger=0)
        self.scheduler.stop()
        gevent.killall(self._greenlets)
        self.watchdog.stop()
        if not self.backend:
            self.jobs.disable_monitor()
        self.jobs.close(linger=0)  # unbound or disconnected, and read to the end
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._context is not None:
            self._context.term()
        log.info("zqsync worker pid %d stopped", os.getpid())

    def _stop_taking_jobs(self) -> None:
        """Unbind (standalone) or disconnect (supervised) the jobs socket, reading into memory every
        job already in its queue."""
        if self.backend:
            self._drain_jobs(limit=DRAIN_LIMIT)  # the supervisor's jobs proxy is stopped meanwhile
            self.jobs.disconnect(self.backend[0])
            where = "the supervisor"
        else:
            self.jobs.unbind(self._jobs_endpoint)
            where = self._jobs_endpoint
        self._drain_jobs(limit=DRAIN_LIMIT)
        log.info("stopped taking jobs from %s; %d queued plain job(s) to run", where, len(self._backlog))
        if self.backend and self.ready_file:
            with open(f"{self.ready_file}.drained", "w"):
                pass

    def _drain_jobs(self, *, limit: float) -> None:
        """Read the jobs socket into the backlog until it stays empty for ``DRAIN_QUIET`` seconds
        (or ``limit`` seconds have passed)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.jobs.poll(int(DRAIN_QUIET * 1000)):
            while True:
                try:
                    self._backlog.append(self.jobs.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break

    def _discard_backlog(self, reason: str) -> None:
        if self._backlog:
            count = len(self._backlog)
            self._backlog.clear()
            self.runner.counters["jobs_discarded_on_stop"] += count
            log.warning("discarded %d queued plain jobs on shutdown (%s)", count, reason)

    def _retire_rpc(self) -> None:
        """Close the rpc socket once the in-flight calls are answered (refusing new ones meanwhile)."""
        while len(self._calls) or self._calls_waiting:
            self._calls.join(timeout=0.05)
        self._admissions.join(timeout=5.0)
        # Closing a TCP socket with unread input (a client's heartbeat, say)
        # makes the kernel send RST, and a client that had not yet read our
        # last reply loses it with the connection. Give the last replies (results,
        # or WorkerShutdown errors) a moment to be read first.
        gevent.sleep(max(0.0, self._replied_at + REPLY_DRAIN - time.monotonic()))
        gevent.killall(self._receivers[1:])
        if not self.backend:
            self.rpc.disable_monitor()
        self.rpc.close(linger=1000)
        log.info("stopped taking calls")

    def _finish_in_flight(self) -> None:
        log.info("warm shutdown: waiting up to %.1f s for %d task(s) and %d queued job(s)",
                 self.graceful_timeout, len(self._slots), len(self._backlog))
        deadline = time.monotonic() + self.graceful_timeout
        signals_before = len(self._signals)
        while (len(self._slots) or self._backlog) and len(self._signals) == signals_before:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not self._backlog:
                self._slots.join(timeout=min(0.1, remaining))
            elif self._slots.free_count():
                self._slots.spawn(self.scheduler.run_plain, self._backlog.popleft())
            else:
                self._slots.wait_available(timeout=min(0.1, remaining))

    # -- introspection -----------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for ``zqsync.stats`` calls.

        :returns: the runner's counters (``jobs_*``, ``confirmed_*``,
            ``calls_*``, ``timed_out``, ``unknown_task``, ``malformed``,
            ``in_flight``), ``pid``, ``uptime`` (seconds), ``tasks`` (names),
            ``identities_by_pid``: ``{client pid: distinct socket identities
            seen on rpc}``, ``identities`` (distinct rpc identities, as str),
            when the worker binds its own sockets, ``connections_jobs`` /
            ``connections_rpc`` and ``disconnections_jobs`` /
            ``disconnections_rpc``: TCP connections accepted and lost since start;
            ``durations``: per task and ``"*"``, ``count`` and ``p50``/``p90``/``p99``
            seconds over recent runs; and ``clients``: the stats of the
            zqsync clients that tasks in this process use.
        """
        by_pid: collections.Counter[str] = collections.Counter()
        for identity in self.identities:
            parts = identity.split(b"-")
            by_pid[parts[1].decode() if len(parts) == 3 and parts[0] == b"zq" else "?"] += 1
        return {
            **self.runner.counters,
            "pid": os.getpid(),
            "uptime": time.time() - self.started_at,
            "tasks": self.registry.names(),
            "identities_by_pid": dict(by_pid),
            "identities": [identity.decode("utf-8", "replace") for identity in self.identities],
            **self.connections,
            "durations": self.runner.durations.percentiles(),
            "clients": [client.stats() for client in _common.live_clients()],
        }
