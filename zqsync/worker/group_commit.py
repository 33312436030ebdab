"""GroupCommit: the scheduler's journal writes, made in batches by the journal's writer thread.

The hub queues operations (``journal_writer.py``'s `WriterThread`
carries them): ``add`` (a confirmed job to insert, answered by the
scheduler's batch callback; the confirms read in one turn of the hub's loop
go as one item, or a lone one is written by the hub itself: `GroupCommit.add`),
``start`` (an attempt to count before it runs)
and ``flush`` (wait until what was recorded before it is committed), each
waited for; ``record`` (an attempt's outcome), deferred to the next batch;
and ``stop``. The thread commits every operation of a batch in one SQLite
transaction (group commit: one SQLite or PostgreSQL transaction) and posts the answers back to the hub.

A failed write is loud and never drops an outcome: the outcomes are kept
and retried with backoff, waiting operations get the error, the journal is
marked broken (so confirms are refused at once, naming the cause) and, with
nothing else to write, probed until it can be written again. A journal file
that was deleted or replaced is gone for good.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import gevent
import gevent.event

from .journal import JournalGone
from .journal_api import JournalBackend, NewJob, Outcome
from .journal_writer import WriterThread

log = logging.getLogger(__name__)

#: Most operations one journal transaction carries.
MAX_BATCH = 1000
#: Longest wait, seconds, between retries of a failing journal operation.
MAX_RETRY_DELAY = 10.0
#: A commit in the hub that took longer than this (seconds: the disk stalled it) sends lone confirms to the
#: writer thread for `SLOW_PAUSE` seconds: the hub stalls with its commits, the writer thread does not.
SLOW_COMMIT = 0.02
SLOW_PAUSE = 1.0

#: ``answer_batch(waiting, fresh, refused, error)``: in the hub, after a batch committed (``error`` None)
#: or failed. ``waiting`` holds the batch's ``(op, item, result)`` adds, starts and flushes in order;
#: ``fresh`` per add, ``None`` if the job is new, else the state of the row already under its id;
#: ``refused`` the ids of starts whose row is no longer pending.
AnswerBatch = Callable[[list[tuple[str, Any, Any]], list[Optional[str]], set[str], Optional[Exception]], None]


def _spread(batch: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """A batch's queued items, each hand-over of confirms (``adds``, `GroupCommit.add`) spread into its ``add``s."""
    return [op for entry in batch for op in (entry[1] if entry[0] == "adds" else (entry,))]


def retry_delay(failures: int, base: float) -> float:
    """Seconds to wait after ``failures`` failures in a row: ``base`` doubled each time, capped."""
    return min(MAX_RETRY_DELAY, base * 2 ** min(failures, 16))


