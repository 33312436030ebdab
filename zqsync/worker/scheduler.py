"""JobScheduler: runs jobs in the worker's task slots, retries them, and journals confirmed ones.

* Plain jobs (PUSH/PULL) run at most once per delivery; a failed one is
  retried in memory per the task's ``retries``/``backoff``.
* Confirmed jobs are journaled first (``journal.py``), in batches: one
  writer greenlet commits every job that arrived meanwhile in one SQLite
  transaction (group commit), in the hub's thread pool so the hub keeps
  running. Only then is the job acknowledged. Attempts, retries and the
  final ``done`` or ``dead`` state are journaled too, so a job interrupted by
  a crash is replayed: at least once.
* Pending jobs of worker processes that no longer exist are claimed and
  replayed at start and every ``orphan_interval`` seconds.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, NamedTuple, Optional

import gevent
import gevent.event
import gevent.lock
import gevent.pool
import gevent.queue

from .. import protocol
from ..errors import ProtocolError
from .journal import Journal, Outcome, Row
from .registry import Task
from .runner import ErrorInfo, Runner

log = logging.getLogger(__name__)

#: Most operations one journal transaction carries.
MAX_BATCH = 1000


class Job(NamedTuple):
    """A job on its way through the scheduler."""

    task: Task
    request: protocol.Request
    attempts: int = 0
    durable: bool = False
    admitted: bool = False  # holds a backlog place until it starts


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one we may not signal counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobScheduler:
    """Dispatches jobs into ``slots`` with retries; journals confirmed jobs when ``journal`` is given.

    :param runner: decodes and runs tasks, and counts.
    :param slots: the worker's task pool; a job starts only when a slot is free.
    :param journal: the confirmed-jobs journal, or ``None`` (confirm refused).
    :param retention: seconds ``done`` rows stay in the journal for duplicate detection.
    :param orphan_interval: seconds between claims of dead processes' pending jobs.
    :param max_backlog: accepted confirmed jobs waiting for a slot; past it,
        :meth:`accept` waits, and so the clients' acknowledgements do.
    """

    def __init__(
        self,
        runner: Runner,
        slots: gevent.pool.Pool,
        *,
        journal: Optional[Journal] = None,
        retention: float = 3600.0,
        orphan_interval: float = 2.0,
        max_backlog: int = 1000,
    ) -> None:
        self.runner = runner
        self.slots = slots
        self.journal = journal
        self.retention = retention
        self.orphan_interval = orphan_interval
        self._ready: gevent.queue.Queue = gevent.queue.Queue()
        self._writes: gevent.queue.Queue = gevent.queue.Queue()
        self._greenlets: list[gevent.Greenlet] = []
        self._timers: set[gevent.Greenlet] = set()
        self._backlog = gevent.lock.BoundedSemaphore(max_backlog)
        if journal is not None:
            runner.confirm = self.accept

    def start(self) -> None:
        """Start dispatching, and with a journal, writing and replaying."""
        self._greenlets.append(gevent.spawn(self._dispatch))
        if self.journal is not None:
            self._greenlets += [gevent.spawn(self._write_loop), gevent.spawn(self._orphan_loop)]

    def greenlets(self) -> list[gevent.Greenlet]:
        """Every greenlet the scheduler runs (its loops and retry timers)."""
        return [*self._greenlets, *self._timers]

    def pause(self) -> None:
        """Start no more jobs (retries and backlog included); jobs not started stay pending."""
        for timer in list(self._timers):
            timer.kill(block=False)
        gevent.killall(self._greenlets[:1])

    def discard_plain_pending(self) -> int:
        """Before :meth:`pause` on stop: count and log the plain jobs waiting for a retry or a slot.

        They are kept only in memory, so they are lost with the process; confirmed
        ones stay pending in the journal. Returns how many there are.
        """
        waiting = [timer.args[0] for timer in self._timers] + list(self._ready.queue)
        plain = [job for job in waiting if not job.durable]
        if plain:
            counters = self.runner.counters
            counters["jobs_discarded_on_stop"] = counters.get("jobs_discarded_on_stop", 0) + len(plain)
            log.warning("dropped %d pending plain job retr%s on shutdown (kept only in memory): %s", len(plain),
                        "y" if len(plain) == 1 else "ies", ", ".join(f"{job.request.id} ({job.task.name})" for job in plain))
        return len(plain)

    def stop(self) -> None:
        """Pause, then flush what is still to be journaled and close the journal."""
        self.pause()
        if self.journal is not None:
            done = gevent.event.AsyncResult()
            self._writes.put(("stop", None, done))
            done.get(timeout=30)
            gevent.killall(self._greenlets[1:])
            self.journal.close()

    # -- entry points ----------------------------------------------------

    def run_plain(self, frame: bytes) -> None:
        """Run a job received on the jobs socket (called in a slot)."""
        decoded = self.runner.decode_job(frame)
        if decoded is not None:
            self._attempt(Job(*decoded))

    def accept(self, request: protocol.Request, task: Task) -> bytes:
        """Journal a confirmed job, then acknowledge it; returns the reply frame.

        Blocks the calling greenlet until the journal transaction holding the
        job has committed. A job id seen before is acknowledged as a duplicate
        and not run again.
        """
        body = protocol.encode_request("job", request.id, request.task, request.args, request.kwargs)
        self._backlog.acquire()
        try:
            new = self._write("add", (request.id, request.task, body))
        except BaseException:
            self._backlog.release()
            raise
        if new:
            self._ready.put(Job(task, request, 0, True, admitted=True))
        else:
            self._backlog.release()
            self.runner.counters["confirmed_duplicates"] += 1
        return protocol.encode_result(request.id, {"job_id": request.id, "duplicate": not new})

    # -- execution -------------------------------------------------------

    def _dispatch(self) -> None:
        while True:
            job = self._ready.get()
            self.slots.wait_available()
            if job.admitted:
                self._backlog.release()
                job = job._replace(admitted=False)
            self.slots.spawn(self._attempt, job)

    def _attempt(self, job: Job) -> None:
        ok, value = self.runner.run(job.task, job.request)
        attempts = job.attempts + 1
        if ok:
            self.runner.counters["jobs_succeeded"] += 1
            self._settle(job, Outcome(job.request.id, "done", attempts, 0.0, None))
            return
        delay = job.task.retry_delay(attempts)
        if delay is None:
            self._give_up(job, attempts, value)
            return
        self.runner.counters["jobs_retried"] += 1
        log.warning("job %s (%s) failed, attempt %d; retrying in %.3f s: %s: %s",
                    job.request.id, job.task.name, attempts, delay, value[0], value[1])
        self._settle(job, Outcome(job.request.id, "pending", attempts, time.time() + delay, _describe(value)))
        self._later(delay, job._replace(attempts=attempts))

    def _give_up(self, job: Job, attempts: int, error: ErrorInfo) -> None:
        self.runner.counters["jobs_failed"] += 1
        if job.task.retries:
            self.runner.counters["jobs_dead"] += 1
        where = " and moved to the dead-letter state" if job.durable else ""
        log.error("job %s (%s) failed after %d attempt(s)%s: %s: %s\n%s",
                  job.request.id, job.task.name, attempts, where, *error)
        self._settle(job, Outcome(job.request.id, "dead", attempts, 0.0, _describe(error)))

    def _settle(self, job: Job, outcome: Outcome) -> None:
        if job.durable:
            self._writes.put(("record", outcome, None))

    def _later(self, delay: float, job: Job) -> None:
        timer = gevent.spawn_later(delay, self._ready.put, job)
        self._timers.add(timer)
        timer.link(self._timers.discard)

    # -- the journal -----------------------------------------------------

    def _write(self, op: str, item: Any) -> Any:
        result = gevent.event.AsyncResult()
        self._writes.put((op, item, result))
        return result.get()

    def _write_loop(self) -> None:
        assert self.journal is not None
        journal = self.journal
        pool = gevent.get_hub().threadpool
        while True:
            batch = [self._writes.get()]
            while len(batch) < MAX_BATCH and not self._writes.empty():
                batch.append(self._writes.get_nowait())
            adds = [(item, result) for op, item, result in batch if op == "add"]
            records = [item for op, item, _ in batch if op == "record"]
            try:
                if adds or records:
                    fresh = pool.apply(journal.write, ([item for item, _ in adds], records), {"owner_pid": os.getpid()})
                    for (_, result), new in zip(adds, fresh):
                        result.set(new)
            except Exception as exc:  # the journal is unusable: fail these acks, keep serving calls
                log.exception("journal write failed")
                for _, result in adds:
                    result.set_exception(exc)
            for op, _, result in batch:
                if op == "stop":
                    result.set(True)

    def _orphan_loop(self) -> None:
        assert self.journal is not None
        pool = gevent.get_hub().threadpool
        last_prune = 0.0
        while True:
            rows = pool.apply(self.journal.claim_orphans, (os.getpid(), pid_alive))
            for row in rows:
                self._replay(row)
            if time.monotonic() - last_prune > 60:
                pool.apply(self.journal.prune, (self.retention,))
                last_prune = time.monotonic()
            gevent.sleep(self.orphan_interval)

    def _replay(self, row: Row) -> None:
        try:
            request = protocol.decode_request(row.body)
        except ProtocolError:
            log.error("journaled job %s cannot be decoded; leaving it pending", row.id)
            return
        task = self.runner.registry.get(row.task)
        if task is None:
            log.error("journaled job %s names task %r, which this worker does not have", row.id, row.task)
            return
        log.info("replaying journaled job %s (%s), attempt %d", row.id, row.task, row.attempts + 1)
        self._later(max(0.0, row.next_at - time.time()), Job(task, request, row.attempts, True))


def _describe(error: ErrorInfo) -> str:
    return f"{error[0]}: {error[1]}"


__all__ = ["Job", "JobScheduler"]

