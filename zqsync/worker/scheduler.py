"""JobScheduler: runs jobs in the worker's task slots, retries them, and journals confirmed ones.

* Plain jobs (PUSH/PULL) run at most once per delivery; a failed one is
  retried in memory per the task's ``retries``/``backoff``.
* Confirmed jobs are journaled first (``journal.py``), in batches: one
  writer thread (``group_commit.py``, ``journal_writer.py``) commits every job that arrived meanwhile
  in one SQLite transaction (group commit), with no thread-pool hop, while the hub keeps
  running. Only then is the job acknowledged: one hub callback per batch
  answers all its jobs, and no greenlet waits for a confirm. Each attempt is counted in
  the journal before it starts; outcomes, retries and the final ``done`` or
  ``dead`` state are journaled after; so a job interrupted by a crash is
  replayed (at least once), and one that keeps killing its process is
  dead-lettered after ``retries + 1`` attempts.
* A failed journal write is logged at ERROR and retried with backoff:
  outcomes are kept until written, a confirm is answered with a
  ``JournalUnavailable`` error instead of an acknowledgement.
* The replay loop (``replay.py``) claims the pending jobs of dead owners (whose task this
  worker has) every ``replay_interval`` seconds, then streams the due ones
  from the journal in bounded batches, through the same
  bounded backlog as new jobs: memory stays flat however many are pending.
  A job that was running when its process died runs alone (no other task
  in this process meanwhile), after its backoff and after the other due jobs.
* A delayed job (``opts.due``) is journaled already marked for replay, with
  its due time as ``next_at``: the replay loop starts it, in due-time order,
  at or after that time, in this process or, after a restart, in the one
  that claims it.
* Rate limits and expiry (``pacing.py``): a job whose rate limit's turn is later waits for it in a
  timer, holding no task slot, then queues to run. A plain job waits so only while it finds a
  backlog place (``max_backlog``, shared with confirmed jobs), else in its slot: the worker then
  reads no more jobs, as when its slots are busy. A job past its expiry is not started.
* Each attempt tells the `JobBook` when it starts
  and how it ends (status, results, long-polls, cancel). A cancelled journaled
  job's start is refused by the journal; a cancelled running one ends in
  `Cancelled`, recorded ``cancelled``.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Optional

import gevent
import gevent.event
import gevent.lock
import gevent.queue

from .. import settings
from ..errors import ProtocolError
from ..wire import envelope
from .canvas import join_for
from .confirming import Confirming
from .group_commit import GroupCommit
from .inline import TaskSlots, run_inline
from .jobs import Confirm, Job
from .journal_api import ALONE, SHARED, JournalBackend, Outcome, Start, open_journal
from .pacing import Pacing, describe
from .ratelimit import RateLimits
from .replay import JournalReplay
from .runner import ErrorInfo, Runner, unsendable
from .status import Cancelled, JobBook

log = logging.getLogger(__name__)


def build_scheduler(
    runner: Runner, slots: TaskSlots, journal_url: Optional[str], *, synchronous: str = "NORMAL",
    busy_timeout: float = 30.0, lease: float = settings.JOURNAL_LEASE, **options: Any,
) -> "JobScheduler":
    """A scheduler with the journal at ``journal_url`` (``journal_api.open_journal``; opened and
    registered as a live owner), or without one if ``journal_url`` is ``None``. ``options`` go to
    `JobScheduler`.

    :raises ConfigurationError: a bad URL. :raises sqlite3.Error, psycopg.Error, OSError: the journal cannot be opened.
    """
    journal = (open_journal(journal_url, synchronous=synchronous, busy_timeout=busy_timeout, lease=lease)
               if journal_url else None)
    if journal is not None:
        journal.register()
    return JobScheduler(runner, slots, journal=journal, **options)


class JobScheduler(Confirming, Pacing, JournalReplay):
    """Dispatches jobs into ``slots`` with retries; journals confirmed jobs when ``journal`` is given.

    :param runner: decodes and runs tasks, and counts.
    :param slots: the worker's task pool; a job starts only when a slot is free.
    :param journal: the confirmed-jobs journal (registered as an owner), or ``None`` (confirm refused).
    :param keep_done: seconds ``done`` rows stay in the journal (duplicate detection).
    :param keep_dead: seconds ``dead`` rows stay in the journal (the dead letters).
    :param replay_interval: seconds between claims and replays of dead owners' pending jobs.
    :param max_backlog: accepted or replayed confirmed jobs waiting for a slot; past it, the
        acknowledgements of newly journaled jobs wait (`admit`), and replay does.
    """

    def __init__(
        self,
        runner: Runner,
        slots: TaskSlots,
        *,
        journal: Optional[JournalBackend] = None,
        keep_done: float = settings.KEEP_DONE,
        keep_dead: float = settings.KEEP_DEAD,
        replay_interval: float = 0.5,
        max_backlog: int = 1000,
    ) -> None:
        self.runner = runner
        self.slots = slots
        self.journal = journal
        self.keep_done, self.keep_dead = keep_done, keep_dead
        self.replay_interval = replay_interval
        self._ready: gevent.queue.Queue = gevent.queue.Queue()
        self._commits = None if journal is None else GroupCommit(journal, runner.counters, self._answer_batch)
        self._greenlets: list[gevent.Greenlet] = []
        self._timers: set[gevent.Greenlet] = set()
        self._backlog = gevent.lock.BoundedSemaphore(max_backlog)
        self._foreign: set[str] = set()
        self._parked: collections.deque[Confirm] = collections.deque()  # journaled, waiting for a backlog place
        self._paused = False
        self._holding: Optional[Job] = None  # taken from the ready queue, waiting for a slot
        self._counting = 0  # confirmed jobs whose first attempt is counted by their insert, not started yet
        self.book = JobBook(journal, keep_done, flush=self.flush)
        #: the rate limits' buckets of this process (``zqsync.stats``' ``rate_limited``)
        self.limits = RateLimits()
        for key in ("confirmed_refused", "journal_errors", "jobs_cancelled"):
            runner.counters.setdefault(key, 0)
        if journal is not None:
            runner.confirm = self.admit

    def start(self) -> None:
        """Start dispatching, and with a journal, writing and replaying."""
        self._greenlets.append(gevent.spawn(self._dispatch))
        if self._commits is not None:
            self._commits.start()
            self._greenlets.append(gevent.spawn(self._replay_loop))

    def greenlets(self) -> list[gevent.Greenlet]:
        """Every greenlet the scheduler runs (its loops and retry timers)."""
        return [*self._greenlets, *self._timers]

    def pause(self) -> None:
        """Start no more jobs (retries and backlog included); jobs not started stay pending."""
        for timer in list(self._timers):
            timer.kill(block=False)
        self._paused = True
        dispatcher = self._greenlets[:1]
        if dispatcher and dispatcher[0] not in self.slots:  # waiting (one running a job inline ends with it)
            gevent.killall(dispatcher)

    def depth(self) -> dict[str, int]:
        """Jobs this process holds and has not started: ``queued`` (ready, waiting for a slot, or journaled
        and waiting for a backlog place) and ``delayed`` (waiting out a retry's backoff or a rate limit's
        turn). Plain jobs not read yet wait in the jobs socket's queue, which ZeroMQ does not count."""
        return {"queued": self._ready.qsize() + (self._holding is not None) + len(self._parked),
                "delayed": len(self._timers)}

    def discard_plain_pending(self) -> int:
        """Before `pause` on stop: count and log the plain jobs waiting for a retry, a turn or a slot.

        They are kept only in memory, so they are lost with the process; confirmed
        ones stay pending in the journal. Returns how many there are.
        """
        waiting = [timer.args[0] for timer in self._timers] + list(self._ready.queue)
        plain = [job for job in waiting if not job.durable]
        if plain:
            counters = self.runner.counters
            counters["jobs_discarded_on_stop"] = counters.get("jobs_discarded_on_stop", 0) + len(plain)
            log.warning("dropped %d pending plain job(s) (waiting for a retry or a rate limit's turn) on shutdown "
                        "(kept only in memory): %s", len(plain),
                        ", ".join(f"{job.request.id} ({job.task.name})" for job in plain))
        return len(plain)

    def stop(self) -> None:
        """Pause, then flush what is still to be journaled and close the journal."""
        self.pause()
        if self._commits is not None and self.journal is not None:
            self._uncount_unstarted(self._commits)
            self._commits.stop()
            gevent.killall(self._greenlets[1:])
            self.journal.close()

    def _uncount_unstarted(self, commits: GroupCommit) -> None:
        """On stop: jobs whose first attempt their insert counted, but which never started, go back to
        plain pending rows (attempts 0, not running), so the next worker runs them as new, not alone."""
        waiting = [job.request.id for job in [self._holding, *self._ready.queue] if job is not None and job.counted]
        waiting += [confirm.request.id for confirm in self._parked if confirm.counted]
        for job_id in waiting:
            commits.defer("record", Outcome(job_id, "pending", 0, 0.0, None))
        if waiting:
            log.info("%d journaled job(s) not started before the stop stay pending", len(waiting))

    # -- entry points ----------------------------------------------------

    def run_plain(self, frame: bytes) -> None:
        """Run a job received on the jobs socket (called in a slot)."""
        decoded = self.runner.decode_job(frame)
        if decoded is None:
            return
        job = Job(*decoded)
        delay = self._turn(job)
        if delay and self._backlog.acquire(blocking=False):
            self._wait_turn(delay, job._replace(admitted=True))
            return
        if delay:  # no backlog place: it waits in its slot, and the worker reads no more jobs meanwhile
            self.limits.waiting(job.task.name, 1)
            try:
                gevent.sleep(min(delay, self._expires_in(job)))
            finally:
                self.limits.waiting(job.task.name, -1)
        self._attempt(job)

    # -- execution -------------------------------------------------------

    def _dispatch(self) -> None:
        """Start ready jobs as slots free up, each run inline in this greenlet (``inline.py``: no greenlet
        spawned for a job that does not yield). A job that yields hands dispatching over to a new
        greenlet (``_greenlets[0]``) and this one ends with the job."""
        current = gevent.getcurrent()
        while self._greenlets[0] is current and not self._paused:
            job = self._holding = self._ready.get()
            delay = self._turn(job)
            if delay:
                self._holding = None
                self._wait_turn(delay, job)
                continue
            if not job.alone:
                self.slots.wait_available()
            self._holding = None
            if job.admitted:
                self._free_place()
                job = job._replace(admitted=False)
            self._counting -= job.counted
            if job.alone:
                self._run_alone(job)
                continue
            try:
                if not run_inline(self.slots, self._hand_off, self._attempt, job):
                    return
            except Exception:  # pragma: no cover - _attempt reports a task's own errors
                log.exception("job %s (%s) could not be run", job.request.id, job.task.name)

    def _hand_off(self) -> None:
        """In the hub: the job run inline yielded; a new greenlet takes over dispatching."""
        if not self._paused:
            self._greenlets[0] = gevent.spawn(self._dispatch)

    def _run_alone(self, job: Job) -> None:
        """Run a job suspected of killing its process with every other slot held, so it takes no
        healthy job down with it. Blocks dispatching until it ends."""
        log.warning("job %s (%s) was running when its worker process died; running it alone (attempt %d of %d)",
                    job.request.id, job.task.name, job.attempts + 1, job.task.retries + 1)
        gate = gevent.event.Event()
        try:
            for _ in range(self.slots.size - 1):
                self.slots.spawn(gate.wait)
            self.slots.spawn(self._attempt, job).join()
        finally:
            gate.set()

    def _attempt(self, job: Job) -> None:
        if self._expire(job):
            return
        attempts = job.attempts + 1
        job_id = job.request.id
        if not job.durable and self.book.take_cancel(job_id):
            log.info("job %s (%s) was cancelled before this attempt: skipped", job_id, job.task.name)
            return
        if job.durable and not job.counted and not self._count_start(job, attempts):
            return
        keep = not job.durable and (job.task.store_result or bool(job.request.options.get("store")))
        self.book.started(job_id, job.task.name, attempts, keep=keep, request=job.request, confirmed=job.durable)
        try:
            ok, value, delay = self.runner.run_job(job.task, job.request, attempts)
        except Cancelled:
            self._cancelled(job, attempts)
            return
        finally:
            self.book.stopped(job_id)
        if ok:
            self._succeeded(job, attempts, value, keep)
            return
        if delay is None:
            self._give_up(job, attempts, value)
            return
        self.runner.counters["jobs_retried"] += 1
        log.warning("job %s (%s) failed, attempt %d; retrying in %.3f s: %s: %s",
                    job_id, job.task.name, attempts, delay, value[0], value[1])
        self._settle(job, Outcome(job_id, "pending", attempts, time.time() + delay, describe(value)),
                     "scheduled", error=value)
        self._later(delay, job._replace(attempts=attempts, counted=False, waited=False))

    def _succeeded(self, job: Job, attempts: int, value: Any, keep: bool) -> None:
        """Settle a job that returned ``value``; one whose result is to be kept (journaled, or kept on
        request) but cannot be sent back fails, without a retry: it would return the same."""
        stored = None
        if job.durable or keep:
            try:
                stored = envelope.encode_result(job.request.id, value)
            except ProtocolError as exc:
                self.runner.counters["jobs_failed"] += 1
                error = unsendable(job.task, exc)
                log.error("job %s (%s) failed: %s: %s", job.request.id, job.task.name, *error[:2])
                self._settle(job, Outcome(job.request.id, "dead", attempts, 0.0, describe(error)), "failed",
                             error=error)
                return
        self.runner.counters["jobs_succeeded"] += 1
        if not job.durable:  # nothing to journal: only the book hears of it (no Outcome made per plain job)
            self.book.settled(job.request.id, "done", result=value)
            return
        self._settle(job, Outcome(job.request.id, "done", attempts, 0.0, None, stored), "done", result=value)

    def _cancelled(self, job: Job, attempts: int) -> None:
        self.runner.counters["jobs_cancelled"] += 1
        log.warning("job %s (%s) was cancelled while running (attempt %d)", job.request.id, job.task.name, attempts)
        error = ("JobCancelled", "the job was cancelled while it ran", "")
        self._settle(job, Outcome(job.request.id, "cancelled", attempts, 0.0, describe(error)), "cancelled",
                     error=error)

    def _count_start(self, job: Job, attempts: int) -> bool:
        """Journal that attempt ``attempts`` starts, before it does; ``False`` if that fails (retried later)
        or the job was cancelled meanwhile (never run)."""
        backoff = job.task.backoff_for(attempts)
        start = Start(job.request.id, ALONE if job.alone else SHARED, time.time() + backoff)
        try:
            assert self._commits is not None  # only confirmed jobs are durable
            if not self._commits.wait("start", start):
                log.info("job %s (%s) was cancelled before it started: not run", job.request.id, job.task.name)
                return False
        except Exception as exc:
            delay = max(backoff, 1.0)
            log.error("job %s (%s) not started: its attempt could not be journaled; retrying in %.1f s: %s: %s",
                      job.request.id, job.task.name, delay, type(exc).__name__, exc)
            self._later(delay, job)
            return False
        return True

    def _give_up(self, job: Job, attempts: int, error: ErrorInfo) -> None:
        self.runner.counters["jobs_failed"] += 1
        if job.task.retries:
            self.runner.counters["jobs_dead"] += 1
        where = " and moved to the dead-letter state" if job.durable else ""
        log.error("job %s (%s) failed after %d attempt(s)%s: %s: %s\n%s",
                  job.request.id, job.task.name, attempts, where, *error)
        self._settle(job, Outcome(job.request.id, "dead", attempts, 0.0, describe(error)),
                     "dead" if job.task.retries else "failed", error=error)

    def _settle(self, job: Job, outcome: Outcome, state: str, *, result: Any = None,
                error: Optional[ErrorInfo] = None) -> None:
        """Journal a confirmed job's outcome (``state`` is how a status reports it) and tell the book."""
        if job.durable and self._commits is not None:  # with the next group commit, or LINGER s from now
            join = join_for(job.request, self.runner.registry) if outcome.state != "pending" else None
            if join is not None:  # finished: a chain's or chord's successor may be due (canvas.py)
                outcome = outcome._replace(join=join)
            self._commits.defer("record", outcome)
        self.book.settled(job.request.id, state, result=result, error=error, due=outcome.next_at)

    def _later(self, delay: float, job: Job) -> None:
        timer = gevent.spawn_later(delay, self._ready.put, job)
        self._timers.add(timer)
        timer.link(self._timers.discard)

    # -- the journal -----------------------------------------------------

    def flush(self) -> None:
        """Block the calling greenlet until every outcome recorded so far is committed (outcomes go to the
        journal a moment after their attempt ends, with the next group commit).

        :raises sqlite3.Error, psycopg.Error, JournalGone: the journal could not be written (the outcomes are kept to retry).
        """
        if self._commits is not None:
            self._commits.wait("flush", None)


__all__ = ["Job", "JobScheduler", "build_scheduler"]
