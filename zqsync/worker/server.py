"""Worker: jobs (PULL) on port N and rpc (ROUTER) on port N+1, tasks in a gevent pool.

Receiving waits for a free slot in the task pool (``gevent.pool.Pool``), so a
busy worker stops draining its sockets, the high-water marks fill, and the
clients' congestion control sees it.

Standalone, the worker binds both sockets. As a child of a prefork
supervisor (``supervisor.py``) it connects them to the supervisor's proxy
backends instead, and rpc requests then carry the proxy's routing id in
front of the client's.

Shutdown (gunicorn's arbiter model): signal handlers only record the signal;
the main greenlet acts on it. TERM/INT is warm: stop receiving, let in-flight
tasks finish within ``graceful_timeout``, exit. A second TERM/INT, QUIT, or
the end of the grace period is cold: in-flight tasks are killed (confirmed
ones stay pending in the journal and run after the next start).
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

from .. import lifecycle, settings
from ..auth import GeventAuthenticator
from ..client import all_clients
from ..errors import ConfigurationError
from ..protocol import MAX_MESSAGE_SIZE, encode_error
from .binding import bind_pair
from .registry import Registry
from .runner import Runner
from .scheduler import build_scheduler

log = logging.getLogger(__name__)

#: Distinct client identities remembered for ``zqsync.stats``.
MAX_IDENTITIES = 10_000
#: Confirmed jobs being journaled at once (they share group commits).
ADMISSIONS = 64
#: Seconds a warm shutdown waits after the last task before closing its sockets.
REPLY_DRAIN = 0.25
COLD_SIGNALS = (signal.SIGQUIT,)


def _after_fork(worker: "weakref.ReferenceType[Worker]") -> None:
    alive = worker()
    if alive is not None:
        alive._after_fork_in_child()


class Worker:
    """A zqsync worker serving one registry.

    :param registry: the tasks to run.
    :param bind: base endpoint ``tcp://HOST:PORT``; jobs bind PORT and rpc
        PORT+1. PORT ``0`` picks a free pair.
    :param concurrency: task slots (greenlets), at least 1.
    :param graceful_timeout: seconds a warm shutdown waits for in-flight tasks.
    :param ready_file: a path where the bound base endpoint is written once
        the worker is listening (for supervisors and tests).
    :param max_message_size: bytes; larger frames are refused by ZeroMQ
        (``ZMQ_MAXMSGSIZE``).
    :param hwm: receive high-water mark of both sockets, messages.
    :param parent_pid: if given, shut down (warm) once this process is no
        longer the worker's parent, i.e. when whoever started it died without
        stopping it. Checked every second.
    :param state_dir: directory of the journal of confirmed jobs; ``None``
        refuses confirmed jobs.
    :param journal_sync: SQLite ``synchronous`` level, ``"NORMAL"`` or ``"FULL"``.
    :param backend: ``(jobs, rpc)`` endpoints to *connect* to instead of
        binding (set by the prefork supervisor).
    :param curve_secret_key: the worker's ``.key_secret`` file: both sockets
        then accept only CURVE clients whose public key is in ``allow_client_keys``.
    :param allow_client_keys: directory of allowed client public keys (``*.key``).
    :param journal_options: more :func:`~zqsync.worker.scheduler.build_scheduler` options
        (``busy_timeout``, ``keep_done``, ``keep_dead`` seconds, ...).

    Must run in a process with a gevent hub; ``zqsync worker`` monkey-patches
    first, as gunicorn's gevent worker does.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        bind: str = settings.BIND,
        concurrency: int = settings.CONCURRENCY,
        graceful_timeout: float = settings.GRACEFUL_TIMEOUT,
        ready_file: Optional[str] = None,
        max_message_size: int = MAX_MESSAGE_SIZE,
        hwm: int = settings.HWM,
        parent_pid: Optional[int] = None,
        state_dir: Optional[str] = None,
        journal_sync: str = "NORMAL",
        backend: Optional[tuple[str, str]] = None,
        curve_secret_key: Optional[str] = None,
        allow_client_keys: Optional[str] = None,
        journal_options: Optional[dict[str, Any]] = None,
    ) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an integer >= 1, got {concurrency!r}", setting="concurrency")
        self.registry = registry
        self.bind_address = bind
        self.concurrency = concurrency
        self.graceful_timeout = float(graceful_timeout)
        self.ready_file = ready_file
        self.max_message_size = max_message_size
        self.hwm = hwm
        self.parent_pid = parent_pid
        self.backend = backend
        if bool(curve_secret_key) != bool(allow_client_keys):
            raise ConfigurationError("CURVE needs both a secret key and a directory of allowed client keys",
                                     setting="curve_secret_key")
        self.curve_secret_key, self.allow_client_keys = curve_secret_key, allow_client_keys
        self._authenticator: Any = None
        self.endpoint: Optional[str] = None
        self.runner = Runner(registry, builtins={"zqsync.stats": self.stats, "zqsync.ping": lambda: "pong"})
        self.identities: collections.Counter[bytes] = collections.Counter()
        self.connections: dict[str, int] = {}
        self.started_at = time.time()
        self._slots = gevent.pool.Pool(concurrency)
        self._admissions = gevent.pool.Pool(ADMISSIONS)
        self.scheduler = build_scheduler(self.runner, self._slots, state_dir, synchronous=journal_sync,
                                         **(journal_options or {}))
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
        os.register_at_fork(after_in_child=partial(_after_fork, weakref.ref(self)))
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
            lifecycle.disown(sock)
        lifecycle.orphans.append(self._context)
        copies = [*self._receivers, *self._greenlets, *self.scheduler.greenlets(),
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
        self.scheduler.start()
        self._receivers = [gevent.spawn(self._receive_jobs), gevent.spawn(self._receive_calls)]
        if self.parent_pid is not None:
            self._greenlets.append(gevent.spawn(self._watch_parent, self.parent_pid))
        where = f"behind the supervisor's {self.endpoint}" if self.backend else f"on {self.endpoint} (rpc on port +1)"
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
        if self.ready_file:
            temporary = f"{self.ready_file}.tmp{os.getpid()}"
            with open(temporary, "w") as handle:
                handle.write(f"{self.endpoint}\n")
            os.replace(temporary, self.ready_file)

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
            elif decoded[0].kind == "confirm":
                self._admissions.spawn(self._answer, self.runner.answer_confirm, envelope, *decoded)
            else:
                self._slots.spawn(self._answer, self.runner.answer_call, envelope, *decoded)

    def _decode(self, frames: list[bytes]) -> Any:
        if len(frames) != self._envelope + 1:
            self.runner.counters["malformed"] += 1
            return encode_error("", "ProtocolError", f"expected one body frame, got {len(frames) - self._envelope}")
        return self.runner.decode_rpc(frames[-1])

    def _note_identity(self, identity: bytes) -> None:
        if len(self.identities) < MAX_IDENTITIES or identity in self.identities:
            self.identities[identity] += 1

    def _answer(self, answer: Any, envelope: list[bytes], request: Any, task: Any) -> None:
        try:
            reply = answer(request, task)
        except gevent.GreenletExit:
            self._reply(envelope, encode_error(request.id, "WorkerShutdown", "the worker stopped before the task finished"))
            raise
        self._reply(envelope, reply)

    def _reply(self, envelope: list[bytes], reply: bytes) -> None:
        try:
            self.rpc.send_multipart([*envelope, reply], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a reply: client %r is not reading", envelope[-1])

    def shutdown(self, *, warm: bool = True) -> None:
        """Stop receiving, then finish (warm) or kill (cold) in-flight tasks, and close the sockets.

        A warm shutdown waits up to ``graceful_timeout`` seconds, and turns
        cold if another stop signal arrives meanwhile.
        """
        gevent.killall(self._receivers)
        self.scheduler.pause()
        if warm and len(self._slots):
            self._finish_in_flight()
        self._admissions.join(timeout=5.0)
        if len(self._slots):
            log.warning("cold shutdown: killing %d task(s) still running", len(self._slots))
            self._slots.kill(timeout=1.0)
        self.scheduler.stop()
        # Closing a TCP socket with unread input (a client's heartbeat, say)
        # makes the kernel send RST, and a client that had not yet read our
        # last reply loses it with the connection. Give the last replies (results,
        # or WorkerShutdown errors) a moment to be read first.
        gevent.sleep(REPLY_DRAIN)
        gevent.killall(self._greenlets)
        for sock in (self.jobs, self.rpc):
            if not self.backend:
                sock.disable_monitor()
            sock.close(linger=1000)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._context is not None:
            self._context.term()
        log.info("zqsync worker pid %d stopped", os.getpid())

    def _finish_in_flight(self) -> None:
        log.info("warm shutdown: waiting up to %.1f s for %d task(s)", self.graceful_timeout, len(self._slots))
        deadline = time.monotonic() + self.graceful_timeout
        signals_before = len(self._signals)
        while len(self._slots) and len(self._signals) == signals_before:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._slots.join(timeout=min(0.1, remaining))

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
            "clients": [client.stats() for client in all_clients()],
        }
