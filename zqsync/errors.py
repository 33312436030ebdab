"""Every error zqsync raises, under one root: :class:`ZqsyncError`.

Third-party errors (pyzmq, msgpack) are wrapped with ``raise ... from exc`` so
callers need to catch only this hierarchy.
"""

from __future__ import annotations


class ZqsyncError(Exception):
    """Root of every error raised by zqsync."""


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
    """

    def __init__(self, task: str, timeout: float) -> None:
        super().__init__(f"call to task {task!r} got no reply within {timeout:.3f} s")
        self.task = task
        self.timeout = timeout


class Congested(ZqsyncError):
    """An enqueue could not be handed to ZeroMQ before its send deadline.

    The peer's high-water mark (HWM) is full, or no peer is connected.

    :ivar address: the endpoint(s) the job was meant for.
    :ivar timeout: the send deadline that ran out, in seconds.
    """

    def __init__(self, address: object, timeout: float) -> None:
        super().__init__(
            f"enqueue to {address!r} was not accepted within {timeout:.3f} s "
            "(worker slow, stopped or absent; see ZQSYNC_SEND_TIMEOUT and ZQSYNC_CONGESTION)"
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
