"""The journal's admin calls (``zqsync.jobs``, ``zqsync.requeue``, ``zqsync.purge``), and how a row's
state is named: as ``client.job()`` names it (`row_state`), also in the dashboard and ``zqsync jobs``.

Every call reads and writes the journal from the hub's thread pool: the calling greenlet blocks, the
worker's other greenlets run.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence

import gevent

from ..errors import NoJournal, ProtocolError
from ..wire import envelope
from . import recent
from .journal_api import FINISHED_STATES, JournalBackend, Row

log = logging.getLogger(__name__)

#: Most rows one ``zqsync.jobs`` page returns.
MAX_PAGE = 1000
#: Most journal rows one filtered ``zqsync.jobs`` page reads (``running``/``scheduled``, ``task``, times).
MAX_SCAN = 10_000
#: How a status names a journaled row: these are ``pending`` in the journal, as ``failed`` is ``dead``.
DERIVED = ("running", "scheduled")
#: The journal states a page lists as stored (``dead``: the dead letters, ``failed`` ones included).
UNSPLIT = ("done", "dead", "cancelled", "expired")

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


class JournalCalls:
    """The journal's admin calls of one worker process.

    :param journal: the worker's journal, or ``None`` (every call raises `NoJournal`).
    :param running: the ids of the jobs running in this process now.
    :param flush: blocks until the outcomes recorded so far are in the journal (the scheduler's): every
        call runs it first, so that a job whose status already says it ended is listed as ended.
    """

    def __init__(self, journal: Optional[JournalBackend], running: Callable[[], list[str]],
                 flush: Callable[[], None] = lambda: None) -> None:
        self.journal = journal
        self.running = running
        self.flush = flush

    def jobs(self, state: Optional[str] = None, offset: int = 0, limit: int = 50, task: Optional[str] = None,
             since: Optional[float] = None, until: Optional[float] = None) -> dict[str, Any]:
        """``zqsync.jobs``: the journal's job counts per state, and one page of the rows in ``state``.

        :param state: a journal state (``pending``, ``done``, ``dead``: the dead letters, ``failed`` included,
            ``cancelled``, ``expired``), one a status names (``running``, ``scheduled``: `row_state`;
            ``failed``), or ``None`` for counts only. ``pending`` lists only the rows named ``pending``.
        :param offset: rows to skip (oldest first). :param limit: most rows, at most `MAX_PAGE`.
        :param task: only this task's rows. :param since: only rows last changed at or after (epoch
            seconds). :param until: at or before. With any of these or a status's state, at most
            `MAX_SCAN` rows are read for one page (``"scanned"`` says how many were).
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
        counts = pool.apply(self._counts, (journal, now))
        # "now" is read after the rows: every row listed was last changed at or before it (its as_of).
        return {"now": time.time(), "counts": counts, "running": self.running(), "scanned": scanned, "rows": rows}

    def _page(self, journal: JournalBackend, now: float, state: str, offset: int, limit: int, task: Optional[str],
              since: Optional[float], until: Optional[float]) -> tuple[list[dict[str, Any]], int]:
        """In a native thread: one page of `jobs`, and how many rows were read for it."""
        stored = "pending" if state in DERIVED else "dead" if state == "failed" else state
        if state in UNSPLIT and task is None and since is None and until is None:
            rows = journal.rows((state,), limit=limit, offset=offset)
            return [_summary(row, row_state(row, now, journal.owner_alive)) for row in rows], len(rows)
        page: list[dict[str, Any]] = []
        scanned = skipped = 0
        for row in journal.iter_rows((stored,)):
            scanned += 1
            named = row_state(row, now, journal.owner_alive)
            if _listed(row, named, state, task, since, until):
                skipped += 1
                if skipped > offset:
                    page.append(_summary(row, named))
            if len(page) >= limit or scanned >= MAX_SCAN:
                break
        return page, scanned

    @staticmethod
    def _counts(journal: JournalBackend, now: float) -> dict[str, int]:
        """In a native thread: the journal's counts, ``pending`` split as `row_state` names them."""
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
            of the `jobs` listing acted on), so that the same requeue sent twice requeues once.
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
        """The journal, once the outcomes recorded so far are written (an outcome waits a moment for the
        next group commit); a journal that cannot be written now is read as it is."""
        if self.journal is None:
            raise NoJournal("NoJournal", "this worker keeps no journal: start it with --state-dir DIR or --journal URL")
        try:
            self.flush()
        except Exception as exc:  # a full disk: the rows are still read, and the writer reports the error
            log.debug("outcomes not journaled before an admin call: %s: %s", type(exc).__name__, exc)
        return self.journal


def _listed(row: Row, named: str, state: str, task: Optional[str], since: Optional[float],
            until: Optional[float]) -> bool:
    """Whether a page of ``state`` (``dead``: ``failed`` too) lists ``row``, named ``named``, given the filters."""
    return (named in (state, "failed" if state == "dead" else state) and task in (None, row.task)
            and (since is None or row.updated_at >= since) and (until is None or row.updated_at <= until))


def _summary(row: Row, state: str) -> dict[str, Any]:
    try:
        args = recent.call_text(envelope.decode_request(row.body))
    except ProtocolError as exc:
        args = f"<undecodable: {exc}>"[:recent.TEXT]
    return {"id": row.id, "task": row.task, "args": args, "state": state, "attempts": row.attempts,
            "error": row.error, "enqueued_at": row.created_at, "started_at": row.started_at,
            "finished_at": row.finished_at, "updated_at": row.updated_at, "due": row.next_at or None}


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
