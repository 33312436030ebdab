"""Job status, results and cancel on the worker side, and the journal's admin calls.

Who knows a job's status (``docs/design.md``, "Job status and results"):

* a **confirmed** job: the journal of the worker that acknowledged it (its row:
  state, attempts, timestamps, error, and the msgpack result of a ``done`` job),
  for ``keep_done`` seconds after it finished (``keep_dead`` when dead-lettered);
* a **plain** job: only if its task has ``store_result=True`` or the caller
  asked (``store_result=True`` on enqueue); then this process's memory keeps it,
  at most :data:`MAX_KEPT` jobs, each for ``keep_done`` seconds, lost with the process;
* a job **running** here: this process's memory, which holds its greenlet (to cancel it).

Every worker answers the ``zqsync.*`` admin calls below from what it holds;
the client asks the preferred worker of the id first, then the others.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence

import gevent
import gevent.event

from ..errors import NoJournal, ProtocolError
from ..wire import envelope
from . import recent
from .journal_api import CANCELLED, FINISHED_STATES, JournalBackend, Row

log = logging.getLogger(__name__)

#: States after which a job never changes again.
TERMINAL = ("done", "failed", "dead", "cancelled", "expired")
#: Most plain-job statuses one process keeps in memory (oldest dropped first).
MAX_KEPT = 10_000
#: Longest single ``zqsync.result`` long-poll, seconds (clients call again for longer waits).
MAX_WAIT = 30.0
#: Seconds between re-reads of the journal while a long-poll waits (a job may finish in another process).
RECHECK = 1.0
#: Most rows one ``zqsync.jobs`` page returns.
MAX_PAGE = 1000
#: Most journal rows one filtered ``zqsync.jobs`` page reads (``running``/``scheduled``, ``task``, times).
MAX_SCAN = 10_000
#: How a status names a journaled row: these are ``pending`` in the journal, as ``failed`` is ``dead``.
DERIVED = ("running", "scheduled")
#: The journal states a page lists as stored (``dead``: the dead letters, ``failed`` ones included).
UNSPLIT = ("done", "dead", "cancelled", "expired")


class Cancelled(BaseException):
    """Thrown into a running task's greenlet by ``zqsync.cancel`` (``gevent.kill``): a BaseException,
    so that the runner's error handling does not turn it into an ordinary failure."""


@dataclasses.dataclass
class Running:
    """A job running in this process."""

    greenlet: gevent.Greenlet
    task: str
    attempts: int
    started_at: float
    args: str = ""
    confirmed: bool = False


def _error(text: Optional[str], traceback: str = "") -> Optional[dict[str, str]]:
    if text is None:
        return None
    kind, _, message = text.partition(": ")
    return {"type": kind, "message": message, "traceback": traceback}


def _final_state(state: str, retries: int) -> str:
    """A journal ``dead`` row of a task without retries is reported ``failed``: it was never meant to retry."""
    return "failed" if state == "dead" and retries == 0 else state