class GroupCommit:
    """Journal writes for a scheduler, in batches, in the journal's own thread.

    :param journal: the registered journal.
    :param counters: the worker's counters (``journal_errors`` is counted here).
    :param answer_batch: the scheduler's callback for each batch (`AnswerBatch`).
    """

    def __init__(self, journal: JournalBackend, counters: dict[str, int], answer_batch: AnswerBatch) -> None:
        self.journal = journal
        self._counters = counters
        self._answer_batch = answer_batch
        self._writer = WriterThread(self._loop)
        self._adds: list[tuple[NewJob, Any]] = []  # confirmed jobs read in this hub iteration (`add`)
        self._stopping = False
        self._hub_commits_from = 0.0  # monotonic seconds: lone confirms go to the writer thread until then
        self.gone: Optional[str] = None  # why the journal can never be written again
        self.broken: Optional[str] = None  # why the last write failed, until one succeeds

    def start(self) -> None:
        """Start the writer thread (from the hub's thread)."""
        self._writer.start()

    def add(self, job: NewJob, confirm: Any) -> None:
        """In the hub: journal a confirmed job; ``answer_batch`` answers it once committed. Never blocks.

        The jobs read in one iteration of the hub's loop are handed over together at its end: to the
        writer thread (one group commit); or, a lone job while the thread waits for work, written by the
        hub itself with the deferred outcomes (`JournalBackend.write_now`), which costs no wake-up of
        the thread, no hand-off of the GIL and no wake-up of the hub for the answer. After a commit in the
        hub slower than `SLOW_COMMIT`, lone jobs go to the thread for `SLOW_PAUSE` seconds.
        """
        self._adds.append((job, confirm))
        if len(self._adds) == 1:
            gevent.get_hub().loop.run_callback(self._hand_over)

    def _hand_over(self) -> None:
        adds, self._adds = self._adds, []
        if len(adds) == 1 and not self._stopping and time.monotonic() >= self._hub_commits_from \
                and self._write_now(*adds[0]):
            return
        if adds:  # one item, so one batch (at most ADMISSIONS confirms are in flight)
            self.put("adds", [("add", job, confirm) for job, confirm in adds])

    def _write_now(self, job: NewJob, confirm: Any) -> bool:
        """In the hub: journal ``job`` (with the deferred outcomes) now and answer it, if the writer thread
        waits for work and the journal can commit without waiting; returns whether it did."""
        writer = self._writer
        if not writer.pause():
            return False
        deferred = writer.take_deferred()
        started = time.monotonic()
        try:
            written = self.journal.write_now([job], [item for _, item, _ in deferred])
        except Exception as exc:  # the writer thread retries it, and reports the error if it persists
            log.debug("journaling in the hub failed, handed to the writer thread: %s: %s", type(exc).__name__, exc)
            written = None
        writer.resume([] if written else deferred)
        ended = time.monotonic()
        if ended - started > SLOW_COMMIT:
            self._hub_commits_from = ended + SLOW_PAUSE
        if written is None:
            return False
        self._answer_batch([("add", job, confirm)], written[0], written[1], None)
        return True

    def put(self, op: str, item: Any, result: Any = None) -> None:
        """Queue one operation for the next batch, waking the thread; never blocks."""
        self._writer.put((op, item, result))

    def defer(self, op: str, item: Any) -> None:
        """Queue one operation for the next batch without waking the thread (at most about
        ``journal_writer.LINGER`` s later); never blocks."""
        self._writer.defer((op, item, None))

    def wait(self, op: str, item: Any) -> Any:
        """Queue one operation and block the calling greenlet until its batch committed.

        :returns: for a ``start``, whether the attempt may run (its row is still pending).
        :raises sqlite3.Error, psycopg.Error, JournalGone: the batch could not be written.
        """
        result = gevent.event.AsyncResult()
        self.put(op, item, result)
        return result.get()

    def stop(self, timeout: float = 30.0) -> None:
        """Write what is queued, end the thread and stop answering; blocks up to ``timeout`` seconds."""
        done = gevent.event.AsyncResult()
        self._stopping = True
        self._hand_over()
        self.put("stop", None, done)
        done.get(timeout=timeout)
        self._writer.close()

    def _loop(self, writer: WriterThread) -> None:
        """The writer thread's body: every greenlet-side effect is posted to the hub. Returns after a
        ``stop``."""
        carried: list[Outcome] = []
        failures = 0
        while True:
            batch = _spread(writer.next_batch(not (carried or self.broken), MAX_BATCH))
            waiting = [(op, item, result) for op, item, result in batch if op in ("add", "start", "flush")]
            adds = [item for op, item, _ in batch if op == "add"]
            starts = [item for op, item, _ in batch if op == "start"]
            records = carried + [item for op, item, _ in batch if op == "record"]
            fresh: list[Optional[str]] = []
            refused: set[str] = set()
            try:
                if waiting or records:
                    fresh, refused = self.journal.write_all(adds, records, starts)
                elif self.broken:
                    self.journal.probe()
            except Exception as exc:
                failures += 1
                carried = records
                self._failed(exc, failures, len(records))
                writer.post(self._answer_batch, waiting, [], set(), exc)
                if self._finish_stop(batch, carried):
                    return
                writer.sleep(retry_delay(failures, 0.05))
                continue
            if waiting or records:  # a probe alone is no proof: what was refused may still not fit
                if failures:
                    log.warning("the journal was written again after %d failure(s)", failures)
                failures = 0
            carried, self.broken = [], None
            if waiting:
                writer.post(self._answer_batch, waiting, fresh, refused, None)
            if self._finish_stop(batch, carried):
                return

    def _failed(self, exc: Exception, failures: int, outcomes: int) -> None:
        """In the writer thread: mark the journal broken at once (so confirms are refused), count in the hub."""
        self._writer.post(self._count_error)
        self.broken = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, JournalGone) and self.gone is None:
            self.gone = str(exc)
        log.error("journal write failed (%d in a row; %d outcome(s) kept to retry): %s: %s",
                  failures, outcomes, type(exc).__name__, exc)

    def _count_error(self) -> None:
        self._counters["journal_errors"] += 1

    def _finish_stop(self, batch: list[tuple[str, Any, Any]], carried: list[Outcome]) -> bool:
        """Answer a ``stop`` item in ``batch``; returns whether there was one (the writer then ends)."""
        for op, _, result in batch:
            if op == "stop":
                if carried:
                    log.error("stopping with %d outcome(s) not journaled: those jobs stay pending and will run "
                              "again after a restart", len(carried))
                self._writer.post(result.set, True)
                return True
        return False
