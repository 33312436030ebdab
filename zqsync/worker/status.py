"""Job status, results and cancel on the worker side, and the journal's admin calls.

Who knows a job's status (``docs/design.md``, "Job status and results"):

* a **confirmed** job: the journal of the worker that acknowledged it (its row:
  state, attempts, timestamps, error, and the msgpack result of a ``done`` job),
  for ``keep_done`` seconds after it finished (``keep_dead`` when dead-lettered);
* a **plain** job: only if its task has ``store_result=True`` or the caller
  asked (``store_result=True`` on enqueue); then this process's memory keeps it,
  at most `MAX_KEPT` jobs, each for ``keep_done`` seconds, lost with the process;
* a job **running** here: this process's memory, which holds its greenlet (to cancel it).

Every worker answers the ``zqsync.*`` admin calls below from what it holds;
the client asks the preferred worker of the id first, then the others.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any, Callable, Optional

import gevent
import gevent.event

from ..wire import envelope
from . import recent
from .journal_api import CANCELLED, JournalBackend, Row
from .journal_calls import JournalCalls, row_state

log = logging.getLogger(__name__)

#: States after which a job never changes again.
TERMINAL = ("done", "failed", "dead", "cancelled", "expired")
#: Most plain-job statuses one process keeps in memory (oldest dropped first).
MAX_KEPT = 10_000
#: Longest single ``zqsync.result`` long-poll, seconds (clients call again for longer waits).
MAX_WAIT = 30.0
#: Seconds between re-reads of the journal while a long-poll waits (a job may finish in another process).
RECHECK = 1.0


class Cancelled(BaseException):
    """Thrown into a running task's greenlet by ``zqsync.cancel`` (``gevent.kill``): a BaseException,
    so that the runner's error handling does not turn it into an ordinary failure."""


class Running:
    """A job running in this process (one per attempt, so slotted: it is made for every job)."""

    __slots__ = ("greenlet", "task", "attempts", "started_at", "request", "confirmed")

    def __init__(self, greenlet: gevent.Greenlet, task: str, attempts: int, started_at: float,
                 request: Optional[envelope.Request] = None, confirmed: bool = False) -> None:
        self.greenlet, self.task, self.attempts, self.started_at = greenlet, task, attempts, started_at
        self.request = request  # its arguments, formatted only when listed (`.recent.call_text`)
        self.confirmed = confirmed


def _args(run: Running) -> str:
    return "" if run.request is None else recent.call_text(run.request)


def _error(text: Optional[str], traceback: str = "") -> Optional[dict[str, str]]:
    if text is None:
        return None
    kind, _, message = text.partition(": ")
    return {"type": kind, "message": message, "traceback": traceback}