def row_state(row: Row, now: float, owner_alive: Callable[[Optional[str]], bool]) -> str:
    """How ``client.job()``, the dashboard and ``zqsync jobs`` name a journal row: a ``pending`` row is
    ``running`` while an attempt is counted under a live owner, ``scheduled`` while due later (delayed,
    or waiting for a retry), else ``pending``; a ``dead`` row of a task without retries is ``failed``."""
    state = _final_state(row.state, row.retries)
    if state == "pending" and row.running and owner_alive(row.owner):
        return "running"
    if state == "pending" and row.next_at > now:
        return "scheduled"
    return state


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

    # -- the scheduler's side ----------------------------------------------

    def started(self, job_id: str, task: str, attempts: int, *, keep: bool, args: str = "",
                confirmed: bool = False) -> None:
        """An attempt starts in the current greenlet; ``keep``: a plain job whose status is kept in memory;
        ``args``: a short text of its arguments (:func:`.recent.call_text`)."""
        now = time.time()
        self._running[job_id] = Running(gevent.getcurrent(), task, attempts, now, args, confirmed)
        if keep:
            status = self._kept.pop(job_id, None) or {"enqueued_at": now}
            self._keep(job_id, {**status, "task": task, "state": "running", "attempts": attempts, "started_at": now})
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
        outcome = {"state": state, "result": result, "due": due or None,
                   "error": None if error is None else dict(zip(("type", "message", "traceback"), error)),
                   "finished_at": now if state in TERMINAL else None}
        status = self._kept.get(job_id)
        if status is not None:
            status.update(outcome)
        elif self.journal is not None:
            self._settling.pop(job_id, None)
            self._settling[job_id] = {**outcome, "at": now}
            while len(self._settling) > MAX_KEPT:
                self._settling.popitem(last=False)
        self._notify(job_id)

    def _remember(self, job_id: str, state: str, result: Any, error: Optional[tuple[str, str, str]], now: float) -> None:
        """Add the outcome of the attempt that just ended to :attr:`recent`."""
        run = self._ended.pop(job_id, None)
        if run is not None:
            self.recent.add(recent.Outcome(
                job_id, run.task, state, run.args, recent.short(result) if state == "done" else None,
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
                "zqsync.jobs": self.jobs, "zqsync.requeue": self.requeue, "zqsync.purge": self.purge,
                "zqsync.recent": self.recent_jobs}

    def recent_jobs(self, task: Optional[str] = None, state: Optional[str] = None, since: Optional[float] = None,
                    until: Optional[float] = None, limit: int = 100) -> dict[str, Any]:
        """``zqsync.recent``: the jobs running in this process and its recent outcomes (:mod:`.recent`).

        :param task: only this task's. :param state: only outcomes in this state (``done``, ``failed``,
            ``dead``, ``cancelled``, ``scheduled``: a retry), or ``running`` for the running ones only.
        :param since: only outcomes finished at or after (epoch seconds). :param until: at or before.
        :param limit: most outcomes (newest first), at most :data:`.recent.MAX_LIST`.
        :returns: ``{"now", "pid", "per_task", "running": [{"id", "task", "args", "attempts", "started_at",
            "runtime" (seconds), "confirmed"}], "finished": [{"id", "task", "state", "args", "result",
            "error", "attempts", "started_at", "finished_at", "runtime", "confirmed"}]}``.
        :raises ValueError: a filter of the wrong type.
        """
        running = [{"id": job_id, "task": run.task, "args": run.args, "attempts": run.attempts,
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
        """``zqsync.result``: wait up to ``timeout`` seconds (at most :data:`MAX_WAIT`) for ``job_id`` to
        finish, then return its status as :meth:`job` (finished or not). Blocks only the calling greenlet;
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

        :returns: the status as :meth:`job`, with ``"cancelled"``: whether this call cancelled it, and
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

    def jobs(self, state: Optional[str] = None, offset: int = 0, limit: int = 50, task: Optional[str] = None,
             since: Optional[float] = None, until: Optional[float] = None) -> dict[str, Any]:
        """``zqsync.jobs``: the journal's job counts per state, and one page of the rows in ``state``.

        :param state: a journal state (``pending``, ``done``, ``dead``: the dead letters, ``failed`` included,
            ``cancelled``, ``expired``), one a status names (``running``, ``scheduled``: :func:`row_state`;
            ``failed``), or ``None`` for counts only. ``pending`` lists only the rows named ``pending``.
        :param offset: rows to skip (oldest first). :param limit: most rows, at most :data:`MAX_PAGE`.
        :param task: only this task's rows. :param since: only rows last changed at or after (epoch
            seconds). :param until: at or before. With any of these or a status's state, at most
            :data:`MAX_SCAN` rows are read for one page (``"scanned"`` says how many were).
        :returns: ``{"now" (the worker's clock: the ``as_of`` of a requeue), "counts": {state: n} (``pending``
            split into ``pending``, ``running`` and ``scheduled``), "running": [ids running in this process],
            "scanned", "rows": [{"id", "task", "args" (a short repr), "state", "attempts", "error",
            "enqueued_at", "started_at", "finished_at", "updated_at", "due"}]}``.
        :raises NoJournal: this worker keeps no journal. :raises ValueError: a bad page or filter.
        """
        journal = self._journal()
        if not (isinstance(offset, int) and isinstance(limit, int) and offset >= 0 and 0 < limit <= MAX_PAGE):
            raise ValueError(f"offset must be an int >= 0 and limit an int in 1..{MAX_PAGE}")
        recent.check_filters(task, state, since, until, 1)
        pool, now = gevent.get_hub().threadpool, time.time()
        rows, scanned = pool.apply(self._page, (journal, now, state, offset, limit, task, since, until)) if state \
            else ([], 0)
        return {"now": now, "counts": pool.apply(self._counts, (journal, now)), "running": sorted(self._running),
                "scanned": scanned, "rows": rows}

    def _page(self, journal: JournalBackend, now: float, state: str, offset: int, limit: int, task: Optional[str],
              since: Optional[float], until: Optional[float]) -> tuple[list[dict[str, Any]], int]:
        """In a native thread: one page of :meth:`jobs`, and how many rows were read for it."""
        stored = "pending" if state in DERIVED else "dead" if state == "failed" else state
        if state in UNSPLIT and task is None and since is None and until is None:
            rows = journal.rows((state,), limit=limit, offset=offset)
            return [_summary(row, row_state(row, now, journal.owner_alive)) for row in rows], len(rows)
        page: list[dict[str, Any]] = []
        scanned = skipped = 0
        for row in journal.iter_rows((stored,)):
            scanned += 1
            named = row_state(row, now, journal.owner_alive)
            if named in (state, "failed" if state == "dead" else state) and task in (None, row.task) and (since is None or row.updated_at >= since) \
                    and (until is None or row.updated_at <= until):
                skipped += 1
                if skipped > offset:
                    page.append(_summary(row, named))
            if len(page) >= limit or scanned >= MAX_SCAN:
                break
        return page, scanned

    @staticmethod
    def _counts(journal: JournalBackend, now: float) -> dict[str, int]:
        """In a native thread: the journal's counts, ``pending`` split as :func:`row_state` names them."""
        counts = {state: count for state, count in journal.counts().items() if state != "pending"}
        alive: dict[Optional[str], bool] = {}
        for owner, running, later, count in journal.pending_split(now):
            if running and owner not in alive:
                alive[owner] = journal.owner_alive(owner)
            named = "running" if running and alive[owner] else "scheduled" if later else "pending"
            counts[named] = counts.get(named, 0) + count
        return counts

    def requeue(self, ids: Optional[Sequence[str]] = None, all_dead: bool = False, as_of: Optional[float] = None,
                explain: bool = False) -> Any:
        """``zqsync.requeue``: make ``ids`` (or every dead job) pending again, attempts reset.

        :param as_of: only jobs last changed at or before (epoch seconds, the worker's clock: the ``now``
            of the :meth:`jobs` listing acted on), so that the same requeue sent twice requeues once.
        :param explain: answer what it did and why not, instead of a bare count.
        :returns: how many were requeued; with ``explain``: ``{"requeued": n, "skipped": {id: why}
            (ids only), "reason": why none or some were not (``None`` if every one was)}``.
        :raises NoJournal: this worker keeps no journal. :raises ValueError: neither or both of ids and all_dead.
        """
        journal = self._journal()
        if bool(ids) == bool(all_dead):
            raise ValueError("give job ids or all_dead=True (not both)")
        if as_of is not None and (isinstance(as_of, bool) or not isinstance(as_of, (int, float))):
            raise ValueError(f"as_of must be epoch seconds or None, got {as_of!r}")
        pool = gevent.get_hub().threadpool
        before = pool.apply(self._requeue_check, (journal, list(ids or ()), as_of)) if explain else {}
        count = int(pool.apply(journal.requeue, (list(ids or ()),), {"all_dead": all_dead, "as_of": as_of}))
        if not explain:
            return count
        if ids:
            skipped = {job_id: why for job_id, why in before.items() if why}
            return {"requeued": count, "skipped": skipped, "reason": "; ".join(sorted(set(skipped.values()))) or None}
        return {"requeued": count, "skipped": {}, "reason": None if count else pool.apply(
            _none_dead, (journal, as_of))}

    def _requeue_check(self, journal: JournalBackend, ids: list[str], as_of: Optional[float]) -> dict[str, str]:
        """In a native thread: per id, why a requeue would leave it alone (``""``: it would not)."""
        rows = {row.id: row for row in journal.rows(ids=ids, limit=len(ids))} if ids else {}
        now = time.time()
        return {job_id: _not_requeued(rows.get(job_id), now, journal, as_of) for job_id in ids}

    def purge(self, states: Sequence[str], older_than: float) -> int:
        """``zqsync.purge``: delete finished rows in ``states`` (``done``, ``dead``, ``cancelled``, ``expired``) last
        updated more than ``older_than`` seconds ago; returns how many. Pending rows are never purged.

        :raises NoJournal: this worker keeps no journal. :raises ValueError: a bad state or age.
        """
        journal = self._journal()
        if not states or not set(states) <= set(FINISHED_STATES):
            raise ValueError(f"states must be some of {', '.join(FINISHED_STATES)}; got {states!r}")
        if not isinstance(older_than, (int, float)) or older_than < 0:
            raise ValueError(f"older_than must be seconds >= 0, got {older_than!r}")
        return int(gevent.get_hub().threadpool.apply(journal.purge, (list(states), float(older_than))))

    # -- helpers -------------------------------------------------------------

    def _journal(self) -> JournalBackend:
        if self.journal is None:
            raise NoJournal("NoJournal", "this worker keeps no journal: start it with --state-dir DIR or --journal URL")
        return self.journal

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


def _summary(row: Row, state: str) -> dict[str, Any]:
    try:
        args = recent.call_text(envelope.decode_request(row.body))
    except ProtocolError as exc:
        args = f"<undecodable: {exc}>"[:recent.TEXT]
    return {"id": row.id, "task": row.task, "args": args, "state": state, "attempts": row.attempts,
            "error": row.error, "enqueued_at": row.created_at, "started_at": row.started_at,
            "finished_at": row.finished_at, "updated_at": row.updated_at, "due": row.next_at or None}


def _not_cancelled(state: str) -> str:
    if state == "unknown":
        return "no such job here: not in this worker's journal, not running here, and no kept status"
    if state in TERMINAL:
        return f"it already ended ({state})"
    return f"it is {state} where this worker cannot stop it (another process runs it)"


def _not_requeued(row: Optional[Row], now: float, journal: JournalBackend, as_of: Optional[float]) -> str:
    """Why a requeue leaves ``row`` alone, or ``""``."""
    if row is None:
        return "no such job in the journal"
    state = row_state(row, now, journal.owner_alive)
    if state == "running":
        return "it is running: a running job is not requeued (cancel it, or wait for it to end)"
    if state in ("pending", "scheduled"):
        return f"it is {state}: it will run, there is nothing to requeue"
    if as_of is not None and row.updated_at > as_of:
        return f"it changed (now {state}) after the listing this requeue was sent for: requeued once already"
    return ""


def _none_dead(journal: JournalBackend, as_of: Optional[float]) -> str:
    """Why a requeue of every dead job requeued none."""
    dead = journal.counts().get("dead", 0)
    if not dead:
        return "no job is dead"
    return f"the {dead} dead job(s) died after the listing this requeue was sent for: requeued once already"


def _check_id(job_id: Any) -> None:
    if not isinstance(job_id, str) or not job_id or len(job_id) > envelope.MAX_ID:
        raise ValueError(f"job_id must be a non-empty str of at most {envelope.MAX_ID} characters, got {job_id!r}")


__all__ = ["Cancelled", "JobBook", "TERMINAL"]
