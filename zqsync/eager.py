"""Eager mode: run tasks in the calling process, for an app's own unit tests.

Inside ``with eager(registry):`` every `Client` in the process
hands what it would send to an in-process stand-in for the worker instead of
a socket. Everything on the client's side of the wire runs for real: option
checks (``deadline`` with ``confirm``, a naive ``eta``, a negative
``send_timeout`` raise ``ConfigurationError`` as they do without eager mode),
the wire encoding and its limits (msgpack, the same checks as a real request),
routes. On the worker's side, calls and jobs run through the worker's own
`Runner`: its error replies, ``UnknownTask``,
deadlines, middleware hooks, retries, and the rule that a result a worker
would keep (a confirmed job's, or a plain job's with ``store_result``) must
encode, or the job fails. ``Client.job``, ``Client.result`` and
``Client.cancel`` answer from what the block ran, as a worker would: a
confirmed or kept job is known, any other is ``unknown``. No socket is opened.

This is Celery's ``task_always_eager``, RQ's ``is_async=False`` and
dramatiq's ``StubBroker`` for zqsync.

Time in eager mode:

* a job runs at once, in ``enqueue``, with its retries at once (backoff is
  skipped, and recorded as ``EagerJob.attempts``);
* a delayed job (``delay=``, ``eta=``) waits on the recorder's clock: it is
  ``scheduled`` until `EagerRecorder.advance` moves the clock past its
  due time, and can be cancelled meanwhile;
* a call whose task outlasts the call's timeout raises ``CallTimeout`` once the
  task has returned (a real caller gives up at its deadline while the worker
  finishes the task; here the task runs in the caller, so it finishes first);
* time limits hold as on a worker, also for code that never yields: a native
  thread raises ``SoftTimeLimitExceeded`` and the time limit's error into the
  task (``worker/thread_limits.py``), where a worker's watchdog would signal
  or end its process. One long C call that holds the GIL is interrupted only
  when it returns.

A job enqueued inside an open Django transaction (``transaction.atomic()``,
not the one ``django.test.TestCase`` wraps each test in) warns with
`ZqsyncWarning`, or raises
`EnqueuedInTransaction` with ``in_transaction="error"``:
in eager mode it runs at once and sees the rows the transaction has not
committed, while a real worker may run it before the commit, or after a
rollback, and not see them. Enqueue from ``transaction.on_commit`` instead.

Not simulated: the network, congestion control and the journal's
durability. The patch is process-wide, so do not run two eager blocks at
once from different threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import types
import warnings
from typing import Any, Iterator, NamedTuple, Optional

from .client.client import Client
from .client.lookups import remote_error_of
from .errors import CallTimeout, EnqueuedInTransaction, ProtocolError, RemoteError, ZqsyncWarning
from .wire import envelope
from .worker.registry import Registry
from .worker.runner import Runner, unsendable
from .worker.status import TERMINAL
from .worker.thread_limits import ThreadLimits

log = logging.getLogger(__name__)

#: The ``worker`` a status answered in eager mode names.
WORKER = "eager"
#: ``zqsync.*`` calls answered from the recorder's book.
ADMIN = ("zqsync.job", "zqsync.result", "zqsync.cancel")


class EagerJob(NamedTuple):
    """One job run in eager mode.

    :ivar id: the job id ``enqueue`` returned.
    :ivar task: the task name.
    :ivar ok: whether its last attempt succeeded.
    :ivar value: the result, or the error as ``(type name, message, traceback)``.
    :ivar attempts: attempts made (1 plus retries used; 0 for a task no worker would run).
    """

    id: str
    task: str
    ok: bool
    value: Any
    attempts: int


class EagerRecorder:
    """What an `eager` block ran, and the stand-in worker's book. ``jobs`` lists every job run, in order.

    :ivar propagate: raise a job's final failure from ``enqueue`` (as `RemoteError`).
    :ivar in_transaction: what a job enqueued inside an open database transaction does: ``"warn"``,
        ``"error"`` or ``"ignore"`` (the module docstring says why).
    :ivar now: the block's clock, epoch seconds: the real time plus what `advance` added.
    """

    def __init__(self, registry: Registry, *, propagate: bool, in_transaction: str = "warn") -> None:
        if in_transaction not in ("warn", "error", "ignore"):
            raise ValueError(f"in_transaction must be 'warn', 'error' or 'ignore', got {in_transaction!r}")
        self.runner = Runner(registry, watchdog=ThreadLimits())
        self.propagate = propagate
        self.in_transaction = in_transaction
        self.jobs: list[EagerJob] = []
        self._offset = 0.0
        self._book: dict[str, dict[str, Any]] = {}  # job id -> the status a worker would answer
        self._scheduled: dict[str, tuple[float, envelope.Request]] = {}

    @property
    def now(self) -> float:
        """The block's clock, epoch seconds (float): the wall clock plus what `advance` added."""
        return time.time() + self._offset

    def check_transaction(self, task: str) -> None:
        """Warn or raise (`in_transaction`) when a job is enqueued inside an open database transaction."""
        if self.in_transaction == "ignore":
            return
        where = open_transaction()
        if where is None:
            return
        message = (f"job {task!r} enqueued inside {where}: a worker may run it before the commit (or after a rollback) "
                   "and not see its rows; enqueue it from transaction.on_commit(...)")
        if self.in_transaction == "error":
            raise EnqueuedInTransaction(message)
        warnings.warn(message, ZqsyncWarning, stacklevel=_caller_level())

    def failed(self) -> list[EagerJob]:
        """The jobs whose last attempt failed."""
        return [job for job in self.jobs if not job.ok]

    def advance(self, seconds: float) -> list[EagerJob]:
        """Move the clock ``seconds`` on and run the delayed jobs now due, earliest first.

        :returns: the jobs it ran.
        :raises RemoteError: one failed for good and ``propagate`` is set.
        """
        self._offset += float(seconds)
        due = sorted((at, job_id) for job_id, (at, _) in self._scheduled.items() if at <= self.now)
        return [self._run(self._scheduled.pop(job_id)[1]) for _, job_id in due]

    # -- the worker's side ------------------------------------------------

    def job(self, frame: bytes, *, confirmed: bool) -> Optional[bytes]:
        """Take one encoded job as a worker would; returns the error reply a confirm gets, if any.

        :raises RemoteError: its last attempt failed and ``propagate`` is set.
        """
        request = envelope.decode_request(frame)
        if self.runner.registry.get(request.task) is None:
            message = f"no task named {request.task!r} is registered"
            if confirmed:  # a worker refuses it before journaling it
                return envelope.encode_error(request.id, "UnknownTask", message)
            log.warning("eager: a worker would drop job %s: unknown task %r", request.id, request.task)
            self._record(EagerJob(request.id, request.task, False, ("UnknownTask", message, ""), 0))
            return None
        if confirmed or request.options.get("store"):
            self._book[request.id] = _status(request, "pending", self.now)
        due = request.options.get("due")
        if due is not None and due > self.now:
            self._book[request.id].update(state="scheduled", due=due)
            self._scheduled[request.id] = (due, request)
            return None
        self._run(request)
        return None

    def _run(self, request: envelope.Request) -> EagerJob:
        task = self.runner.registry.get(request.task)
        assert task is not None  # checked when it was taken
        status = self._book.get(request.id)
        attempts = 0
        while True:
            attempts += 1
            if status is not None:
                status.update(state="running", attempts=attempts, started_at=self.now)
            ok, value, delay = self.runner.run_job(task, request, attempts)
            if delay is None:
                break
        if ok and status is not None:
            try:
                envelope.encode_result(request.id, value)
            except ProtocolError as exc:
                ok, value = False, unsendable(task, exc)
        if status is not None:
            status.update(state="done" if ok else "dead" if task.retries else "failed",
                          result=value if ok else None, error=None if ok else _error(value), finished_at=self.now)
        return self._record(EagerJob(request.id, task.name, ok, value, attempts))

    def _record(self, job: EagerJob) -> EagerJob:
        self.jobs.append(job)
        if not job.ok and self.propagate:
            raise RemoteError(*job.value)
        return job

    def request(self, frame: bytes) -> envelope.Reply:
        """Answer one call (or a job admin call) as a worker's rpc socket would."""
        request = envelope.decode_request(frame)  # the client encoded it: it decodes
        if request.task in ADMIN:
            return envelope.decode_reply(envelope.encode_result(request.id, self._admin(request)))
        decoded = self.runner.decode_rpc(frame)
        reply = decoded if isinstance(decoded, bytes) else self.runner.answer_call(*decoded)
        return envelope.decode_reply(reply)

    def _admin(self, request: envelope.Request) -> dict[str, Any]:
        job_id = str(request.args[0]) if request.args else ""
        status = self._book.get(job_id, {"id": job_id, "state": "unknown", "worker": WORKER, "pid": os.getpid()})
        if request.task == "zqsync.result" and status["state"] not in TERMINAL and len(request.args) > 1:
            time.sleep(float(request.args[1]))  # the long-poll: nothing changes until the test moves the clock
        if request.task == "zqsync.cancel" and status["state"] != "unknown":
            cancelled = status["state"] in ("pending", "scheduled")
            if cancelled:
                self._scheduled.pop(job_id, None)
                status.update(state="cancelled", finished_at=self.now,
                              error=_error(("JobCancelled", "the job was cancelled before it ran", "")))
            return {**status, "cancelled": cancelled}
        return dict(status)


