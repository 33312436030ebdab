"""Prefork supervisor: N worker children behind one public address (gunicorn's arbiter, for zqsync).

The supervisor binds the public jobs (PULL) and rpc (ROUTER) sockets and runs
pyzmq's own proxy device (``zmq.proxy_steerable``, in C, one native thread per
proxy) to private ``ipc://`` backends: a PUSH that spreads jobs over the
children's PULL sockets, and a DEALER that spreads calls over their ROUTER
sockets and carries replies back. There is no Python broker loop.

The supervisor itself never imports gevent or the task module. Each child is
forked, monkey-patches, imports the task module, and serves; so every child
builds its own sockets and client pools.

* Signal handlers only record signals; the main loop acts on them.
* TERM/INT: warm shutdown. The jobs proxy is halted and the public jobs
  endpoint unbound (clients that list other workers send there); the jobs
  already queued in the public socket are handed to the children; then
  the children stop as standalone workers do (``server.py``): each reads
  its backend queue to the end, runs it and finishes in-flight tasks within
  ``graceful_timeout``, or counts and logs what it discards. A second TERM/INT, or QUIT: cold; the
  children are told to kill their tasks. Stragglers are SIGKILLed.
* HUP: a rolling restart behind public sockets that stay bound. For each old
  child in turn: start its replacement and wait until it is ready; stop the
  jobs proxy (TERMINATE, and join its thread: nothing is forwarded after
  that, and jobs wait in the public socket's queue); warm-stop the old child,
  which reads its backend queue until it is quiet, disconnects and writes
  ``<ready file>.drained``; then start the jobs proxy again. So every job the
  proxy handed to the old child reaches it (and runs, or is counted as
  discarded in its log). The jobs proxy is off for the drain, about 0.2 s
  per child. Calls are not paused: the old child answers its in-flight calls
  and refuses (``WorkerStopping``) the few that reach it before it closes.
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
import threading
import time
from functools import partial
from typing import Any, Callable, Optional

import zmq

from .. import _common, settings
from ..errors import ConfigurationError
from .auth import curve_state, start_thread_authenticator
from .binding import bind_pair

log = logging.getLogger(__name__)

#: Exit status when a child fails to boot (gunicorn uses 3 too).
BOOT_ERROR = 3
#: Seconds a child must stay up for its restart backoff to reset.
STABLE_AFTER = 30.0
MAX_BACKOFF = 30.0


#: Most seconds a rolling restart waits for an old child to drain its backend queue.
DRAIN_TIMEOUT = 10.0
#: Seconds without a message after which the public jobs queue counts as drained.
DRAIN_QUIET = 0.2


class _Child:
    __slots__ = ("slot", "pid", "started", "ready_file", "booted", "retiring")

    def __init__(self, slot: int, pid: int, ready_file: str) -> None:
        self.slot, self.pid, self.ready_file = slot, pid, ready_file
        self.started = time.monotonic()
        self.booted = False
        self.retiring = False


class Supervisor:
    """Runs ``processes`` worker children behind ``bind``.

    :param serve_child: called in each forked child with ``(slot, backend,
        ready_file, parent_pid)``; it must serve and return an exit status.
        ``backend`` is the ``(jobs, rpc)`` pair of endpoints to connect to.
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
    """

    def __init__(
        self,
        serve_child: Callable[[int, tuple[str, str], str, int], int],
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
        self._sockets: dict[str, tuple[zmq.Socket, zmq.Socket]] = {}
        self._proxies: dict[str, tuple[zmq.Socket, threading.Thread]] = {}
        self._reloads = 0
        self._spawned = 0

    # -- proxies -----------------------------------------------------------

    def _start_proxies(self) -> tuple[str, str]:
        context = self._context = zmq.Context()
        jobs_front, rpc_front = context.socket(zmq.PULL), context.socket(zmq.ROUTER)
        if self.allow_client_keys:
            self._authenticator = start_thread_authenticator(context, self.allow_client_keys)
        self.endpoint = bind_pair(jobs_front, rpc_front, self.bind_address, curve_secret_key=self.curve_secret_key)
        self._jobs_endpoint = jobs_front.getsockopt_string(zmq.LAST_ENDPOINT)
        backend = (f"ipc://{self._dir}/jobs", f"ipc://{self._dir}/rpc")
        jobs_back, rpc_back = context.socket(zmq.PUSH), context.socket(zmq.DEALER)
        jobs_back.bind(backend[0])
        rpc_back.bind(backend[1])
        self._sockets = {"jobs": (jobs_front, jobs_back), "rpc": (rpc_front, rpc_back)}
        for name, pair in self._sockets.items():
            for sock in pair:
                sock.setsockopt(zmq.LINGER, 1000)
            self._start_proxy(name)
        return backend

    def _start_proxy(self, name: str) -> None:
        """Run pyzmq's proxy between the ``name`` pair of sockets in a thread of its own."""
        assert self._context is not None
        control = self._context.socket(zmq.PAIR)
        control.bind(f"inproc://control-{name}-{self._spawned}")
        peer = self._context.socket(zmq.PAIR)
        peer.connect(f"inproc://control-{name}-{self._spawned}")
        self._spawned += 1
        front, back = self._sockets[name]
        thread = threading.Thread(target=_run_proxy, args=(front, back, peer), name=f"zqsync-proxy-{name}", daemon=True)
        thread.start()
        self._proxies[name] = (control, thread)

    def _halt_proxy(self, name: str) -> None:
        """Stop the ``name`` proxy and join its thread; its sockets stay open and bound.

        The proxy forwards whole messages, so none is cut; after the join this
        thread may use the sockets.
        """
        control, thread = self._proxies.pop(name)
        control.send(b"TERMINATE")
        thread.join(5.0)
        control.close(linger=0)

    def _stop_proxies(self) -> None:
        for name in list(self._proxies):
            self._halt_proxy(name)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._context is not None:
            self._context.destroy(linger=1000)

    # -- children ------------------------------------------------------------

    def _spawn(self, slot: int, backend: tuple[str, str]) -> _Child:
        self._spawned += 1
        ready_file = os.path.join(self._dir, f"ready-{slot}-{self._spawned}")
        parent = os.getpid()
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
        child = self.children[pid] = _Child(slot, pid, ready_file)
        log.info("started worker child %d (pid %d)", slot, pid)
        return child

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
            backend = self._start_proxies()
            for slot in range(self.processes):
                self._spawn(slot, backend)
            log.info("zqsync supervisor pid %d: %d worker children behind %s, %s", os.getpid(), self.processes,
                     self.endpoint, curve_state(self._authenticator))
            status = self._loop(backend)
            self._stop_children()
            return status
        finally:
            self._kill_children()
            self._stop_proxies()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)  # only record; the main loop acts

    def _on_hup(self, signum: int, frame: Any) -> None:
        self._reloads += 1

    def _reload(self, backend: tuple[str, str]) -> Optional[int]:
        """Replace every child, one at a time (see the module docstring). Returns an exit status
        to halt with, or ``None``. Gives up early when a stop signal arrives."""
        old = [child for child in self.children.values() if not child.retiring]
        log.info("HUP: replacing %d worker children one at a time", len(old))
        for child in old:
            if child.pid not in self.children:  # it exited meanwhile, and is being restarted
                continue
            fresh = self._spawn(child.slot, backend)
            halt = self._wait(partial(getattr, fresh, "booted"), self.boot_timeout)
            if halt is not None or not fresh.booted:
                return halt
            self._retire(child)
        log.info("HUP: replaced %d worker children", len(old))
        return None

    def _retire(self, child: _Child) -> None:
        """Warm-stop ``child`` with the jobs proxy off until it has drained its backend queue."""
        child.retiring = True
        self._halt_proxy("jobs")
        try:
            os.kill(child.pid, signal.SIGTERM)
            drained = f"{child.ready_file}.drained"
            self._wait(lambda: os.path.exists(drained) or child.pid not in self.children, DRAIN_TIMEOUT)
            if not os.path.exists(drained):
                log.warning("worker child %d (pid %d) did not report its queue drained within %.0f s",
                            child.slot, child.pid, DRAIN_TIMEOUT)
        except ProcessLookupError:
            pass
        finally:
            self._start_proxy("jobs")

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

    def _loop(self, backend: tuple[str, str]) -> int:
        announced = False
        while not self._signals:
            if self._reloads:
                self._reloads = 0
                halt = self._reload(backend)
                if halt is not None:
                    return halt
            halt = self._reap() or self._check_boot()
            if halt is not None:
                return halt
            now = time.monotonic()
            for slot, when in list(self._restart_at.items()):
                if when <= now:
                    del self._restart_at[slot]
                    self.restarts += 1
                    self._spawn(slot, backend)
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
        """Unbind the public jobs endpoint (clients listing other workers send there), then hand
        the jobs already queued in it to the children (warm) or count them as discarded (cold,
        or not handed over within ``graceful_timeout``). The jobs proxy must be halted."""
        front, back = self._sockets["jobs"]
        front.unbind(self._jobs_endpoint)
        deadline = time.monotonic() + self.graceful_timeout
        seen = len(self._signals)
        forwarded = discarded = 0
        while front.poll(int(DRAIN_QUIET * 1000)):
            frame = front.recv()
            cold = cold or len(self._signals) > seen
            if not cold and back.poll(max(0, int((deadline - time.monotonic()) * 1000)), zmq.POLLOUT):
                back.send(frame)
                forwarded += 1
            else:
                discarded += 1
        log.info("stopped taking jobs on %s; handed %d queued job(s) to the children", self._jobs_endpoint, forwarded)
        if discarded:
            log.warning("discarded %d queued plain jobs on shutdown (in the supervisor's queue)", discarded)

    def _stop_children(self) -> None:
        cold = signal.SIGQUIT in self._signals
        self._halt_proxy("jobs")
        self._stop_taking_jobs(cold)
        self._signal_children(signal.SIGQUIT if cold else signal.SIGTERM)
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
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.pop(pid, None)

    def _kill_children(self) -> None:
        if self.children:
            log.warning("killing %d worker children that did not stop", len(self.children))
        self._signal_children(signal.SIGKILL)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()


def _run_proxy(front: zmq.Socket, back: zmq.Socket, control: zmq.Socket) -> None:
    """Forward between ``front`` and ``back`` until TERMINATE on ``control``; the two sockets stay open."""
    try:
        zmq.proxy_steerable(front, back, None, control)
    except zmq.ContextTerminated:
        pass
    finally:
        control.close(linger=0)
