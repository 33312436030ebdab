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
* The replay loop claims the pending jobs of dead owners (whose task this
  worker has) every ``replay_interval`` seconds, then streams the due ones
  from the journal in batches of :data:`REPLAY_BATCH`, through the same
  bounded backlog as new jobs: memory stays flat however many are pending.
  A job that was running when its process died runs alone (no other task
  in this process meanwhile), after its backoff and after the other due jobs.
* A delayed job (``opts.due``) is journaled already marked for replay, with
  its due time as ``next_at``: the replay loop starts it, in due-time order,
  at or after that time, in this process or, after a restart, in the one
  that claims it.
* A job of a task with a ``rate_limit`` takes a turn from its bucket (``ratelimit.py``) before it
  starts; one whose turn is later waits for it in a timer, holding no task slot, then queues to run.
  A plain job waits so only while it finds a backlog place (``max_backlog``, shared with confirmed
  jobs), else in its slot: the worker then reads no more jobs, as when its slots are busy.
* A job past its expiry (``expires=``) is not started: a plain one is counted (``jobs_expired``) and
  logged; a confirmed one is also recorded ``expired`` in the journal. A job waiting for its rate
  limit's turn is looked at again by its expiry at the latest.
* Each attempt tells the :class:`~zqsync.worker.status.JobBook` when it starts
  and how it ends (status, results, long-polls, cancel). A cancelled journaled
  job's start is refused by the journal; a cancelled running one ends in
  :class:`~zqsync.worker.status.Cancelled`, recorded ``cancelled``.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, NamedTuple, Optional

import gevent
import gevent.event
import gevent.lock
import gevent.pool
import gevent.queue

from .. import settings
from ..errors import JobExpired, ProtocolError
from ..wire import envelope
from .group_commit import GroupCommit, retry_delay
from .inline import run_inline
from .journal_api import ALONE, DIED, SHARED, JournalBackend, NewJob, Outcome, Row, Start, open_journal
from .ratelimit import RateLimits
from .registry import Task
from .runner import ErrorInfo, Runner, unsendable
from .status import Cancelled, JobBook

log = logging.getLogger(__name__)

#: Journaled jobs read from the journal per replay step.
REPLAY_BATCH = 500


class Job(NamedTuple):
    """A job on its way through the scheduler."""

    task: Task
    request: envelope.Request
    attempts: int = 0
    durable: bool = False
    admitted: bool = False  # holds a backlog place until it starts
    alone: bool = False  # was running when its process died: runs with no other task beside it
    counted: bool = False  # its next attempt is already counted in the journal (by the insert)
    waited: bool = False  # had its rate limit's turn: starts without taking another


class Confirm(NamedTuple):
    """A confirmed job on its way to the journal, and how to answer its client (in the hub)."""

    task: Task
    request: envelope.Request
    due: float  # epoch seconds, or 0.0: run now
    answer: Callable[[bytes], None]
    counted: bool  # its insert counts the first attempt (NewJob.retry_at)


def build_scheduler(
    runner: Runner, slots: gevent.pool.Pool, journal_url: Optional[str], *, synchronous: str = "NORMAL",
    busy_timeout: float = 30.0, lease: float = settings.JOURNAL_LEASE, **options: Any,
) -> "JobScheduler":
    """A scheduler with the journal at ``journal_url`` (``journal_api.open_journal``; opened and
    registered as a live owner), or without one if ``journal_url`` is ``None``. ``options`` go to
    :class:`JobScheduler`.

    :raises ConfigurationError: a bad URL. :raises sqlite3.Error, psycopg.Error, OSError: the journal cannot be opened.
    """
    journal = (open_journal(journal_url, synchronous=synchronous, busy_timeout=busy_timeout, lease=lease)
               if journal_url else None)
    if journal is not None:
        journal.register()
    return JobScheduler(runner, slots, journal=journal, **options)


