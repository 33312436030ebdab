"""pytest plugin (registered through ``pytest11``): real workers, identity-recording peers, and forks.

Fixtures
    ``zq_worker``: a factory; ``zq_worker("myapp.tasks:registry")`` starts a
    real ``zqsync worker`` process on ephemeral 127.0.0.1 ports and returns a
    `WorkerProcess` (``.endpoint``, ``.pid``,
    ``.stats()``, ``.identities()``). Every worker still running at teardown
    is SIGKILLed with its process group (a test of the warm shutdown calls
    ``worker.stop()`` itself).

    ``zq_inprocess``: a factory; ``zq_inprocess(registry, **settings)`` serves
    ``registry`` with the real worker core in a thread of the test process and
    returns a started `InProcessWorker`
    (``.endpoint``, ``.wait(condition)``, ``.join(finished)``, ``.stop()``): for
    tests of task semantics (retries, time limits of tasks that yield, hooks,
    results, cancel) with no subprocess and no polling. Each is stopped at teardown.

    ``zq_async_client``: a factory; ``zq_async_client(endpoint, **settings)`` returns a
    `zqsync.aio.AsyncClient` (``await client.call(...)`` in the test's coroutines, which
    ``asyncio.run`` runs); each is closed at teardown.

    ``zq_peer``: a worker serving `peer_registry`, whose tasks answer at
    once (``echo``), late (``delay``) or never (``drop``), and which records the
    ZMQ identity of every socket that calls it (``.identities()``).

Helpers
    `run_in_fork` runs a function in a forked child and returns its
    value or re-raises its exception.

    `eager` (from ``zqsync/eager.py``) runs every client's jobs and
    calls in the test's own process, for an app's fast unit tests.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Iterator

import pytest

from ._common import catch_sigchld_before_fork
from .eager import eager
from .errors import ForkFailed
from .processes import WorkerProcess
from .worker.registry import Registry

__all__ = ["ForkFailed", "eager", "peer_registry", "run_in_fork", "zq_async_client", "zq_inprocess", "zq_peer", "zq_worker"]

peer_registry = Registry()


@peer_registry.task
def echo(value: Any = None) -> Any:
    """Answer at once with ``value``."""
    return value


@peer_registry.task
def delay(seconds: float, value: Any = None) -> Any:
    """Answer with ``value`` after ``seconds`` (cooperative sleep)."""
    time.sleep(float(seconds))
    return value


@peer_registry.task
def drop() -> None:
    """Never answer (sleeps for an hour; the worker is stopped first)."""
    time.sleep(3600)


def run_in_fork(fn: Callable[..., Any], *args: Any, timeout: float = 30.0, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` in a forked child and return its result in the parent.

    The child ends with ``os._exit``, so no ``atexit`` hook of the parent's
    runs in it. Works plain and under gevent monkey-patching.

    :param timeout: seconds the child may run before it is SIGKILLed.
    :returns: the child's return value (it must be picklable).
    :raises Exception: the child's exception, re-raised, with the child's
        traceback as its ``__notes__``.
    :raises ForkFailed: the child hung past ``timeout`` (the message then
        gives its threads' stacks at 0.8 x ``timeout``, from `faulthandler`,
        and under gevent its greenlets'),
        exited non-zero, or died by a signal.
    """
    handle, path = tempfile.mkstemp(prefix="zqsync-fork-")
    os.close(handle)
    stacks = path + ".stacks"
    try:
        catch_sigchld_before_fork()
        pid = os.fork()
        if pid == 0:  # child
            _dump_stacks_later(stacks, timeout * 0.8)
            _child_main(path, fn, args, kwargs)
        status = _wait_child(pid, timeout, stacks)
        with open(path, "rb") as result_file:
            data = result_file.read()
    finally:
        for leftover in (path, stacks):
            if os.path.exists(leftover):
                os.unlink(leftover)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not data:
        raise ForkFailed(f"forked child {pid} exited with status {code} without a result")
    outcome = pickle.loads(data)
    if outcome[0] == "ok":
        return outcome[1]
    exc = outcome[1]
    if hasattr(exc, "add_note"):
        exc.add_note("Traceback in the forked child:\n" + outcome[2])
    raise exc


def _dump_stacks_later(path: str, seconds: float) -> None:
    """Write the child's thread stacks to ``path`` after ``seconds`` (``faulthandler``, even if the
    hub is blocked), and under gevent also the stack of the greenlet that runs the function (while
    the hub runs; the thread's own stack then only shows the hub)."""
    out = open(path, "w")
    faulthandler.dump_traceback_later(seconds, file=out)
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("time"):
        import gevent
        import greenlet

        caller = greenlet.getcurrent()

        def dump_caller() -> None:
            frame = caller.gr_frame
            if frame is not None:
                out.write("The greenlet running the function (most recent call last):\n")
                out.write("".join(traceback.format_stack(frame)))
                out.flush()

        gevent.spawn_later(seconds, dump_caller)


def _child_main(path: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        try:
            outcome: tuple = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # everything is reported to the parent, nothing escapes the child
            outcome = ("error", exc, traceback.format_exc())
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:
            data = pickle.dumps(("error", ForkFailed(f"child result not picklable: {exc!r}"), ""))
        with open(path, "wb") as result_file:
            result_file.write(data)
    finally:
        os._exit(0)


def _wait_child(pid: int, timeout: float, stacks: str) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            with open(stacks) as dump:
                where = dump.read() or "(none written)"
            raise ForkFailed(f"forked child {pid} hung for more than {timeout} s and was killed; "
                             f"its stacks {timeout * 0.8:.1f} s in:\n{where}")
        time.sleep(0.01)


@pytest.fixture
def zq_worker() -> Iterator[Callable[..., WorkerProcess]]:
    """Factory fixture: ``zq_worker(app="zqsync.demo.tasks:registry", **WorkerProcess kwargs)``."""
    started: list[WorkerProcess] = []

    def start(app: str = "zqsync.demo.tasks:registry", **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(app, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:  # a test that checks the warm shutdown calls worker.stop() itself
        worker.kill()


@pytest.fixture
def zq_inprocess() -> Iterator[Callable[..., Any]]:
    """Factory fixture: ``zq_inprocess(registry, **WorkerSettings fields)`` -> a started ``InProcessWorker``."""
    from .worker.inprocess import InProcessWorker  # the worker's modules, only for the tests that use one

    started: list[InProcessWorker] = []

    def start(registry: Registry, **settings: Any) -> InProcessWorker:
        worker = InProcessWorker(registry, **settings)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def zq_async_client() -> Iterator[Callable[..., Any]]:
    """Factory fixture: ``zq_async_client(endpoint, **ClientSettings fields)`` -> an ``AsyncClient``."""
    from .aio import AsyncClient  # pyzmq's asyncio support, only for the tests that use one

    made: list[AsyncClient] = []

    def make(endpoints: Any, **settings: Any) -> AsyncClient:
        client = AsyncClient(endpoints, **settings)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close(linger=0)


@pytest.fixture
def zq_peer(zq_worker: Callable[..., WorkerProcess]) -> Callable[..., WorkerProcess]:
    """Factory fixture: ``zq_peer()`` starts a worker serving `peer_registry`."""

    def start(**kwargs: Any) -> WorkerProcess:
        return zq_worker("zqsync.testing:peer_registry", **kwargs)

    return start
