"""Start and stop real worker and gunicorn processes (used by ``zqsync demo`` and ``zqsync.testing``).

Every process is started in its own session and stopped by its pid: TERM,
then KILL after a deadline, so nothing outlives its owner.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Mapping, Optional, Sequence

from .errors import ProcessFailed


def stop_process(proc: subprocess.Popen, *, timeout: float = 10.0, sig: int = signal.SIGTERM) -> Optional[int]:
    """Send ``sig`` to ``proc`` (by pid), wait up to ``timeout`` seconds, then SIGKILL.

    :returns: the exit status (negative for a signal), as ``Popen.returncode``.
    """
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Started with start_new_session, so its group id is its pid: the
            # KILL also reaches children it left behind (gunicorn's workers).
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5.0)
        except ProcessLookupError:
            proc.wait(5.0)
    return proc.returncode


def _output_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


class WorkerProcess:
    """A ``zqsync worker`` subprocess on an ephemeral port pair of 127.0.0.1.

    :param app: ``MODULE[:ATTR]`` of the registry to serve.
    :param bind: base endpoint; the default picks a free port pair on 127.0.0.1.
    :param cwd: directory the worker runs in (and imports ``app`` from).
    :param concurrency: task slots.
    :param extra_args: more ``zqsync worker`` arguments.
    :param env: extra environment variables. ``TMPDIR`` defaults to the worker's own
        temporary directory, which `kill` removes.
    :param ready_timeout: seconds to wait for the worker to listen.
    :param nofile: ``(soft, hard)`` RLIMIT_NOFILE the worker process starts with (default: this
        process's); a hard limit below this process's cannot be raised again by the worker.

    Use `start` (or the context manager) and `stop`.
    ``endpoint`` is the bound base endpoint; output goes to ``log_path``.
    """

    def __init__(
        self,
        app: str = "zqsync.demo.tasks:registry",
        *,
        bind: str = "tcp://127.0.0.1:0",
        cwd: Optional[str] = None,
        concurrency: int = 100,
        extra_args: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
        ready_timeout: float = 30.0,
        nofile: Optional[tuple[int, int]] = None,
    ) -> None:
        self.app = app
        self.bind = bind
        self.cwd = cwd or os.getcwd()
        self.concurrency = concurrency
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.nofile = nofile
        self._dir = tempfile.mkdtemp(prefix="zqsync-worker-")
        self.log_path = os.path.join(self._dir, "worker.log")
        self.endpoint = ""
        self.proc: Optional[subprocess.Popen] = None
        self._probe: Optional[tuple[int, Any]] = None
        self._probe_lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The worker's pid. :raises ProcessFailed: not started."""
        if self.proc is None:
            raise ProcessFailed("worker not started")
        return self.proc.pid

    def start(self) -> "WorkerProcess":
        """Start the worker and wait until it listens.

        :raises ProcessFailed: it exited or did not listen within ``ready_timeout``
            seconds; the message carries the end of its output.
        """
        ready = os.path.join(self._dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        command = [
            sys.executable, "-m", "zqsync", "worker", self.app, "--bind", self.bind,
            "--concurrency", str(self.concurrency), "--ready-file", ready, "--parent-pid", str(os.getpid()),
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, cwd=self.cwd, env={**os.environ, "TMPDIR": self._dir, **self.env}, stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=self._limit if self.nofile else None,
            )
        deadline = time.monotonic() + self.ready_timeout
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProcessFailed(f"worker {self.app} did not start:\n{_output_tail(self.log_path)}")
            time.sleep(0.02)
        with open(ready) as handle:
            self.endpoint = handle.read().strip()
        return self

    def _limit(self) -> None:
        """In the forked child, before exec: the file descriptor limit it starts with."""
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def stop(self, *, timeout: float = 15.0, sig: int = signal.SIGTERM) -> Optional[int]:
        """Stop the worker by pid (``sig``, then SIGKILL after ``timeout`` seconds); returns its exit status."""
        self._close_probe()
        return stop_process(self.proc, timeout=timeout, sig=sig) if self.proc else None

    def kill(self) -> Optional[int]:
        """SIGKILL the worker's whole session (it and any children it forked), reap it, and
        remove its temporary directory (its output and ``TMPDIR``).

        For teardown when the warm shutdown is not under test: it skips the
        worker's drain waits (about 0.3 s a worker). Returns its exit status.
        """
        self._close_probe()
        status = None
        if self.proc is not None:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            status = self.proc.wait(10.0)
        shutil.rmtree(self._dir, ignore_errors=True)
        return status

    def _close_probe(self) -> None:
        if self._probe is not None and self._probe[0] == os.getpid():
            self._probe[1].close(linger=0)
        self._probe = None

    def stats(self, *, timeout: float = 10.0) -> dict:
        """The worker's ``zqsync.stats``, asked over one persistent DEALER whose identity starts
        with ``probe-``: it never counts as a client socket, and asking again opens no new
        connection (so the worker's connection counters see only real clients).

        Thread-safe; a forked child gets a probe of its own.

        :raises ProcessFailed: no answer within ``timeout`` seconds.
        """
        from .wire import envelope

        with self._probe_lock:
            sock = self._probe_socket()
            request_id = os.urandom(8).hex()
            sock.send(envelope.encode_request("call", request_id, "zqsync.stats"))
            deadline = time.monotonic() + timeout
            while sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                reply = envelope.decode_reply(sock.recv())
                if reply.id == request_id:
                    return reply.result
            self._probe = None  # a late reply must not confuse the next question
            sock.close(linger=0)
            raise ProcessFailed(f"worker {self.endpoint} did not answer zqsync.stats within {timeout} s")

    def _probe_socket(self) -> Any:
        import zmq

        from .wire.endpoints import split_endpoint

        if self._probe is None or self._probe[0] != os.getpid():
            sock: Any = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, b"probe-" + os.urandom(4).hex().encode())
            sock.connect(split_endpoint(self.endpoint)[1])
            self._probe = (os.getpid(), sock)
        return self._probe[1]

    def identities(self) -> set[str]:
        """Distinct DEALER identities that called this worker, probes excluded: the
        peer-side proof of client socket reuse (one identity) or discard (a new one)."""
        return {identity for identity in self.stats()["identities"] if not identity.startswith("probe-")}

    def output(self) -> str:
        """Everything the worker printed so far."""
        return _output_tail(self.log_path, lines=10_000)

    def __enter__(self) -> "WorkerProcess":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class GunicornProcess:
    """Real ``gunicorn -k gevent`` serving ``app`` on a listening socket this process binds.

    The socket is bound here and handed over as ``fd://N``, so its port is
    known before gunicorn starts, with no race for a free port.

    :param app: WSGI app, e.g. ``"zqsync.demo.webapp:app"``.
    :param chdir: directory gunicorn imports ``app`` from (default: this process's cwd).
    :param config: a gunicorn config: a file path, ``python:MODULE``, or ``None``.
    :param workers: worker processes.
    :param preload: pass ``--preload`` (load the app in the master before forking).
    :param env: extra environment variables (e.g. ``ZQSYNC_ENDPOINT``).
    """

    def __init__(
        self,
        app: str,
        *,
        chdir: Optional[str] = None,
        config: Optional[str] = None,
        workers: int = 2,
        preload: bool = True,
        env: Optional[Mapping[str, str]] = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.app, self.chdir, self.config = app, chdir or os.getcwd(), config
        self.workers, self.preload = workers, preload
        self.env = dict(env or {})
        self.ready_timeout = ready_timeout
        self._dir = tempfile.mkdtemp(prefix="zqsync-gunicorn-")
        self.log_path = os.path.join(self._dir, "gunicorn.log")
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""

    def start(self) -> "GunicornProcess":
        """Start gunicorn and wait until ``/health`` answers.

        :raises ProcessFailed: it exited or did not answer in time.
        """
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(2048)
        listener.set_inheritable(True)
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        command = [sys.executable, "-m", "gunicorn", "-k", "gevent", "-w", str(self.workers),
                   "--bind", f"fd://{listener.fileno()}", "--chdir", self.chdir, "--log-level", "warning"]
        if self.config:
            command += ["-c", self.config]
        if self.preload:
            command.append("--preload")
        command.append(self.app)
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    command, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, pass_fds=(listener.fileno(),), start_new_session=True,
                )
        finally:
            listener.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProcessFailed(f"gunicorn did not start:\n{_output_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.05)

    def stop(self, *, timeout: float = 20.0) -> Optional[int]:
        """Stop gunicorn's master by pid (TERM, then KILL); returns its exit status."""
        return stop_process(self.proc, timeout=timeout) if self.proc else None

    def output(self) -> str:
        """Everything gunicorn printed so far."""
        return _output_tail(self.log_path, lines=10_000)

    def __enter__(self) -> "GunicornProcess":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
