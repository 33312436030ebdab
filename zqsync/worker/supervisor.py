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
* TERM/INT: warm shutdown; children stop receiving and finish in-flight
  tasks within ``graceful_timeout``. A second TERM/INT, or QUIT: cold; the
  children are told to kill their tasks. Stragglers are SIGKILLed.
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
from typing import Any, Callable, Optional

import zmq

from .. import settings
from ..auth import start_thread_authenticator
from ..errors import ConfigurationError
from .binding import bind_pair

log = logging.getLogger(__name__)

#: Exit status when a child fails to boot (gunicorn uses 3 too).
BOOT_ERROR = 3
#: Seconds a child must stay up for its restart backoff to reset.
STABLE_AFTER = 30.0
MAX_BACKOFF = 30.0


class _Child:
    __slots__ = ("slot", "pid", "started", "ready_file", "booted")

    def __init__(self, slot: int, pid: int, ready_file: str) -> None:
        self.slot, self.pid, self.ready_file = slot, pid, ready_file
        self.started = time.monotonic()
        self.booted = False


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
        self._controls: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []

    # -- proxies -----------------------------------------------------------

    def _start_proxies(self) -> tuple[str, str]:
        context = self._context = zmq.Context()
        jobs_front, rpc_front = context.socket(zmq.PULL), context.socket(zmq.ROUTER)
        if self.allow_client_keys:
            self._authenticator = start_thread_authenticator(context, self.allow_client_keys)
        self.endpoint = bind_pair(jobs_front, rpc_front, self.bind_address, curve_secret_key=self.curve_secret_key)
        backend = (f"ipc://{self._dir}/jobs", f"ipc://{self._dir}/rpc")
        jobs_back, rpc_back = context.socket(zmq.PUSH), context.socket(zmq.DEALER)
        jobs_back.bind(backend[0])
        rpc_back.bind(backend[1])
        for name, front, back in (("jobs", jobs_front, jobs_back), ("rpc", rpc_front, rpc_back)):
            for sock in (front, back):
                sock.setsockopt(zmq.LINGER, 1000)
            control = context.socket(zmq.PAIR)
            control.bind(f"inproc://control-{name}")
            peer = context.socket(zmq.PAIR)
            peer.connect(f"inproc://control-{name}")
            self._controls.append(control)
            thread = threading.Thread(target=_run_proxy, args=(front, back, peer), name=f"zqsync-proxy-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return backend

    def _stop_proxies(self) -> None:
        for control in self._controls:
            control.send(b"TERMINATE")
        for thread in self._threads:
            thread.join(5.0)
        for control in self._controls:
            control.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._context is not None:
            self._context.destroy(linger=1000)

    # -- children ------------------------------------------------------------

    def _spawn(self, slot: int, backend: tuple[str, str]) -> None:
        ready_file = os.path.join(self._dir, f"ready-{slot}")
        if os.path.exists(ready_file):
            os.unlink(ready_file)
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
        self.children[pid] = _Child(slot, pid, ready_file)
        log.info("started worker child %d (pid %d)", slot, pid)

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
        try:
            backend = self._start_proxies()
            for slot in range(self.processes):
                self._spawn(slot, backend)
            log.info("zqsync supervisor pid %d: %d worker children behind %s", os.getpid(), self.processes, self.endpoint)
            status = self._loop(backend)
            self._stop_children()
            return status
        finally:
            self._kill_children()
            self._stop_proxies()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)  # only record; the main loop acts

    def _loop(self, backend: tuple[str, str]) -> int:
        announced = False
        while not self._signals:
            halt = self._reap() or self._check_boot()
            if halt is not None:
                return halt
            now = time.monotonic()
            for slot, when in list(self._restart_at.items()):
                if when <= now:
                    del self._restart_at[slot]
                    self.restarts += 1
                    self._spawn(slot, backend)
            if not announced and len(self.children) == self.processes and all(c.booted for c in self.children.values()):
                announced = True
                self._write_ready_file()
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                log.warning("parent process %d is gone: shutting down", self.parent_pid)
                self._signals.append(signal.SIGTERM)
            time.sleep(0.05)
        return 0

    def _write_ready_file(self) -> None:
        if self.ready_file:
            temporary = f"{self.ready_file}.tmp{os.getpid()}"
            with open(temporary, "w") as handle:
                handle.write(f"{self.endpoint}\n")
            os.replace(temporary, self.ready_file)

    def _stop_children(self) -> None:
        cold = signal.SIGQUIT in self._signals
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
    try:
        zmq.proxy_steerable(front, back, None, control)
    except zmq.ContextTerminated:
        pass
    finally:
        for sock in (front, back, control):
            sock.close(linger=1000)