class JobBook:
    """What this worker process knows of its jobs, and the ``zqsync.*`` job admin calls.

    :param journal: the worker's journal, or ``None`` (no confirmed jobs here).
    :param keep_done: seconds a finished plain job's status stays in memory.
    :param flush: blocks until the outcomes recorded so far are in the journal (the scheduler's).
    """

    def __init__(self, journal: Optional[JournalBackend], keep_done: float,
                 flush: Callable[[], None] = lambda: None) -> None:
        self.journal = journal
        self.flush = flush
        self.keep_done = keep_done
        self.worker = ""  # the base endpoint, set once bound
        self._running: dict[str, Running] = {}
        self._kept: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._waiters: dict[str, list[gevent.event.Event]] = {}
        self._cancelled: collections.OrderedDict[str, None] = collections.OrderedDict()
        # Outcomes of journaled jobs until their row says so: the journal writer commits them a moment later.
        self._settling: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._closing = False
        self._ended: dict[str, Running] = {}  # attempts that returned, until their outcome is settled
        #: the recent outcomes of every task here (``zqsync.recent``)
        self.recent = recent.Recent()
        #: the journal's admin calls (``zqsync.jobs``, ``requeue``, ``purge``)
        self.calls = JournalCalls(journal, lambda: sorted(self._running), flush)

    # -- the scheduler's side ----------------------------------------------

    def started(self, job_id: str, task: str, attempts: int, *, keep: bool, request: Optional[envelope.Request] = None,
                confirmed: bool = False) -> None:
        """An attempt starts in the current greenlet; ``keep``: a plain job whose status is kept in memory;
        ``request``: the job's request, whose arguments `zqsync.recent` lists."""
        now = time.time()
        self._running[job_id] = Running(gevent.getcurrent(), task, attempts, now, request, confirmed)
        if keep:
            status = self._kept.pop(job_id, None) or {"enqueued_at": now}
            self._keep(job_id, {**status, "task": task, "state": "running", "attempts": attempts, "started_at": now})
        if self._waiters:
            self._notify(job_id)

    def stopped(self, job_id: str) -> None:
        """The current attempt returned or was interrupted: it can no longer be cancelled as running."""
        running = self._running.pop(job_id, None)
        if running is not None:
            self._ended[job_id] = running
            if len(self._ended) > MAX_KEPT:  # an attempt whose outcome was never settled (a bug) is forgotten
                self._ended.pop(next(iter(self._ended)))

    def settled(self, job_id: str, state: str, *, result: Any = None, error: Optional[tuple[str, str, str]] = None,
                due: float = 0.0) -> None:
        """An attempt's outcome (``state`` as reported): updates a kept plain status and wakes long-polls."""
        now = time.time()
        self._remember(job_id, state, result, error, now)
        status = self._kept.get(job_id)
        if status is not None or self.journal is not None:  # else nobody keeps it (most plain jobs)
            outcome = {"state": state, "result": result, "due": due or None,
                       "error": None if error is None else dict(zip(("type", "message", "traceback"), error)),
                       "finished_at": now if state in TERMINAL else None}
            if status is not None:
                status.update(outcome)
            else:
                self._settling.pop(job_id, None)
                self._settling[job_id] = {**outcome, "at": now}
                while len(self._settling) > MAX_KEPT:
                    self._settling.popitem(last=False)
        if self._waiters:
            self._notify(job_id)

    def _remember(self, job_id: str, state: str, result: Any, error: Optional[tuple[str, str, str]], now: float) -> None:
        """Add the outcome of the attempt that just ended to `recent`."""
        run = self._ended.pop(job_id, None) or self._running.pop(job_id, None)  # a cancel settles before stopped()
        if run is not None and self.recent.wants(run.task, state, now):
            self.recent.add(recent.Outcome(
                job_id, run.task, state, _args(run), recent.short(result) if state == "done" else None,
                None if error is None else f"{error[0]}: {error[1]}"[:recent.TEXT], run.attempts, run.started_at, now,
                run.confirmed))

    def take_cancel(self, job_id: str) -> bool:
        """Whether a plain job about to start was cancelled meanwhile (the mark is used up)."""
        return self._cancelled.pop(job_id, False) is None

    def close(self) -> None:
        """The worker is stopping: every long-poll answers now (its client asks again, elsewhere or later)."""
        self._closing = True
        for job_id in list(self._waiters):
            self._notify(job_id)

    def _keep(self, job_id: str, status: dict[str, Any]) -> None:
        self._kept[job_id] = status
        cutoff = time.time() - self.keep_done
        while self._kept and (len(self._kept) > MAX_KEPT or self._expired(next(iter(self._kept.values())), cutoff)):
            self._kept.popitem(last=False)

    @staticmethod
    def _expired(status: dict[str, Any], cutoff: float) -> bool:
        return status.get("finished_at") is not None and status["finished_at"] < cutoff

    def _notify(self, job_id: str) -> None:
        for event in self._waiters.pop(job_id, []):
            event.set()

    # -- admin calls ---------------------------------------------------------

    def builtins(self) -> dict[str, Callable[..., Any]]:
        """The worker's ``zqsync.*`` job calls, by name."""
        return {"zqsync.job": self.job, "zqsync.result": self.result, "zqsync.cancel": self.cancel,
                "zqsync.jobs": self.calls.jobs, "zqsync.requeue": self.calls.requeue, "zqsync.purge": self.calls.purge,
                "zqsync.recent": self.recent_jobs}

    def recent_jobs(self, task: Optional[str] = None, state: Optional[str] = None, since: Optional[float] = None,
                    until: Optional[float] = None, limit: int = 100) -> dict[str, Any]:
        """``zqsync.recent``: the jobs running in this process and its recent outcomes (`.recent`).

        :param task: only this task's. :param state: only outcomes in this state (``done``, ``failed``,
            ``dead``, ``cancelled``, ``scheduled``: a retry), or ``running`` for the running ones only.
        :param since: only outcomes finished at or after (epoch seconds). :param until: at or before.
        :param limit: most outcomes (newest first), at most `.recent.MAX_LIST`.
        :returns: ``{"now", "pid", "per_task", "running": [{"id", "task", "args", "attempts", "started_at",
            "runtime" (seconds), "confirmed"}], "finished": [{"id", "task", "state", "args", "result",
            "error", "attempts", "started_at", "finished_at", "runtime", "confirmed"}]}``.
        :raises ValueError: a filter of the wrong type.
        """
        running = [{"id": job_id, "task": run.task, "args": _args(run), "attempts": run.attempts,
                    "started_at": run.started_at, "confirmed": run.confirmed} for job_id, run in self._running.items()]
        return recent.answer(self.recent, running, task, state, since, until, limit)

    def job(self, job_id: str) -> dict[str, Any]:
        """``zqsync.job``: the status of ``job_id`` as this process knows it (``state`` ``unknown`` if not).

        :returns: ``{"id", "state", "task", "attempts", "result", "error" ({"type", "message", "traceback"}
            or None), "enqueued_at", "started_at", "finished_at", "due" (epoch seconds, UTC, or None),
            "worker", "pid"}``.
        """
        _check_id(job_id)
        status: dict[str, Any] = {"id": job_id, "state": "unknown", "task": None, "attempts": 0, "result": None, "error": None,
                  "enqueued_at": None, "started_at": None, "finished_at": None, "due": None}
        row = self._row(job_id)
        if row is not None:
            status.update(self._from_row(row))
            settling = self._settling.get(job_id)
            if settling is not None:  # newer than the row until the writer commits the outcome
                if row.updated_at < settling["at"]:
                    status.update({key: value for key, value in settling.items() if key != "at"})
                else:
                    del self._settling[job_id]
        elif job_id in self._kept:
            status.update(self._kept[job_id])
        running = self._running.get(job_id)
        if running is not None and status["state"] not in TERMINAL:
            status.update(state="running", task=running.task, attempts=running.attempts, started_at=running.started_at)
        return {**status, "worker": self.worker, "pid": os.getpid()}

    def result(self, job_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """``zqsync.result``: wait up to ``timeout`` seconds (at most `MAX_WAIT`) for ``job_id`` to
        finish, then return its status as `job` (finished or not). Blocks only the calling greenlet;
        answers at once while the worker stops."""
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout < float("inf"):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        deadline = time.monotonic() + min(float(timeout), MAX_WAIT)
        while True:
            status = self.job(job_id)
            remaining = deadline - time.monotonic()
            if status["state"] in TERMINAL or remaining <= 0 or self._closing:
                return status
            event = gevent.event.Event()
            self._waiters.setdefault(job_id, []).append(event)
            try:
                event.wait(min(remaining, RECHECK))
            finally:
                waiting = self._waiters.get(job_id, [])
                if event in waiting:
                    waiting.remove(event)
                if not waiting:
                    self._waiters.pop(job_id, None)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """``zqsync.cancel``: cancel ``job_id`` if it is pending, scheduled or running here.

        A running task is interrupted where it next yields (``gevent.kill``; waits up to 5 s for it
        to end); a pending or scheduled one is marked ``cancelled`` and never starts.

        :returns: the status as `job`, with ``"cancelled"``: whether this call cancelled it, and
            ``"reason"``: why not (``None`` if it did).
        """
        _check_id(job_id)
        running = self._running.get(job_id)
        if running is not None:
            log.info("cancelling job %s (%s) while it runs", job_id, running.task)
            gevent.kill(running.greenlet, Cancelled(job_id))
            running.greenlet.join(timeout=5.0)
            return {**self.job(job_id), "cancelled": True}
        if self.journal is not None:
            self.flush()  # an outcome recorded a moment ago (a retry's "pending") is in the row before it is read
        done = self.journal is not None and gevent.get_hub().threadpool.apply(self.journal.cancel, (job_id,))
        kept = self._kept.get(job_id)
        if not done and kept is not None and kept["state"] in ("pending", "scheduled"):
            kept.update(state="cancelled", finished_at=time.time(), error=_error(CANCELLED))
            self._cancelled[job_id] = None
            while len(self._cancelled) > MAX_KEPT:
                self._cancelled.popitem(last=False)
            done = True
        if done:
            log.info("cancelled job %s before it started", job_id)
            self._notify(job_id)
        status = self.job(job_id)
        return {**status, "cancelled": bool(done), "reason": None if done else _not_cancelled(status["state"])}

    def _row(self, job_id: str) -> Optional[Row]:
        if self.journal is None:
            return None
        rows = gevent.get_hub().threadpool.apply(self.journal.rows, (), {"ids": [job_id], "limit": 1})
        return rows[0] if rows else None

    def _from_row(self, row: Row) -> dict[str, Any]:
        state = row_state(row, time.time(), self._owner_alive)
        result = envelope.decode_reply(row.result).result if row.result else None
        return {"state": state, "task": row.task, "attempts": row.attempts, "result": result,
                "error": _error(row.error) if state != "done" else None, "enqueued_at": row.created_at,
                "started_at": row.started_at, "finished_at": row.finished_at,
                "due": row.next_at if state == "scheduled" else None}

    def _owner_alive(self, owner: Optional[str]) -> bool:
        assert self.journal is not None
        return bool(gevent.get_hub().threadpool.apply(self.journal.owner_alive, (owner,)))


def _not_cancelled(state: str) -> str:
    if state == "unknown":
        return "no such job here: not in this worker's journal, not running here, and no kept status"
    if state in TERMINAL:
        return f"it already ended ({state})"
    return f"it is {state} where this worker cannot stop it (another process runs it)"


def _check_id(job_id: Any) -> None:
    if not isinstance(job_id, str) or not job_id or len(job_id) > envelope.MAX_ID:
        raise ValueError(f"job_id must be a non-empty str of at most {envelope.MAX_ID} characters, got {job_id!r}")


__all__ = ["Cancelled", "JobBook", "TERMINAL"]
