"""Eager mode: run tasks in the calling process, for an app's own unit tests.

Inside ``with eager(registry):`` every :class:`~zqsync.Client` in the process
runs the registered task itself instead of sending it: ``enqueue`` (plain or
``confirm=True``) runs the job with its retries, and ``call`` returns the
task's result or raises what a worker's reply would raise. The arguments and
results still go through the wire encoding (msgpack, the same limits and
checks as a real request), so what would fail on the wire fails in the test.
This is Celery's ``task_always_eager``, RQ's ``is_async=False`` and
dramatiq's ``StubBroker`` for zqsync.

Not simulated: the network, congestion control, and the journal. Retries
run at once, without their backoff. Time limits hold only for tasks that
yield to gevent (as in a worker). The patch is process-wide, so do not run
two eager blocks at once from different threads.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Optional

from .client.client import Client, _remote_error, _task_name
from .client.jobs import Job
from .errors import RemoteError, remote_error
from .wire import envelope
from .worker.registry import Registry
from .worker.runner import Runner


class EagerJob(NamedTuple):
    """One job run in eager mode.

    :ivar id: the job id ``enqueue`` returned.
    :ivar task: the task name.
    :ivar ok: whether its last attempt succeeded.
    :ivar value: the result, or the error as ``(type name, message, traceback)``.
    :ivar attempts: attempts made (1 plus retries used).
    """

    id: str
    task: str
    ok: bool
    value: Any
    attempts: int


class EagerRecorder:
    """What an :func:`eager` block ran. ``jobs`` lists every job in order.

    :ivar propagate: raise a job's final failure from ``enqueue`` (as :class:`RemoteError`).
    """

    def __init__(self, registry: Registry, *, propagate: bool) -> None:
        self.runner = Runner(registry)
        self.propagate = propagate
        self.jobs: list[EagerJob] = []

    def failed(self) -> list[EagerJob]:
        """The jobs whose last attempt failed."""
        return [job for job in self.jobs if not job.ok]

    def run_job(self, frame: bytes) -> str:
        """Run one encoded job with its retries, at once; returns its id.

        :raises UnknownTask: no such task in the registry.
        :raises RemoteError: its last attempt failed and ``propagate`` is set.
        """
        request = envelope.decode_request(frame)
        task = self.runner.registry.get(request.task)
        if task is None:  # a worker would drop it with a log line; a test should hear of it
            raise remote_error("UnknownTask", f"no task named {request.task!r} is registered")
        attempts = 0
        while True:
            attempts += 1
            ok, value, delay = self.runner.run_job(task, request, attempts)
            if delay is None:
                break
        self.jobs.append(EagerJob(request.id, task.name, ok, value, attempts))
        if not ok and self.propagate:
            raise RemoteError(*value)
        return request.id

    def run_call(self, frame: bytes) -> Any:
        """Run one encoded call and return its result, decoded as a worker's reply would be.

        :raises RemoteError: the task raised (the matching subclass, as a client would).
        """
        decoded = self.runner.decode_rpc(frame)
        reply = envelope.decode_reply(decoded if isinstance(decoded, bytes) else self.runner.answer_call(*decoded))
        if reply.ok:
            return reply.result
        raise _remote_error(reply)


@contextlib.contextmanager
def eager(registry: Registry, *, propagate: bool = False) -> Iterator[EagerRecorder]:
    """Run every client's jobs and calls in this process, against ``registry``, within the block.

    :param registry: the tasks to run (your app's :class:`~zqsync.worker.Registry`).
    :param propagate: a job that fails for good raises :class:`RemoteError`
        from ``enqueue``; by default it is recorded in ``recorder.jobs``.
    :returns: an :class:`EagerRecorder` (``.jobs``, ``.failed()``).
    :raises ProtocolError: (from ``enqueue``/``call``) an argument or result
        that the wire would refuse.

    Blocks only as long as the tasks run. Clients keep their settings and
    open no socket while eager.
    """
    recorder = EagerRecorder(registry, propagate=propagate)
    saved = Client.enqueue, Client.enqueue_with_options, Client.call_with_options

    def enqueue(self: Client, task: str, *args: Any, **kwargs: Any) -> Job[Any]:  # its fast path never sees options
        return self.enqueue_with_options(task, args=args, kwargs=kwargs)

    def enqueue_with_options(self: Client, task: str, *, args: Iterable[Any] = (),
                             kwargs: Optional[Mapping[str, Any]] = None, job_id: Optional[str] = None,
                             **_options: Any) -> Job[Any]:
        frame = envelope.encode_request("job", job_id or os.urandom(16).hex(), _task_name(task), tuple(args),
                                        dict(kwargs or {}))
        return Job(recorder.run_job(frame), self)

    def call_with_options(self: Client, task: str, *, args: Iterable[Any] = (),
                          kwargs: Optional[Mapping[str, Any]] = None, **_options: Any) -> Any:
        frame = envelope.encode_request("call", os.urandom(16).hex(), _task_name(task), tuple(args),
                                        dict(kwargs or {}))
        return recorder.run_call(frame)

    Client.enqueue = enqueue  # type: ignore[method-assign]
    Client.enqueue_with_options = enqueue_with_options  # type: ignore[method-assign]
    Client.call_with_options = call_with_options  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        Client.enqueue, Client.enqueue_with_options, Client.call_with_options = saved  # type: ignore[method-assign]


__all__ = ["EagerJob", "EagerRecorder", "eager"]
