"""The scheduler's confirm side: journal a confirmed job without waiting, then acknowledge it.

A confirmed job goes to the journal's writer thread (``group_commit.py``), which commits every job
that arrived meanwhile in one transaction and posts one hub callback per batch; that callback
answers the batch's jobs (an acknowledgement, a duplicate, or a ``JournalUnavailable`` error) and
queues the new ones to run, each holding a backlog place (``max_backlog``); past the bound, the
acknowledgement waits for a place (``scheduler.py`` has the rest of the scheduler).
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Optional

import gevent.lock
import gevent.pool
import gevent.queue

from ..wire import envelope
from .canvas import check_spec
from .group_commit import GroupCommit
from .jobs import Confirm, Job
from .journal_api import NewJob
from .registry import Task
from .runner import Runner

log = logging.getLogger("zqsync.worker.scheduler")  # the log lines keep their logger (split off)


class Confirming:
    """The confirm half of `JobScheduler` (a mixin: it sets these)."""

    runner: Runner
    slots: gevent.pool.Pool
    _commits: Optional[GroupCommit]
    _backlog: gevent.lock.BoundedSemaphore
    _ready: gevent.queue.Queue
    _parked: collections.deque[Confirm]
    _counting: int

    def admit(self, request: envelope.Request, task: Task, answer: Callable[[bytes], None]) -> None:
        """Journal a confirmed job without waiting: ``answer(reply frame)`` is called later, in the hub.

        Never blocks. The job goes to the writer thread, which commits it with
        every job that arrived meanwhile (group commit) and then posts one hub
        callback per batch (`_answer_batch`) that answers the batch's
        jobs, so a job is acknowledged only after the transaction holding it
        has committed and the journal file was checked to be the one opened.
        A job id seen before is acknowledged as a duplicate and not run again;
        one that is dead-lettered gets a ``DuplicateJob`` error. If the journal
        cannot be written (or its file is gone), the answer is a
        ``JournalUnavailable`` error naming the cause, never an acknowledgement:
        at once while the journal is known to be broken. A new job waits for a
        backlog place (``max_backlog``) before it is acknowledged.
        """
        assert self._commits is not None  # admit is the runner's confirm only with a journal
        refusal = self._commits.gone or self._commits.broken
        if refusal:  # fail fast until the write loop finds the journal writable
            answer(self._refuse(request, refusal))
            return
        kept = {key: request.options[key] for key in ("expires", "canvas") if key in request.options}
        wrong = check_spec(kept["canvas"]) if "canvas" in kept else None
        if wrong:
            answer(envelope.encode_error(request.id, "ProtocolError", f"job {request.id}: {wrong}"))
            return
        body = envelope.encode_request("job", request.id, request.task, request.args, request.kwargs, options=kept)
        due = float(request.options.get("due", 0.0))  # checked when the request was decoded
        now = time.time()
        due = due if due > now else 0.0
        # A job that will find a free slot the moment it is committed has its first attempt counted by
        # its insert (NewJob.retry_at): one journal operation less per job (not for one that may wait for its
        # rate limit). Should the process die
        # before the attempt starts, the job is replayed like any job that was running then (alone,
        # attempt counted; never dead-lettered for it, since it was not running alone).
        counted = not due and task.rate_limit is None and self._counting < self.slots.free_count()
        self._counting += counted
        retry_at = now + task.backoff_for(1) if counted else 0.0
        self._commits.add(NewJob(request.id, request.task, body, task.retries, due, retry_at),
                          Confirm(task, request, due, answer, counted))

    def _answer_batch(self, waiting: list[tuple[str, Any, Any]], fresh: list[Optional[str]], refused: set[str],
                      error: Optional[Exception]) -> None:
        """In the hub, after the writer thread committed a batch (or failed to, with ``error``): answer its
        confirmed jobs and the greenlets waiting to start an attempt."""
        states = iter(fresh)
        for op, item, result in waiting:
            if op != "add":  # a start or a flush: its greenlet waits for the commit
                if error is None:
                    result.set(op == "flush" or item.id not in refused)
                else:
                    result.set_exception(error)
            elif error is None:
                self._journaled(result, next(states))
            else:
                self._counting -= result.counted
                result.answer(self._refuse(result.request, f"{type(error).__name__}: {error}"))

    def _journaled(self, confirm: "Confirm", existing: Optional[str]) -> None:
        """Answer a confirmed job whose journal transaction committed (``existing``: the state of a row
        already under its id, ``None`` if the job is new)."""
        request = confirm.request
        if existing is None:
            self.runner.counters["jobs_received"] += 1
            self.runner.counters["confirmed_accepted"] += 1
            if not confirm.due:
                if self._backlog.acquire(blocking=False):
                    self._enter_backlog(confirm)
                else:  # past the backlog bound the acknowledgement waits for a place (_free_place)
                    self._parked.append(confirm)
                return
            log.info("journaled job %s (%s) to run at or after %.3f (epoch s)", request.id, request.task, confirm.due)
            confirm.answer(envelope.encode_result(request.id, {"job_id": request.id, "duplicate": False,
                                                               "due": confirm.due}))
            return
        self._counting -= confirm.counted
        self.runner.counters["confirmed_duplicates"] += 1
        if existing == "dead":
            confirm.answer(envelope.encode_error(
                request.id, "DuplicateJob",
                f"job {request.id} is already journaled and dead-lettered (its attempts are exhausted), so it "
                f"was not run again: see `zqsync jobs --id {request.id}`, re-run it with `zqsync jobs requeue "
                f"{request.id}`, or enqueue it under a new id"))
            return
        confirm.answer(envelope.encode_result(request.id, {"job_id": request.id, "duplicate": True}))

    def _enter_backlog(self, confirm: "Confirm") -> None:
        """A journaled new job that holds a backlog place: queue it to run, then acknowledge it."""
        self._ready.put(Job(confirm.task, confirm.request, 0, True, admitted=True, counted=confirm.counted))
        confirm.answer(envelope.encode_result(confirm.request.id, {"job_id": confirm.request.id, "duplicate": False}))

    def _free_place(self) -> None:
        """A backlog place is free: it goes to the oldest journaled job waiting for one, if any."""
        if self._parked:
            self._enter_backlog(self._parked.popleft())
        else:
            self._backlog.release()

    def _refuse(self, request: envelope.Request, cause: str) -> bytes:
        self.runner.counters["confirmed_refused"] += 1
        log.error("refused confirmed job %s (%s): the journal cannot be written: %s", request.id, request.task, cause)
        return envelope.encode_error(
            request.id, "JournalUnavailable",
            f"the worker could not journal job {request.id}, so it did not acknowledge it: {cause}")


__all__ = ["Confirming"]
