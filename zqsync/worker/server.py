"""Worker: jobs (ROUTER) on port N and rpc (ROUTER) on port N+1, tasks in a gevent pool.

Receiving a job waits for a free slot in the task pool (``gevent.pool.Pool``),
so a busy worker stops draining its jobs socket, the high-water mark fills,
and the clients' congestion control sees it.

How work reaches the worker is its *intake* (``intake.py``), chosen once: standalone, the worker
binds both sockets; as a child of a prefork supervisor (``supervisor.py``) it connects them to its
private backends and asks for work with credits (``dispatch.py``). The receive loops
(``receiving.py``) and the stop sequence (``shutdown.py``) do not know which.

Signals (gunicorn's arbiter model): `Worker.serve` installs handlers that only record the
signal; the main greenlet acts on it (``shutdown.py``). `Worker.run` serves without them, in
any thread with a hub of its own, until `Worker.stop` (``zqsync.testing``'s in-process worker).
"""

from __future__ import annotations

import os
import signal
import time
import weakref
from functools import partial
from typing import Any

import gevent
import zmq
import zmq.green

from .. import _common, fdlimit
from .core import log
from .receiving import Receiving
from .shutdown import Shutdown
from .watchdog import KILLED_EXIT, original_signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
COLD_SIGNALS = (signal.SIGQUIT,)
#: Seconds between two looks of the main greenlet for a recorded stop signal.
SIGNAL_POLL = 0.05


def _after_fork(worker: "weakref.ReferenceType[Worker]") -> None:
    alive = worker()
    if alive is not None:
        alive._after_fork_in_child()


class Worker(Receiving, Shutdown):
    """A zqsync worker serving one registry.

    :param registry: the tasks to run.
    :param settings: a `WorkerSettings` (bind endpoint,
        concurrency, graceful timeout, HWM, journal, CURVE, ...); default: its defaults.
    :param ready_file: a path where the bound base endpoint is written once
        the worker is listening (for supervisors and tests).
    :param parent_pid: if given, shut down (warm) once this process is no
        longer the worker's parent, i.e. when whoever started it died without
        stopping it. Checked every second.
    :param backend: ``(jobs, rpc)`` endpoints to *connect* to instead of
        binding (set by the prefork supervisor): the worker's intake is then a
        `SupervisedIntake`; a
        `DirectBackend` (a direct-mode supervisor's child): a
        `DirectIntake`; else a `StandaloneIntake`.
    :param overrides: `WorkerSettings` fields that
        replace those of ``settings`` (``Worker(registry, concurrency=4)``).
    :raises ConfigurationError: an unknown or invalid setting, naming it.

    Must run in a process with a gevent hub; ``zqsync worker`` monkey-patches
    first, as gunicorn's gevent worker does.
    """

    # -- sockets -----------------------------------------------------------

    def bind(self) -> str:
        """Make both sockets and let the intake bind or connect them; returns the worker's endpoint.

        :raises ConfigurationError: malformed bind endpoint.
        :raises ConfigurationError: the address is in use or not this machine's.
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
                                            curve_secret_key=self.curve_secret_key, keepalive=self.settings.keepalive))
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
                  *self._waiting.greenlets, *self._admin.greenlets, *self._long_polls.greenlets, *self._stolen_starter,
                  *(greenlet for queue in self.queues for greenlet in queue.pool.greenlets)]
        for greenlet in copies:
            if greenlet is not current and not greenlet.dead:
                greenlet.kill(block=False)

    # -- serving -----------------------------------------------------------

    def serve(self) -> int:
        """Bind (if not yet bound), serve until a stop signal, shut down; returns the exit status:
        0, or `KILLED_EXIT` if the stop killed tasks.

        Blocks the calling greenlet. Installs SIGTERM, SIGINT and SIGQUIT handlers (Python-level,
        in the main thread: call it there), and starts the watchdog (``watchdog.py``).
        """
        for signum in STOP_SIGNALS:
            original_signal(signum, self._on_signal)
        self.watchdog.start()
        return self.run()

    def run(self) -> int:
        """Bind (if not yet bound), serve until `stop` (or a stop signal `serve` handles),
        shut down; returns the exit status as `serve` does.

        Blocks the calling greenlet; runs in any thread with a gevent hub of its own (the in-process
        worker of ``zqsync.testing``). By itself it installs no signal handler and starts no watchdog
        thread: time limits then hold for tasks that yield (``gevent.Timeout``), not for those that block the hub.
        """
        if self.endpoint is None:
            self.bind()
        self.scheduler.start()
        self._run_plain = self.intake.count_plain(self.scheduler.run_plain)
        stolen = self.intake.stolen
        sockets = [self.jobs, self.rpc] + ([stolen] if stolen is not None else [])
        self._readers = tuple(self.intake.reader(sock) for sock in sockets)
        self._receivers = [gevent.spawn(self._receive_jobs), gevent.spawn(self._receive_calls)]
        self._admitter = gevent.spawn(self._admit_held)
        self._greenlets.append(self._admitter)
        self._queue_receivers = [gevent.spawn(queue.receive, self.scheduler.run_plain) for queue in self.queues]
        self._receivers += self._queue_receivers
        if stolen is not None:
            self._receivers.append(gevent.spawn(self._receive_stolen))
            self._stolen_starter.append(gevent.spawn(self._start_stolen))
        for queue in self.queues:
            log.info("queue %r on %s, concurrency %d", queue.name, queue.endpoint, queue.concurrency)
        self.intake.start(self._slots, self._admissions)
        self._greenlets.append(gevent.spawn(self._look_at_fds))
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

    def _look_at_fds(self) -> None:
        where = f"zqsync worker pid {os.getpid()}"
        while True:
            gevent.sleep(fdlimit.CHECK_INTERVAL)
            if fdlimit.look(where):
                self.runner.counters["fd_exhausted"] += 1

    def _watch_parent(self, parent_pid: int) -> None:
        while os.getppid() == parent_pid:
            gevent.sleep(1.0)
        log.warning("parent process %d is gone: shutting down", parent_pid)
        self._on_signal(signal.SIGTERM)

    def _write_ready_file(self) -> None:
        if self.ready_file and self.endpoint:
            _common.write_ready_file(self.ready_file, self.endpoint)
