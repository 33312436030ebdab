"""JobStatus: what ``Client.job``, ``Client.result`` and ``Client.cancel`` learn about one job id.

A worker answers for the jobs it holds (``zqsync/worker/status.py``): confirmed
jobs in its journal, plain jobs kept on request in its memory, and jobs running
in it. ``unknown`` therefore means: no worker the client could reach holds
that id. The job may never have been sent, may not have arrived yet (a plain
job still queued), may have been a plain job whose status nobody asked to keep,
may be on a worker that did not answer (listed in `JobStatus.unanswered`),
or its status may have been pruned (``--keep-done`` seconds after it finished).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import TYPE_CHECKING, Any, Generic, Mapping, Optional, TypeVar, Union

from ..errors import ConfigurationError, RemoteError, remote_error

if TYPE_CHECKING:
    from .client import Client

R = TypeVar("R")

#: States after which a job never changes again.
FINISHED = ("done", "failed", "dead", "cancelled", "expired")


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """The status of one job, as the worker holding it reported it.

    :ivar id: the job id.
    :ivar state: ``pending`` (accepted, waiting for a slot), ``scheduled`` (waiting for its due time:
        a delayed job, or a retry's backoff), ``running``, ``done``, ``failed`` (raised, and its task
        has no retries), ``dead`` (retries exhausted: dead-lettered), ``cancelled``, ``expired`` (not started
        by its ``expires=``: it never runs), or ``unknown``
        (no reachable worker holds it: see the module docstring).
    :ivar task: the task name, or ``None`` when unknown.
    :ivar attempts: attempts started so far.
    :ivar result: the task's return value once ``done`` (as msgpack decodes it), else ``None``.
    :ivar error: the last attempt's error (`RemoteError`), or ``None``.
    :ivar enqueued_at: when the worker accepted it, epoch seconds (UTC) as a float, or ``None``.
    :ivar started_at: when its last attempt started, epoch seconds, or ``None``.
    :ivar finished_at: when it reached a finished state, epoch seconds, or ``None``.
    :ivar due: when a ``scheduled`` job runs at the earliest, epoch seconds, or ``None``.
    :ivar worker: the client's endpoint of the worker that answered, or ``None``.
    :ivar pid: that worker process's pid, or ``None``.
    :ivar unanswered: endpoints that did not answer while the job was looked for.
    """

    id: str
    state: str
    task: Optional[str] = None
    attempts: int = 0
    result: Any = None
    error: Optional[RemoteError] = None
    enqueued_at: Optional[float] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    due: Optional[float] = None
    worker: Optional[str] = None
    pid: Optional[int] = None
    unanswered: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether the job reached a state it never leaves (done, failed, dead, cancelled, expired)."""
        return self.state in FINISHED

    def value(self) -> Any:
        """The result of a ``done`` job.

        :raises RemoteError: the job failed or is dead (the task's error type, as `Client.call`
            raises it); `JobCancelled` if cancelled, `JobExpired`
            if it expired before it started.
        :raises ValueError: the job has not finished.
        """
        if self.state == "done":
            return self.result
        if self.error is not None and self.finished:
            raise self.error
        raise ValueError(f"job {self.id} has not finished (state {self.state})")

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any], worker: Optional[str],
                   unanswered: tuple[str, ...] = ()) -> "JobStatus":
        """Build from a worker's ``zqsync.job``/``zqsync.result``/``zqsync.cancel`` answer."""
        error = reply.get("error")
        raised = None if error is None else remote_error(
            error.get("type", "?"), error.get("message", ""), error.get("traceback", ""), request_id=reply["id"])
        known = reply.get("state") != "unknown"
        return cls(reply["id"], reply["state"], reply.get("task"), reply.get("attempts", 0), reply.get("result"),
                   raised, reply.get("enqueued_at"), reply.get("started_at"), reply.get("finished_at"),
                   reply.get("due"), worker if known else None, reply.get("pid") if known else None, unanswered)



def expiry(expires: Union[float, datetime.datetime, None], deadline: Optional[float]) -> Optional[float]:
    """Seconds from now after which a job must not start (``expires``, or its older name ``deadline``), or ``None``.

    :raises ConfigurationError: both given, a naive or past datetime, or not a number of seconds above 0.
    """
    name = "expires" if deadline is None or expires is not None else "deadline"
    if deadline is not None and expires is not None:
        raise ConfigurationError("give expires or its older name deadline, not both", setting=name)
    value = deadline if expires is None else expires
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        if value.utcoffset() is None:
            raise ConfigurationError(f"{name} must be an aware datetime (with a tzinfo), got {value!r}", setting=name)
        seconds = value.timestamp() - time.time()
        if seconds <= 0:
            raise ConfigurationError(f"{name} {value.isoformat()} is in the past", setting=name)
        return seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be seconds from now or an aware datetime, got {value!r}", setting=name)
    if not 0 < value < float("inf"):
        raise ConfigurationError(f"{name} must be a number of seconds above 0, got {value!r}", setting=name)
    return float(value)


class Job(str, Generic[R]):
    """A job id, as ``enqueue`` returns it: a ``str`` (compared, hashed, encoded and pickled as the
    plain id) that remembers the client that sent it.

    ``Job[R]`` is the job of a task returning ``R`` (``TaskHandle[P, R].enqueue``), so a type
    checker knows what `result` returns.

    :ivar client: the `Client` that sent it (a route's client for a routed task).
    """

    __slots__ = ("client",)  # no instance dict: a plain enqueue makes one of these per job
    client: "Client"

    def __new__(cls, job_id: str, client: "Client") -> "Job[R]":
        job = str.__new__(cls, job_id)
        job.client = client
        return job

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))

    def result(self, *, timeout: Optional[float] = None) -> R:
        """`Client.result` of this job: blocks until it finishes."""
        return self.client.result(self, timeout=timeout)  # type: ignore[no-any-return]

    def status(self, *, timeout: Optional[float] = None) -> JobStatus:
        """`Client.job` of this job."""
        return self.client.job(self, timeout=timeout)

    def cancel(self, *, timeout: Optional[float] = None) -> JobStatus:
        """`Client.cancel` of this job."""
        return self.client.cancel(self, timeout=timeout)


__all__ = ["FINISHED", "Job", "JobStatus", "expiry"]
