"""Every error zqsync raises, under one root: `ZqsyncError`, and its one warning.

Third-party errors (pyzmq, msgpack) are wrapped with ``raise ... from exc`` so
callers need to catch only this hierarchy.

Every error pickles with its context attributes (urllib3's exceptions do the
same), so one raised in a forked or spawned child reaches the parent intact.

A worker names the errors it sends back by type name; `REMOTE_ERRORS`
is the one table, used by both sides, that maps those names to the
`RemoteError` subclass the client raises (redis-py's parser keeps
such a table for server error names).
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[BaseException], args: tuple) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    return error


class ZqsyncWarning(RuntimeWarning):
    """A configuration that will fail under load (for example the socket budget)."""


class ZqsyncError(Exception):
    """Root of every error raised by zqsync."""

    def __reduce__(self) -> Any:
        # The default rebuilds by calling __init__(*self.args), which breaks
        # for every subclass whose __init__ takes other arguments than its message.
        return (_rebuild, (type(self), self.args), self.__dict__)


class ClientClosed(ZqsyncError):
    """The `Client` was closed; build a new one to send more."""


class ProcessFailed(ZqsyncError):
    """A helper process (a worker or gunicorn started by zqsync's tooling) exited early or was not ready in time."""


class ForkFailed(ZqsyncError, AssertionError):
    """A child forked by `zqsync.testing.run_in_fork` hung, crashed, or exited without a result."""


class ConfigurationError(ZqsyncError, ValueError):
    """A setting, endpoint or argument is out of range or malformed.

    :ivar setting: the name of the offending setting or argument.
    """

    def __init__(self, message: str, *, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting


class ProtocolError(ZqsyncError):
    """A frame could not be decoded, or decoded into something invalid."""


class PoolError(ZqsyncError):
    """The socket pool could not hand out a socket.

    Raised when the wait for a free slot runs out, when a lease is nested
    inside another lease, or when the context's socket budget is exhausted.
    """


class CallTimeout(ZqsyncError, TimeoutError):
    """No reply arrived for a call before its deadline.

    :ivar task: the task name.
    :ivar timeout: the deadline that ran out, in seconds.
    :ivar endpoints: the worker endpoint(s) called, or ``None``.
    """

    def __init__(self, task: str, timeout: float, endpoints: object = None) -> None:
        where = f" from {endpoints!r} ({UNREACHABLE_CAUSES}; or the task is slower than the deadline)" if endpoints else ""
        super().__init__(f"call to task {task!r} got no reply within {timeout:.3f} s{where}")
        self.task = task
        self.timeout = timeout
        self.endpoints = endpoints


class Congested(ZqsyncError):
    """An enqueue could not be handed to ZeroMQ before its send deadline.

    The peer's high-water mark (HWM) is full, or no peer is connected.

    :ivar address: the endpoint(s) the job was meant for.
    :ivar timeout: the send deadline that ran out, in seconds.
    """

    def __init__(self, address: object, timeout: float) -> None:
        super().__init__(
            f"enqueue to {address!r} was not accepted within {timeout:.3f} s "
            f"(the worker is busy with a full queue, or {UNREACHABLE_CAUSES}; "
            "see ZQSYNC_SEND_TIMEOUT and ZQSYNC_CONGESTION)"
        )
        self.address = address
        self.timeout = timeout


class Unconfirmed(ZqsyncError):
    """No worker acknowledged a confirmed job before the confirm deadline.

    The job may or may not have been journaled: retrying with the same
    ``job_id`` is safe, since workers recognise duplicates by id.

    :ivar job_id: the job's id.
    :ivar timeout: the deadline that ran out, in seconds.
    """

    def __init__(self, job_id: str, timeout: float, reason: str = "") -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(f"job {job_id} was not confirmed by any worker within {timeout:.3f} s{detail}")
        self.job_id = job_id
        self.timeout = timeout


class EnqueuedInTransaction(ZqsyncError):
    """Eager mode with ``in_transaction="error"``: a job was enqueued inside an open database transaction
    (``zqsync.eager``: a real worker may run it before the commit, or after a rollback)."""


class JobNotFound(ZqsyncError, LookupError):
    """Every worker that could hold a job id answered that it does not (``Client.result``).

    Raised at once for an id given as a plain ``str``. A `Job` handle this
    process's client returned is waited for instead (its plain job may still be on its way).

    :ivar job_id: the id looked for.
    :ivar endpoints: the endpoints of the workers that answered.
    """

    def __init__(self, job_id: str, endpoints: object = None) -> None:
        super().__init__(f"no worker holds job {job_id} (asked {endpoints!r}): it was never sent there, its status "
                         "was not kept (a plain job without store_result), or it was pruned")
        self.job_id = job_id
        self.endpoints = endpoints


class RemoteError(ZqsyncError):
    """A task raised inside the worker, or the worker refused the request.

    :ivar remote_type: the remote exception's type name, e.g. ``"ValueError"``.
    :ivar remote_message: the remote exception's message.
    :ivar remote_traceback: the formatted remote traceback (may be empty).
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        text = f"{self.remote_type}: {self.remote_message}"
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback
        return text


class UnknownTask(RemoteError):
    """The worker has no task registered under the requested name."""


class NoJournal(RemoteError):
    """A confirmed job reached a worker that keeps no journal (started without ``--state-dir``)."""


class TimeLimitExceeded(RemoteError):
    """The task ran past its ``time_limit`` and was interrupted."""


class SoftTimeLimitExceeded(RemoteError):
    """Raised into a task that ran past its ``soft_time_limit`` (where it yields, or by the watchdog's
    signal where it does not); the task may catch it and clean up until its ``time_limit``.

    An ``Exception``, as in Celery: a task's ``except Exception`` catches it too. Uncaught, it fails
    the attempt like any error, and a caller sees it raised as this class. Raise it as
    ``SoftTimeLimitExceeded("SoftTimeLimitExceeded", message)``.
    """


class WorkerShutdown(RemoteError):
    """The worker stopped before the task finished."""


class WorkerStopping(RemoteError):
    """The worker is stopping and refused the call without running it: safe to retry elsewhere."""


class RequestRejected(RemoteError):
    """The worker could not decode the request, or it arrived on the wrong socket."""


class JournalUnavailable(RemoteError):
    """The worker could not journal a confirmed job (disk full, journal file deleted or replaced,
    lock timeout, ...), so it did not acknowledge it. ``remote_message`` names the cause.

    The job was not accepted by that worker: retry later, or elsewhere, with the same ``job_id``.

    :ivar job_id: the job's id.
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "", *, job_id: str = "") -> None:
        super().__init__(remote_type, remote_message, remote_traceback)
        self.job_id = job_id


class DuplicateJob(RemoteError):
    """A confirmed job's id is already journaled as a dead-lettered job: it was not run again.

    Requeue it (``zqsync jobs requeue ID``) or enqueue it under a new id.

    :ivar job_id: the job's id.
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "", *, job_id: str = "") -> None:
        super().__init__(remote_type, remote_message, remote_traceback)
        self.job_id = job_id


#: Worker error type name -> the class the client raises. Names not listed
#: (a task's own exception, such as ``ValueError``) raise `RemoteError`.
REMOTE_ERRORS: dict[str, type[RemoteError]] = {
    cls.__name__: cls
    for cls in (UnknownTask, NoJournal, TimeLimitExceeded, SoftTimeLimitExceeded, WorkerShutdown, WorkerStopping,
                JournalUnavailable, DuplicateJob)
}
REMOTE_ERRORS["ProtocolError"] = RequestRejected


def remote_error(type_name: str, message: str, traceback: str = "", *, request_id: str = "") -> RemoteError:
    """The client-side exception for an error reply naming ``type_name`` to request (or job) ``request_id``."""
    cls = REMOTE_ERRORS.get(type_name, RemoteError)
    if cls in (JournalUnavailable, DuplicateJob, JobCancelled, JobExpired):
        return cls(type_name, message, traceback, job_id=request_id)
    return cls(type_name, message, traceback)


#: Why a worker endpoint takes nothing; named by `CallTimeout` and `Congested`.
UNREACHABLE_CAUSES = (
    "likely causes: the worker is down or not listening there, it refused this client's CURVE keys "
    "(see its log), the host name does not resolve (names resolve to IPv4; give IPv6 as [addr]), "
    "or the address or port is wrong"
)


class JobCancelled(RemoteError):
    """``Client.result`` of a job that was cancelled (``Client.cancel``, ``zqsync jobs cancel``): it never
    ran, or was interrupted where it yielded.

    :ivar job_id: the job's id.
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "", *, job_id: str = "") -> None:
        super().__init__(remote_type, remote_message, remote_traceback)
        self.job_id = job_id


REMOTE_ERRORS[JobCancelled.__name__] = JobCancelled


class JobExpired(JobCancelled):
    """``Client.result`` of a job that was not started by its expiry (``expires=``), so it never ran;
    its state is ``expired``. A `JobCancelled`: it ended without running, by no fault of its own.

    :ivar job_id: the job's id.
    """


REMOTE_ERRORS[JobExpired.__name__] = JobExpired


class DeadlineExpired(RemoteError):
    """The worker read the request after its deadline (the caller's timeout) had passed, and did
    not run it: the caller had given up. Seen by a caller only when clocks disagree or the reply
    outraces the caller's own timeout. ``remote_message`` says by how much it was late.
    """


REMOTE_ERRORS[DeadlineExpired.__name__] = DeadlineExpired
