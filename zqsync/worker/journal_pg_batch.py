"""One group commit of the PostgreSQL journal (``journal_pg.py``'s ``write_all``): its statements.

A batch holds the writer thread's confirmed jobs to insert, outcomes to store and attempts to count.
Each kind is one statement over ``unnest`` of arrays (sent in binary, ``%b``), so a batch costs the same
few statements whatever its size. Most batches go as **one statement**, `BATCH` (the three as
data-modifying ``WITH`` queries), run on its own in autocommit: it is its own transaction, committed by
the server before the answer comes back, so the batch costs one round trip and its commit's WAL flush
(no ``BEGIN``, no ``COMMIT``). The parts of one statement see the same snapshot and must not write a row
twice, so a batch where one id both finishes an attempt and starts the next, or with a canvas join
(``journal_api.Join``: it reads the members' outcomes under a lock), goes statement by statement in
one transaction instead (`Batch.in_steps`).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional

import psycopg

from .journal_api import OUTCOME_COLUMNS, SHARED, Join, NewJob, Outcome, Start

OUTCOMES = ("UPDATE zqsync_jobs j SET state = o.state, attempts = o.attempts, next_at = o.next_at, error = o.error,"
            " result = o.result, running = 0, updated_at = %b, finished_at = CASE WHEN o.state = 'pending' THEN NULL"
            " ELSE %b END FROM unnest(%b::text[], %b::text[], %b::int[], %b::float8[], %b::text[], %b::bytea[])"
            " AS o(id, state, attempts, next_at, error, result) WHERE j.id = o.id AND j.state <> 'cancelled'")
STARTS = ("UPDATE zqsync_jobs j SET attempts = j.attempts + 1, running = s.running, next_at = s.retry_at,"
          " updated_at = %b, started_at = %b FROM unnest(%b::text[], %b::smallint[], %b::float8[])"
          " AS s(id, running, retry_at) WHERE j.id = s.id AND j.state = 'pending' RETURNING j.id")
INSERT = ("INSERT INTO zqsync_jobs (id, task, body, state, owner, retries, created_at, updated_at, next_at, replay,"
          " attempts, running, started_at) SELECT n.id, n.task, n.body, 'pending', %b, n.retries, %b, %b, n.next_at,"
          " n.replay, n.attempts, n.running, n.started_at FROM unnest(%b::text[], %b::text[], %b::bytea[],"
          " %b::int[], %b::float8[], %b::smallint[], %b::int[], %b::smallint[], %b::float8[])"
          " AS n(id, task, body, retries, next_at, replay, attempts, running, started_at)"
          " ON CONFLICT (id) DO NOTHING RETURNING id")
#: The whole batch in one statement: rows ``(True, id)`` per job inserted, ``(False, id)`` per attempt counted.
BATCH = (f"WITH done AS ({OUTCOMES}), begun AS ({STARTS}), added AS ({INSERT})"
         " SELECT true, id FROM added UNION ALL SELECT false, id FROM begun")


class Batch:
    """The statements' parameters for one ``write_all``; the last outcome of an id wins.

    :param token: the owner of the inserted rows.
    :param jobs: `NewJob` tuples; ``outcomes`` and ``starts`` as ``JournalBackend.write_all`` takes them.
    """

    def __init__(self, token: Optional[str], jobs: Iterable[tuple[Any, ...]], outcomes: Iterable[Outcome],
                 starts: Iterable[Start]) -> None:
        now = time.time()
        self.now = now
        self.new = [NewJob(*job) for job in jobs]
        done = list({o.id: o for o in outcomes}.values())
        begun = list(starts)
        self.joins: list[Join] = [join for _, join in sorted({o.join.key: o.join for o in done if o.join}.items())]
        self.started = {s.id for s in begun}
        self.at_once = not self.joins and not self.started.intersection(o.id for o in done)
        self.outcomes = (now, now, *([getattr(o, name) for o in done] for name in OUTCOME_COLUMNS))
        self.starts = (now, now, [s.id for s in begun], [s.running for s in begun], [s.retry_at for s in begun])
        go = [job.retry_at > 0 for job in self.new]
        self.inserts = (token, now, now, [job.id for job in self.new], [job.task for job in self.new],
                        [job.body for job in self.new], [job.retries for job in self.new],
                        [job.retry_at if first else job.due for job, first in zip(self.new, go)],
                        [int(job.due > 0) for job in self.new], [int(first) for first in go],
                        [SHARED if first else 0 for first in go], [now if first else None for first in go])
        self.has_outcomes = bool(done)

    def at_once_rows(self, db: psycopg.Connection) -> tuple[set[str], set[str]]:
        """Run `BATCH` (``db`` in autocommit: its own transaction); the ids inserted and the ids counted."""
        rows = db.execute(BATCH, (*self.outcomes, *self.starts, *self.inserts)).fetchall()
        return {row[1] for row in rows if row[0]}, {row[1] for row in rows if not row[0]}

    def in_steps(self, db: psycopg.Connection) -> tuple[set[str], set[str]]:
        """Run the statements one by one (``db`` in a transaction): outcomes first, so an attempt counted
        after its previous one's outcome sees it; the joins are the caller's. Same answer as `at_once_rows`."""
        if self.has_outcomes:
            db.execute(OUTCOMES, self.outcomes)
        counted = {row[0] for row in db.execute(STARTS, self.starts).fetchall()} if self.started else set()
        inserted = {row[0] for row in db.execute(INSERT, self.inserts).fetchall()} if self.new else set()
        return inserted, counted

    def answers(self, db: psycopg.Connection, inserted: set[str]) -> list[Optional[str]]:
        """Per new job, ``None`` if it was ``inserted``, else the state of the row already under its id."""
        answers: list[Optional[str]] = []
        for job in self.new:
            answers.append(None if job.id in inserted else job.id)
            inserted.discard(job.id)  # a second copy in the same batch is a duplicate of the first
        known = [job_id for job_id in answers if job_id is not None]
        if not known:
            return answers
        states: dict[str, str] = dict(db.execute("SELECT id, state FROM zqsync_jobs WHERE id = ANY(%s)",
                                                 (known,)).fetchall())
        return [None if job_id is None else str(states[job_id]) for job_id in answers]
