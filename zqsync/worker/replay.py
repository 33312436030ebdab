"""The scheduler's journal side: claim the pending jobs of dead owners, stream the due ones to run, prune.

The replay loop claims the pending jobs of dead owners (whose task this worker has) every
``replay_interval`` seconds, then streams the due ones from the journal in batches of
`REPLAY_BATCH`, through the same bounded backlog as new jobs (``scheduler.py``): memory stays
flat however many are pending. A row that cannot be decoded, or names a task this worker does not
have, is dead-lettered. Finished rows are pruned after ``keep_done`` (``keep_dead`` when dead).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import gevent
import gevent.lock
import gevent.queue

from ..errors import ProtocolError
from ..wire import envelope
from .group_commit import GroupCommit, retry_delay
from .jobs import Job
from .journal_api import DIED, JournalBackend, Outcome, Row
from .runner import Runner

log = logging.getLogger("zqsync.worker.scheduler")  # the log lines keep their logger (split off)

#: Journaled jobs read from the journal per replay step.
REPLAY_BATCH = 500


class JournalReplay:
    """The replay half of `JobScheduler` (a mixin: it sets these)."""

    runner: Runner
    journal: Optional[JournalBackend]
    keep_done: float
    keep_dead: float
    replay_interval: float
    _commits: Optional[GroupCommit]
    _backlog: gevent.lock.BoundedSemaphore
    _ready: gevent.queue.Queue
    _foreign: set[str]

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


__all__ = ["REPLAY_BATCH", "JournalReplay"]
