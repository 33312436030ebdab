"""Worker: binds jobs (PULL) on port N and rpc (ROUTER) on port N+1, runs tasks in a gevent pool.

Receiving waits for a free slot in the task pool (``gevent.pool.Pool``), so a
busy worker stops draining its sockets, the high-water marks fill, and the
clients' congestion control sees it.

Shutdown (gunicorn's arbiter model): signal handlers only record the signal;
the main greenlet acts on it. The first TERM/INT is warm: stop receiving,
let in-flight tasks finish within ``graceful_timeout``, exit. A second
TERM/INT, or the end of the grace period, is cold: in-flight tasks are killed.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import signal
import time
from typing import Any, Optional

import gevent
import gevent.event
import gevent.pool
import zmq
import zmq.green
import zmq.utils.monitor

from .. import settings
from ..client import parse_endpoint
from ..errors import ConfigurationError
from ..protocol import MAX_MESSAGE_SIZE, encode_error
from .registry import Registry
from .runner import Runner

log = logging.getLogger(__name__)

#: Distinct client identities remembered for ``zqsync.stats``.
MAX_IDENTITIES = 10_000


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
        self.endpoint: Optional[str] = None
        self.runner = Runner(registry, builtins={"zqsync.stats": self.stats, "zqsync.ping": lambda: "pong"})
        self.identities: collections.Counter[bytes] = collections.Counter()
        self.started_at = time.time()
        self._slots = gevent.pool.Pool(concurrency)
        self._signals: list[int] = []
        self._wakeup = gevent.event.Event()
        self._receivers: list[gevent.Greenlet] = []
        self._context: Optional[zmq.Context] = None
        self.connections: dict[str, int] = {}

    # -- binding -----------------------------------------------------------

    def bind(self) -> str:
        """Bind both sockets; returns the base endpoint actually bound.

        :raises ConfigurationError: malformed bind endpoint.
        :raises zmq.ZMQError: the address is in use or unavailable.
        """
        host, port = parse_endpoint(self.bind_address, allow_zero=True)
        context = self._context = zmq.green.Context()
        self.jobs = context.socket(zmq.PULL)
        self.rpc = context.socket(zmq.ROUTER)
        for sock in (self.jobs, self.rpc):
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.RCVHWM, self.hwm)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_size)
        if port == 0:
            port = self._bind_free_pair(host)
        else:
            self.jobs.bind(f"{host}:{port}")
            self.rpc.bind(f"{host}:{port + 1}")
        self.endpoint = f"{host}:{port}"
        self._monitors = [self._watch_connections(self.jobs, "jobs"), self._watch_connections(self.rpc, "rpc")]
        return self.endpoint

    def _watch_connections(self, sock: zmq.Socket, name: str) -> gevent.Greenlet:
        """Count TCP connections accepted per socket: the peer-side view of client socket reuse."""
        monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED)
        key = f"connections_{name}"
        self.connections[key] = 0

        def watch() -> None:
            try:
                while True:
                    zmq.utils.monitor.recv_monitor_message(monitor)
                    self.connections[key] += 1
            finally:
                monitor.close(linger=0)

        return gevent.spawn(watch)

    def _bind_free_pair(self, host: str) -> int:
        for _ in range(100):
            port = self.jobs.bind_to_random_port(host, min_port=20000, max_port=60000)
            try:
                self.rpc.bind(f"{host}:{port + 1}")
                return port
            except zmq.ZMQError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                self.jobs.unbind(self.jobs.getsockopt_string(zmq.LAST_ENDPOINT))
        raise ConfigurationError(f"found no free port pair on {host}", setting="bind")

    # -- serving -----------------------------------------------------------

    def serve(self) -> int:
        """Bind (if not yet bound), serve until TERM/INT, shut down; returns the exit status 0.

        Blocks the calling greenlet. Installs SIGTERM and SIGINT handlers.
        """
        if self.endpoint is None:
            self.bind()
        for signum in (signal.SIGTERM, signal.SIGINT):
            gevent.signal_handler(signum, self._on_signal, signum)
        self._receivers = [gevent.spawn(self._receive_jobs), gevent.spawn(self._receive_calls)]
        if self.parent_pid is not None:
            self._receivers.append(gevent.spawn(self._watch_parent, self.parent_pid))
        log.info(
            "zqsync worker pid %d serving %d task(s) on %s (jobs) and rpc port +1, concurrency %d",
            os.getpid(), len(self.registry), self.endpoint, self.concurrency,
        )
        self._write_ready_file()
        self._wakeup.wait()
        warm = len(self._signals) < 2
        self.shutdown(warm=warm)
        return 0

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
            self._slots.spawn(self.runner.handle_job, frame)

    def _receive_calls(self) -> None:
        while True:
            self._slots.wait_available()
            frames = self.rpc.recv_multipart()
            self._slots.spawn(self._answer, frames)

    def _answer(self, frames: list[bytes]) -> None:
        identity = frames[0]
        if len(self.identities) < MAX_IDENTITIES or identity in self.identities:
            self.identities[identity] += 1
        if len(frames) != 2:
            self.runner.counters["malformed"] += 1
            reply = encode_error("", "ProtocolError", f"expected one body frame, got {len(frames) - 1}")
        else:
            try:
                reply = self.runner.handle_call(frames[1])
            except gevent.GreenletExit:
                self._reply(identity, encode_error("", "WorkerShutdown", "the worker stopped before the task finished"))
                raise
        self._reply(identity, reply)

    def _reply(self, identity: bytes, reply: bytes) -> None:
        try:
            self.rpc.send_multipart([identity, reply], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a reply: client %r is not reading", identity)

    def shutdown(self, *, warm: bool = True) -> None:
        """Stop receiving, then finish (warm) or kill (cold) in-flight tasks, and close the sockets.

        A warm shutdown waits up to ``graceful_timeout`` seconds, and turns
        cold if another TERM/INT arrives meanwhile.
        """
        gevent.killall(self._receivers)
        if warm and len(self._slots):
            log.info("warm shutdown: waiting up to %.1f s for %d task(s)", self.graceful_timeout, len(self._slots))
            deadline = time.monotonic() + self.graceful_timeout
            signals_before = len(self._signals)
            while len(self._slots) and len(self._signals) == signals_before:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._slots.join(timeout=min(0.1, remaining))
        if len(self._slots):
            log.warning("cold shutdown: killing %d task(s) still running", len(self._slots))
            self._slots.kill(timeout=1.0)
        gevent.killall(self._monitors)
        for sock in (self.jobs, self.rpc):
            sock.disable_monitor()
            sock.close(linger=1000)
        if self._context is not None:
            self._context.term()
        log.info("zqsync worker pid %d stopped", os.getpid())

    # -- introspection -----------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for ``zqsync.stats`` calls.

        :returns: the runner's counters (``jobs_received``, ``jobs_succeeded``,
            ``jobs_failed``, ``calls_received``, ``calls_succeeded``,
            ``calls_failed``, ``timed_out``, ``unknown_task``, ``malformed``,
            ``in_flight``),
            ``pid``, ``uptime`` (seconds), ``tasks`` (names) and
            ``identities_by_pid``: ``{client pid: distinct socket identities
            seen on rpc}``, ``identities`` (distinct rpc identities, as str),
            and ``connections_jobs`` / ``connections_rpc``: TCP connections
            accepted on each socket since start.
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
        }