class JobScheduler:
    """Dispatches jobs into ``slots`` with retries; journals confirmed jobs when ``journal`` is given.

    :param runner: decodes and runs tasks, and counts.
    :param slots: the worker's task pool; a job starts only when a slot is free.
    :param journal: the confirmed-jobs journal (registered as an owner), or ``None`` (confirm refused).
    :param keep_done: seconds ``done`` rows stay in the journal (duplicate detection).
    :param keep_dead: seconds ``dead`` rows stay in the journal (the dead letters).
    :param replay_interval: seconds between claims and replays of dead owners' pending jobs.
    :param max_backlog: accepted or replayed confirmed jobs waiting for a slot; past it, the
        acknowledgements of newly journaled jobs wait (:meth:`admit`), and replay does.
    """

    def __init__(
        self,
        runner: Runner,
        slots: gevent.pool.Pool,
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

    def discard_plain_pending(self) -> int:
        """Before :meth:`pause` on stop: count and log the plain jobs waiting for a retry, a turn or a slot.

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

    def admit(self, request: envelope.Request, task: Task, answer: Callable[[bytes], None]) -> None:
        """Journal a confirmed job without waiting: ``answer(reply frame)`` is called later, in the hub.

        Never blocks. The job goes to the writer thread, which commits it with
        every job that arrived meanwhile (group commit) and then posts one hub
        callback per batch (:meth:`_answer_batch`) that answers the batch's
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
        expires = request.options.get("expires")
        body = envelope.encode_request("job", request.id, request.task, request.args, request.kwargs,
                                       options={} if expires is None else {"expires": expires})
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
        self._commits.put("add", NewJob(request.id, request.task, body, task.retries, due, retry_at),
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

    def _turn(self, job: Job) -> float:
        """Seconds ``job`` must wait for its rate limit's turn (taken now), or 0.0: it may start."""
        rate = job.task.rate_limit
        return 0.0 if rate is None or job.waited else self.limits.reserve(job.task.name, rate)

    def _wait_turn(self, delay: float, job: Job) -> None:
        """Queue ``job`` to run once its turn comes in ``delay`` seconds (or its expiry, if sooner)."""
        self.limits.waiting(job.task.name, 1)
        gevent.get_hub().loop.update_now()  # the timer counts from now, not from the hub's last wake-up
        timer = gevent.spawn_later(min(delay, self._expires_in(job)), self._turn_came, job)
        self._timers.add(timer)
        timer.link(self._timers.discard)

    def _turn_came(self, job: Job) -> None:
        self.limits.waiting(job.task.name, -1)
        self._ready.put(job._replace(waited=True))

    @staticmethod
    def _expires_in(job: Job) -> float:
        """Seconds until ``job`` expires (infinite: never)."""
        expires = job.request.options.get("expires") if job.durable else job.request.expires
        if expires is None:
            return float("inf")
        return max(0.0, expires - (time.time() if job.durable else time.monotonic()))

    def _expire(self, job: Job) -> bool:
        """Whether ``job`` is past its expiry: then it is counted and logged, and a confirmed one is
        recorded ``expired`` (never run, nor retried)."""
        late = self.runner.expired(job.request, durable=job.durable)
        if late is None:
            return False
        if job.durable:
            error = (JobExpired.__name__, f"job {job.request.id} ({job.task.name}) expired before it started "
                                          f"({late:.3f} s before this attempt could start)", "")
            self._settle(job, Outcome(job.request.id, "expired", job.attempts, 0.0, _describe(error)), "expired",
                         error=error)
        return True

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
        self.book.started(job_id, job.task.name, attempts, keep=keep)
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
        self._settle(job, Outcome(job_id, "pending", attempts, time.time() + delay, _describe(value)),
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
                self._settle(job, Outcome(job.request.id, "dead", attempts, 0.0, _describe(error)), "failed",
                             error=error)
                return
        self.runner.counters["jobs_succeeded"] += 1
        self._settle(job, Outcome(job.request.id, "done", attempts, 0.0, None, stored if job.durable else None),
                     "done", result=value)

    def _cancelled(self, job: Job, attempts: int) -> None:
        self.runner.counters["jobs_cancelled"] += 1
        log.warning("job %s (%s) was cancelled while running (attempt %d)", job.request.id, job.task.name, attempts)
        error = ("JobCancelled", "the job was cancelled while it ran", "")
        self._settle(job, Outcome(job.request.id, "cancelled", attempts, 0.0, _describe(error)), "cancelled",
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
        self._settle(job, Outcome(job.request.id, "dead", attempts, 0.0, _describe(error)),
                     "dead" if job.task.retries else "failed", error=error)

    def _settle(self, job: Job, outcome: Outcome, state: str, *, result: Any = None,
                error: Optional[ErrorInfo] = None) -> None:
        """Journal a confirmed job's outcome (``state`` is how a status reports it) and tell the book."""
        if job.durable and self._commits is not None:  # with the next group commit, or LINGER s from now
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


    def _replay_loop(self) -> None:
        """Claim and replay, forever; a failure is logged at ERROR and retried with backoff."""
        failures = 0
        last_prune = 0.0
        while True:
            try:
                self._claim_and_replay()
                if time.monotonic() - last_prune > max(self.replay_interval, min(60.0, self.keep_done, self.keep_dead)):
                    self._prune()
                    last_prune = time.monotonic()
            except Exception as exc:
                failures += 1
                self.runner.counters["journal_errors"] += 1
                delay = retry_delay(failures, self.replay_interval)
                log.error("journal replay failed (%d in a row), retrying in %.1f s: %s: %s%s",
                          failures, delay, type(exc).__name__, exc, self.journal.repair_hint(exc) if self.journal else "")
                gevent.sleep(delay)
                continue
            failures = 0
            gevent.sleep(self.replay_interval)

    def _claim_and_replay(self) -> None:
        assert self.journal is not None
        pool = gevent.get_hub().threadpool
        claim = pool.apply(self.journal.claim, (self.runner.registry.names(),))
        if claim.claimed:
            log.info("claimed %d pending job(s) of worker processes that are gone", claim.claimed)
        for job_id in claim.died:
            self.runner.counters["jobs_dead"] += 1
            log.error("job %s moved to the dead-letter state: its attempts are exhausted and the %s", job_id, DIED)
        for task, count in claim.foreign.items():
            if task not in self._foreign:
                self._foreign.add(task)
                log.warning("%d pending job(s) of task %r belong to a worker process that is gone, but this "
                            "worker has no such task: left for a worker that has it", count, task)
        while True:
            rows = pool.apply(self.journal.take_replays, (REPLAY_BATCH,))
            for row in rows:
                self._replay(row)
            if len(rows) < REPLAY_BATCH:
                return

    def _prune(self) -> None:
        assert self.journal is not None
        pool = gevent.get_hub().threadpool
        for state, keep in (("done", self.keep_done), ("cancelled", self.keep_done), ("expired", self.keep_done),
                            ("dead", self.keep_dead)):
            pruned = pool.apply(self.journal.purge, ((state,), keep))
            if pruned:
                log.info("pruned %d %s job(s) older than %.0f s from the journal", pruned, state, keep)
        pool.apply(self.journal.sweep_owners)

    def _replay(self, row: Row) -> None:
        task = self.runner.registry.get(row.task)
        try:
            request = envelope.decode_request(row.body)
        except ProtocolError as exc:
            self._bury(row, f"ProtocolError: the journaled body cannot be decoded: {exc}")
            return
        if task is None:  # claimed only for our tasks; a registry does not change while we run
            self._bury(row, f"UnknownTask: no task named {row.task!r}")
            return
        delayed = row.attempts == 0 and row.next_at
        log.info("%s %s (%s), attempt %d", "starting delayed job" if delayed else "replaying journaled job",
                 row.id, row.task, row.attempts + 1)
        if not delayed:  # a delayed job was counted when accepted
            self.runner.counters["jobs_replayed"] += 1
        self._backlog.acquire()
        self._ready.put(Job(task, request, row.attempts, True, admitted=True, alone=row.running > 0))


    def _bury(self, row: Row, error: str) -> None:
        self.runner.counters["jobs_dead"] += 1
        log.error("journaled job %s moved to the dead-letter state: %s", row.id, error)
        assert self._commits is not None
        self._commits.put("record", Outcome(row.id, "dead", row.attempts, 0.0, error))


def _describe(error: ErrorInfo) -> str:
    return f"{error[0]}: {error[1]}"


__all__ = ["Job", "JobScheduler", "build_scheduler"]