def _caller_level() -> int:
    """The ``stacklevel`` that names the first caller outside zqsync (the line that enqueued)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame: Optional[types.FrameType] = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def open_transaction() -> Optional[str]:
    """The open database transaction the caller is in, described, or ``None``: a Django ``atomic`` block
    other than those ``django.test.TestCase`` opens (Django's own ``durable`` check tells them apart the
    same way). Never imports Django: an app that has not imported ``django.db`` is in none."""
    if "django.db" not in sys.modules:
        return None
    from django.db import connections

    try:
        aliases = list(connections)
    except Exception:  # settings not configured: no database to be in
        return None
    for alias in aliases:
        blocks = getattr(connections[alias], "atomic_blocks", [])
        if any(not getattr(block, "_from_testcase", False) for block in blocks):
            return f"a transaction.atomic() block on database {alias!r}"
    return None


def _status(request: envelope.Request, state: str, now: float) -> dict[str, Any]:
    return {"id": request.id, "state": state, "task": request.task, "attempts": 0, "result": None, "error": None,
            "enqueued_at": now, "started_at": None, "finished_at": None, "due": None, "worker": WORKER,
            "pid": os.getpid()}


def _error(info: tuple[str, str, str]) -> dict[str, str]:
    return {"type": info[0], "message": info[1], "traceback": info[2]}


@contextlib.contextmanager
def eager(registry: Registry, *, propagate: bool = False, in_transaction: str = "warn") -> Iterator[EagerRecorder]:
    """Run every client's jobs and calls in this process, against ``registry``, within the block.

    :param registry: the tasks to run (your app's `Registry`).
    :param propagate: a job that fails for good raises `RemoteError`
        from ``enqueue`` (or from `EagerRecorder.advance` for a delayed
        one); by default it is recorded in ``recorder.jobs``.
    :param in_transaction: ``"warn"`` (`ZqsyncWarning`), ``"error"``
        (`EnqueuedInTransaction` from ``enqueue``) or ``"ignore"``: a job
        enqueued inside an open Django transaction (module docstring).
    :returns: an `EagerRecorder` (``.jobs``, ``.failed()``, ``.advance()``).
    :raises ProtocolError: (from ``enqueue``/``call``) an argument that the wire would refuse.
    :raises ConfigurationError: an option the client refuses, as without eager mode.

    Blocks only as long as the tasks run. Clients keep their settings and
    open no socket while eager.
    """
    recorder = EagerRecorder(registry, propagate=propagate, in_transaction=in_transaction)
    saved = Client._send_job, Client._confirm, Client._request

    def send_job(self: Client, frame: bytes, job_id: str, mode: Any, send_timeout: Optional[float]) -> str:
        recorder.check_transaction(envelope.decode_request(frame).task)
        recorder.job(frame, confirmed=False)
        return job_id

    def confirm(self: Client, frame: bytes, job_id: str, task: str, total: float) -> None:
        recorder.check_transaction(task)
        refused = recorder.job(frame, confirmed=True)
        if refused is not None:
            raise remote_error_of(envelope.decode_reply(refused))

    def request(self: Client, frame: bytes, request_id: str, task: str, timeout: float, *_: Any,
                **__: Any) -> envelope.Reply:
        started = time.monotonic()
        reply = recorder.request(frame)
        if time.monotonic() - started > timeout:  # a real caller gave up at its deadline; the task ran on
            raise CallTimeout(task, timeout, list(self.endpoints))
        return reply

    Client._send_job = send_job  # type: ignore[method-assign]
    Client._confirm = confirm  # type: ignore[method-assign]
    Client._request = request  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        Client._send_job, Client._confirm, Client._request = saved  # type: ignore[method-assign]


__all__ = ["EagerJob", "EagerRecorder", "eager"]
