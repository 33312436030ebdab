"""Prefork supervisor: N worker children behind one public address (gunicorn's arbiter, for zqsync).

Two modes. *Direct* (``direct=True``; ``zqsync worker --processes N``, the CLI's default): no router; the
supervisor opens listening sockets that its children bind and serve as standalone workers do
(``listeners.py``, ``direct.py``). *Router* (``zqsync worker --processes N --router``), which most of
what follows describes: the supervisor binds the public jobs (ROUTER: clients send on DEALERs) and rpc
(ROUTER) sockets, and a router thread (``dispatch.py``) gives each call and job to a child that
offered a free slot, over that child's private ``ipc://`` backends (a PUSH
to its PULL, a DEALER to its ROUTER that carries the replies back). A child
whose hub is blocked, or whose slots are full, gets nothing while a sibling
is free.

The supervisor itself never imports gevent or the task module. Each child is
forked, monkey-patches, imports the task module, and serves; so every child
builds its own sockets and client pools.

* Signal handlers only record signals; the main loop acts on them.
* TERM/INT: warm shutdown. The router tells the clients of the public jobs
  socket that it stops, as a standalone worker does (``stopping.py``), and
  reads what they still send into memory, credit or not, until they fall
  quiet; then it unbinds the public jobs endpoint (clients that list other
  workers send there) and reads the jobs still queued in it. It routes them
  to the children within ``graceful_timeout``, counts the rest as discarded,
  and sends each child its end-of-jobs mark; then
  the children stop as standalone workers do (``server.py``): each reads
  its backend queue up to that mark, runs it and finishes in-flight tasks within
  ``graceful_timeout``, or counts and logs what it discards. A second TERM/INT, or QUIT: cold; the
  children are told to kill their tasks. A child kills a task that blocks its hub itself
  (``server.py``, ``watchdog.py``); stragglers are SIGKILLed ``graceful_timeout`` + 5 s after the
  first signal. The supervisor exits with status 1 if a child exited non-zero during the
  stop (it killed tasks) or had to be SIGKILLed.
* HUP: a rolling restart behind public sockets that stay bound. For each old
  child in turn: start its replacement and wait until it is ready; route
  nothing more to the old child, and send it its end-of-jobs mark; warm-stop
  it: it reads its backend queue up to the mark, disconnects and writes
  ``<ready file>.drained`` (how many jobs it read). So every job routed to the
  old child reaches it (and runs, or is counted as discarded in its log).
* Whenever a child exits, the jobs routed to it that it did not read are
  counted and logged (``exited holding N plain job(s)``; ``zqsync.stats``:
  ``supervisor.jobs_lost_in_children``). For a SIGKILLed child that is what
  it had not said it read: the jobs in the router's pipe, the kernel's
  buffers and its own receive queue, plus at most ``CREDITS_MAX`` that it
  started in the instant before the kill.
  Nothing is paused: the siblings keep taking work, and the old child
  answers its in-flight calls.
* A child that dies after it booted is restarted, with exponential backoff
  for repeated crashes. A child that dies before it finished booting (say,
  an import error) at the supervisor's first start halts the supervisor with
  a clear message instead of looping, like gunicorn's boot-error exit; a
  replacement that fails to boot later (a file caught mid-deploy) is logged
  and restarted with backoff while its siblings keep serving.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from functools import partial
from typing import Any, Callable, Optional, Union

import zmq

from .. import _common, fdlimit, settings
from ..errors import ConfigurationError
from .auth import curve_state, start_thread_authenticator
from .binding import KEEPALIVE, bind_pair
from .dispatch import Dispatcher
from .fleet import remove_admin_socket, write_supervisor_file
from .listeners import DirectBackend, Listeners
from .seats import Seats
from .stopping import DRAIN_LIMIT, READ_FIRST

log = logging.getLogger(__name__)

#: Exit status when a child fails to boot (gunicorn uses 3 too).
BOOT_ERROR = 3
#: Seconds a child must stay up for its restart backoff to reset.
STABLE_AFTER = 30.0
MAX_BACKOFF = 30.0


#: Most seconds a rolling restart waits for an old child to drain its backend queue.
DRAIN_TIMEOUT = 10.0


#: What a child binds or connects to: a router's ``(jobs, rpc)`` pair, or a direct child's listening sockets.
Backend = Union[tuple[str, str], DirectBackend]


class _Child:
    __slots__ = ("slot", "pid", "started", "ready_file", "backend", "booted", "retiring")
    backend: Backend

    def __init__(self, slot: int, pid: int, ready_file: str, backend: Backend) -> None:
        self.slot, self.pid, self.ready_file, self.backend = slot, pid, ready_file, backend
        self.started = time.monotonic()
        self.booted = False
        self.retiring = False


class Supervisor:
    """Runs ``processes`` worker children behind ``bind``.

    :param serve_child: called in each forked child with ``(slot, backend,
        ready_file, parent_pid)``; it must serve and return an exit status.
        ``backend`` is the ``(jobs, rpc)`` pair of endpoints to connect to, or with ``direct`` the
        `DirectBackend` to bind (``Worker(backend=...)`` takes either).
    :param bind: public base endpoint ``tcp://HOST:PORT`` (PORT 0: a free pair).
    :param processes: number of children, at least 1.
    :param graceful_timeout: seconds a warm shutdown waits before going cold.
    :param ready_file: written with the public endpoint once every child is ready.
    :param boot_timeout: seconds a child may take to become ready.
    :param parent_pid: if given, shut down (warm) once this process is no
        longer the supervisor's parent.
    :param on_child_exit: called with the pid of every child that exited.
    :param curve_secret_key: make the public sockets CURVE servers (see ``auth.py``).
    :param allow_client_keys: directory of allowed client public keys.
    :param keepalive: ``(idle, interval)`` seconds of the public sockets' TCP keepalive (``binding.py``).
    :param direct: no router: the supervisor holds listening sockets that its children bind (the public
        pair, and a pair per slot on the ports after it: ``listeners.py``), and each child serves its
        clients as a standalone worker does (``direct.py``); CURVE is then the children's
        (``serve_child`` keeps the keys). ``docs/design.md`` says which promises of the router it does not keep.
    :raises ConfigurationError: ``processes`` below 1.
    """

    def __init__(
        self,
        serve_child: Callable[[int, Backend, str, int], int],
        *,
        bind: str = settings.BIND,
        processes: int = 2,
        graceful_timeout: float = settings.GRACEFUL_TIMEOUT,
        ready_file: Optional[str] = None,
        boot_timeout: float = 60.0,
        parent_pid: Optional[int] = None,
        on_child_exit: Optional[Callable[[int], None]] = None,
        curve_secret_key: Optional[str] = None,
        allow_client_keys: Optional[str] = None,
        keepalive: tuple[float, float] = KEEPALIVE,
        direct: bool = False,
    ) -> None:
        if processes < 1:
            raise ConfigurationError(f"processes must be >= 1, got {processes}", setting="processes")
        self.serve_child = serve_child
        self.bind_address = bind
        self.processes = processes
        self.graceful_timeout = graceful_timeout
        self.ready_file = ready_file
        self.boot_timeout = boot_timeout
        self.parent_pid = parent_pid
        self.on_child_exit = on_child_exit
        self.curve_secret_key, self.allow_client_keys = curve_secret_key, allow_client_keys
        self.keepalive = keepalive
        self.direct = direct
        self._listeners: Optional[Listeners] = None
        self._seats: Optional[Seats] = None  # direct: every live child's row (seats.py)
        self._jobs_lost = 0  # direct: plain jobs held by children that died (Seats.held)
        self._authenticator: Any = None
        self.endpoint = ""
        self.children: dict[int, _Child] = {}
        self.restarts = 0
        self._signals: list[int] = []
        self._failures = [0] * processes
        self._restart_at: dict[int, float] = {}
        self._booted_slots: set[int] = set()  # slots whose child booted at least once
        self._dir = tempfile.mkdtemp(prefix="zqsync-supervisor-")
        self._context: Optional[zmq.Context] = None
        self._dispatch: Optional[Dispatcher] = None
        self._fds_exhausted = 0  # looks that found this process out of descriptors (_look_at_fds)
        self._fds_written = 0  # self._fds_exhausted as last written to the supervisor file
        self._fds_looked = time.monotonic()
        self._reloads = 0
        self._spawned = 0
        self._unclean_stops = 0  # children that exited non-zero during the stop, or were SIGKILLed
        self._started = time.time()

    # -- dispatch ----------------------------------------------------------

    def _start_dispatch(self) -> None:
        context = self._context = zmq.Context()
        jobs_front, rpc_front = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
        if self.allow_client_keys:
            self._authenticator = start_thread_authenticator(context, self.allow_client_keys)
        self.endpoint = bind_pair(jobs_front, rpc_front, self.bind_address, curve_secret_key=self.curve_secret_key,
                                  keepalive=self.keepalive)
        self._jobs_endpoint = jobs_front.getsockopt_string(zmq.LAST_ENDPOINT)
        for sock in (jobs_front, rpc_front):
            sock.setsockopt(zmq.LINGER, 1000)
        self._dispatch = Dispatcher(context, self._dir, jobs_front, rpc_front)
        self._dispatch.start()

    def _start_listeners(self) -> None:
        """Direct mode: open the listening sockets the children bind (``listeners.py``)."""
        self._listeners = Listeners(self.bind_address, self.processes)
        self.endpoint = self._listeners.endpoint
        self._seats = Seats(2 * self.processes + 1)  # a HUP runs an old and a new child per slot, one slot at a time

    def _backend(self, slot: int) -> Backend:
        """A new child's backend: its slot's listening sockets (direct), or a new pair at the router."""
        if self._listeners is not None:
            assert self._seats is not None
            return self._listeners.backend(slot, self._dir, self._seats, self._seats.claim())
        assert self._dispatch is not None
        return self._dispatch.call(self._dispatch.add_child, str(self._spawned))

    def _stop_dispatch(self) -> None:
        if self._listeners is not None:
            self._listeners.close()
        if self._dispatch is not None:
            self._dispatch.stop()
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._context is not None:
            self._context.destroy(linger=1000)

    # -- children ------------------------------------------------------------

    def _spawn(self, slot: int) -> _Child:
        self._spawned += 1
        backend = self._backend(slot)
        ready_file = os.path.join(self._dir, f"ready-{slot}-{self._spawned}")
        parent = os.getpid()
        _common.catch_sigchld_before_fork()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                status = self.serve_child(slot, backend, ready_file, parent)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 1
                if not isinstance(exc.code, int) and exc.code:
                    print(exc.code, file=sys.stderr)
            except BaseException:
                log.exception("worker child %d crashed", slot)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        child = self.children[pid] = _Child(slot, pid, ready_file, backend)
        log.info("started worker child %d (pid %d)", slot, pid)
        self._write_supervisor_file()
        return child

    def _write_supervisor_file(self) -> None:
        """Write what the children put in ``zqsync.stats``; out of descriptors, it tries again at the next
        look (``_look_at_fds``)."""
        lost = self._dispatch.jobs_lost if self._dispatch is not None else self._jobs_lost
        exhausted = self._fds_exhausted
        try:
            write_supervisor_file(self._dir, {
                "pid": os.getpid(), "started": self._started, "processes": self.processes, "restarts": self.restarts,
                "jobs_lost_in_children": lost, "fd_exhausted": exhausted, "nofile": fdlimit.limits()})
        except OSError as exc:
            if exc.errno not in fdlimit.FD_ERRNOS:
                raise
            return
        self._fds_written = exhausted

    def _look_at_fds(self) -> None:
        """Once every ``fdlimit.CHECK_INTERVAL`` seconds: is this process out of descriptors (it holds every
        client connection)? The count reaches the children's stats once the file can be written again."""
        now = time.monotonic()
        if now - self._fds_looked < fdlimit.CHECK_INTERVAL:
            return
        self._fds_looked = now
        if fdlimit.look(f"zqsync supervisor pid {os.getpid()}"):
            self._fds_exhausted += 1
        if self._fds_exhausted != self._fds_written:
            self._write_supervisor_file()

    def _reap(self) -> Optional[int]:
        """Collect exited children; restart or halt. Returns an exit status to halt with, or ``None``."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            child = self.children.pop(pid, None)
            if child is None:
                continue
            remove_admin_socket(self._dir, pid)
            self._forget(child)
            if self.on_child_exit is not None:
                self.on_child_exit(pid)
            code = os.waitstatus_to_exitcode(status)
            if child.retiring:
                log.info("worker child %d (pid %d) retired with status %s", child.slot, pid, code)
                continue
            if not child.booted and not os.path.exists(child.ready_file):
                if child.slot not in self._booted_slots:
                    log.error("worker child %d (pid %d) exited with status %s before it finished booting; "
                              "halting instead of restarting it: fix the error above", child.slot, pid, code)
                    return BOOT_ERROR
                log.error("replacement worker child %d (pid %d) exited with status %s before it finished "
                          "booting; its siblings keep serving", child.slot, pid, code)
            self._schedule_restart(child, code)

    def _forget(self, child: _Child) -> None:
        """Close an exited child's backends; count and log the plain jobs routed to it that it never
        read (or, killed, never said it started): they are lost with it (``dispatch.py``). Direct: free its
        seat, and count and log the plain jobs it had read and not run, unless its stop did (``seats.py``)."""
        if isinstance(child.backend, DirectBackend):
            held = child.backend.seats.release(child.backend.seat)
            if held:
                self._jobs_lost += held
                log.warning("worker child %d (pid %d) exited holding %d plain job(s) it had read and not run: "
                            "lost (%d lost with children so far)", child.slot, child.pid, held, self._jobs_lost)
                self._write_supervisor_file()
            return
        if self._dispatch is None or not self._dispatch.alive:
            return
        lost = self._dispatch.call(self._dispatch.remove_child, _routed(child), _jobs_read(child))
        if lost:
            log.warning("worker child %d (pid %d) exited holding %d plain job(s) it had not started: lost "
                        "(%d lost with children so far)", child.slot, child.pid, lost, self._dispatch.jobs_lost)
        self._write_supervisor_file()

    def _schedule_restart(self, child: _Child, code: int) -> None:
        if time.monotonic() - child.started >= STABLE_AFTER:
            self._failures[child.slot] = 0
        self._failures[child.slot] += 1
        delay = min(MAX_BACKOFF, 0.1 * 2 ** (self._failures[child.slot] - 1))
        log.warning("worker child %d (pid %d) exited with status %s; restarting in %.1f s",
                    child.slot, child.pid, code, delay)
        self._restart_at[child.slot] = time.monotonic() + delay

    def _check_boot(self) -> Optional[int]:
        for child in self.children.values():
            if child.booted:
                continue
            if os.path.exists(child.ready_file):
                child.booted = True
                self._booted_slots.add(child.slot)
            elif time.monotonic() - child.started > self.boot_timeout and child.slot in self._booted_slots:
                log.error("replacement worker child %d (pid %d) did not become ready within %.0f s; killing it",
                          child.slot, child.pid, self.boot_timeout)
                os.kill(child.pid, signal.SIGKILL)  # reaped and restarted with backoff
                child.started = time.monotonic()
            elif time.monotonic() - child.started > self.boot_timeout:
                log.error("worker child %d (pid %d) did not become ready within %.0f s; halting",
                          child.slot, child.pid, self.boot_timeout)
                return BOOT_ERROR
        return None

    # -- main loop -----------------------------------------------------------

    def run(self) -> int:
        """Bind, start the children, supervise until told to stop; returns the exit status.

        Blocks. Installs handlers for TERM, INT and QUIT.
        """
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)
        try:
            self._start_listeners() if self.direct else self._start_dispatch()
            for slot in range(self.processes):
                self._spawn(slot)
            log.info("zqsync supervisor pid %d: %d worker children behind %s, %s", os.getpid(), self.processes,
                     self.endpoint, "direct (each child binds its slot's ports after them)" if self.direct
                     else curve_state(self._authenticator))
            status = self._loop()
            self._stop_children()
            self._kill_children()
            return status or (1 if self._unclean_stops else 0)
        finally:
            self._kill_children()
            self._stop_dispatch()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)  # only record; the main loop acts

    def _on_hup(self, signum: int, frame: Any) -> None:
        self._reloads += 1

    def _reload(self) -> Optional[int]:
        """Replace every child, one at a time (see the module docstring). Returns an exit status
        to halt with, or ``None``. Gives up early when a stop signal arrives."""
        old = [child for child in self.children.values() if not child.retiring]
        log.info("HUP: replacing %d worker children one at a time", len(old))
        for child in old:
            if child.pid not in self.children:  # it exited meanwhile, and is being restarted
                continue
            fresh = self._spawn(child.slot)
            halt = self._wait(partial(getattr, fresh, "booted"), self.boot_timeout)
            if halt is not None or not fresh.booted:
                return halt
            self._retire(child)
        log.info("HUP: replaced %d worker children", len(old))
        return None

    def _retire(self, child: _Child) -> None:
        """Route no more work to ``child``, then warm-stop it; waits until it has drained its backend queue
        (direct: until it has unbound its sockets)."""
        child.retiring = True
        if self._dispatch is not None:
            self._dispatch.call(self._dispatch.close_child, _routed(child))
        else:  # direct: its notice must not send clients away from the addresses its replacement serves
            with open(f"{child.ready_file}.retiring", "w"):
                pass
        try:
            os.kill(child.pid, signal.SIGTERM)
            drained = f"{child.ready_file}.drained"
            self._wait(lambda: os.path.exists(drained) or child.pid not in self.children, DRAIN_TIMEOUT)
            if not os.path.exists(drained):
                log.warning("worker child %d (pid %d) did not report its queue drained within %.0f s",
                            child.slot, child.pid, DRAIN_TIMEOUT)
        except ProcessLookupError:
            pass

    def _wait(self, done: Callable[[], bool], timeout: float) -> Optional[int]:
        """Supervise (reap, check boots) until ``done()``, a stop signal, or ``timeout`` seconds.

        Returns an exit status to halt with, or ``None``.
        """
        deadline = time.monotonic() + timeout
        while not done() and not self._signals and time.monotonic() < deadline:
            halt = self._reap() or self._check_boot()
            if halt is not None:
                return halt
            time.sleep(0.02)
        return None

    def _loop(self) -> int:
        announced = False
        while not self._signals:
            if self._reloads:
                self._reloads = 0
                halt = self._reload()
                if halt is not None:
                    return halt
            halt = self._reap() or self._check_boot()
            if halt is not None:
                return halt
            if self._dispatch is not None and not self._dispatch.alive:
                log.error("the router thread died (see above): halting")
                return 1
            now = time.monotonic()
            for slot, when in list(self._restart_at.items()):
                if when <= now:
                    del self._restart_at[slot]
                    self.restarts += 1
                    self._spawn(slot)
            self._look_at_fds()
            if not announced and len(self.children) >= self.processes and all(c.booted for c in self.children.values()):
                announced = True
                self._write_ready_file()
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                log.warning("parent process %d is gone: shutting down", self.parent_pid)
                self._signals.append(signal.SIGTERM)
            time.sleep(0.05)
        return 0

    def _write_ready_file(self) -> None:
        if self.ready_file:
            _common.write_ready_file(self.ready_file, self.endpoint)

    def _stop_taking_jobs(self, cold: bool) -> None:
        """Read what is in flight on the public jobs socket until quiet (at most ``READ_FIRST`` seconds),
        tell the clients of the public jobs socket that this worker stops, and read what they still
        send until they fall quiet (at most ``DRAIN_LIMIT`` seconds: they send to their other workers,
        ``stopping.py``); unbind the public jobs endpoint and read the jobs queued in it (as long again);
        route what was read to the children. Then send them no more jobs (``END_OF_JOBS``) and count
        what is left as discarded: all of it when cold, or what was not routed within
        ``graceful_timeout`` of the signal."""
        dispatch = self._dispatch
        assert dispatch is not None
        deadline, seen = time.monotonic() + self.graceful_timeout, len(self._signals)
        dispatch.call(dispatch.read_all_jobs)
        self._wait_routing(dispatch.jobs_drained, time.monotonic() + READ_FIRST, cold, seen)
        log.info("stopping: told %d job client(s) of %s", dispatch.call(dispatch.notify_stopping), self._jobs_endpoint)
        self._wait_routing(dispatch.jobs_drained, time.monotonic() + DRAIN_LIMIT, cold, seen)
        dispatch.call(dispatch.stop_jobs, self._jobs_endpoint)
        self._wait_routing(dispatch.jobs_drained, time.monotonic() + DRAIN_LIMIT, cold, seen)
        self._wait_routing(dispatch.jobs_routed, deadline, cold, seen)
        discarded = dispatch.call(dispatch.end_jobs)
        log.info("stopped taking jobs on %s; the children took the queued ones", self._jobs_endpoint)
        if discarded:
            log.warning("discarded %d queued plain jobs on shutdown (in the supervisor's queue)", discarded)

    def _wait_routing(self, done: Callable[[], bool], deadline: float, cold: bool, seen: int) -> None:
        """Wait until ``done()`` (run in the router's thread), or ``deadline``, or cold (or a stop signal
        after the first ``seen``)."""
        assert self._dispatch is not None
        while not (cold or len(self._signals) > seen) and time.monotonic() < deadline:
            if self._dispatch.call(done):
                return
            time.sleep(0.02)

    def _stop_children(self) -> None:
        cold = signal.SIGQUIT in self._signals
        if self._dispatch is not None:
            self._stop_taking_jobs(cold)
        self._signal_children(signal.SIGQUIT if cold else signal.SIGTERM)  # direct: each stops as a standalone worker
        if self._dispatch is not None:
            self._dispatch.call(self._dispatch.refuse_calls)
        log.info("%s shutdown of %d worker children", "cold" if cold else "warm", len(self.children))
        deadline = time.monotonic() + self.graceful_timeout + 5.0
        seen = len(self._signals)
        while self.children and time.monotonic() < deadline:
            if len(self._signals) > seen and not cold:
                cold = True
                log.info("second signal: cold shutdown")
                self._signal_children(signal.SIGQUIT)
            self._reap_quietly()
            time.sleep(0.05)

    def _signal_children(self, signum: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _reap_quietly(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self._unclean_stops += status != 0
                self._forget(child)

    def _kill_children(self) -> None:
        if self.children:
            log.warning("killing %d worker children that did not stop", len(self.children))
            self._unclean_stops += len(self.children)
        self._signal_children(signal.SIGKILL)
        for pid, child in list(self.children.items()):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self._forget(child)
        self.children.clear()


def _routed(child: _Child) -> str:
    """The name of a child at the router (its jobs backend)."""
    assert isinstance(child.backend, tuple)
    return child.backend[0]


def _jobs_read(child: _Child) -> Optional[int]:
    """How many jobs an exited child read from its backend, as it wrote when it stopped; ``None`` if it did not."""
    try:
        with open(f"{child.ready_file}.drained") as drained:
            return int(drained.read())
    except (OSError, ValueError):
        return None
