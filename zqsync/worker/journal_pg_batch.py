"""One group commit of the PostgreSQL journal (``journal_pg.py``'s ``write_all``): its statements.

A batch holds the writer thread's confirmed jobs to insert, outcomes to store and attempts to count.
Each kind is one statement over ``unnest`` of arrays, so a batch costs the same few statements whatever
its size. Most batches go as **one statement** (`statement`: the kinds the batch has, as data-modifying
``WITH`` queries), run on its own in autocommit: it is its own transaction, committed by the server
before the answer comes back, so the batch costs one round trip and its commit's WAL flush (no
``BEGIN``, no ``COMMIT``). The parts of one statement see the same snapshot and must not write a row
twice, so a batch where one id both finishes an attempt and starts the next, or with a canvas join
(``journal_api.Join``: it reads the members' outcomes under a lock), goes statement by statement in
one transaction instead (`Batch.in_steps`).

What the server spends per job is most of what this journal costs, so (``docs/design.md``, "Journal"):

* the statements run on the journal's writer connection, planned once per session (generic plans);
  its settings (`WRITER_SETTINGS`) leave the planner no way to a row but the primary key, with the
  arrays' ids as the index condition (``j.id = ANY(ids)``), so a plan made when the table was small
  stays a few key lookups per batch however the table grows;
* a statement carries only the kinds the batch has: an empty part still cost its planning and
  executor set-up;
* a new job is a plain ``INSERT``; a duplicate id fails the statement (a unique violation), and the
  batch is written again with ``ON CONFLICT DO NOTHING`` (``safe``), which `PostgresJournal` then keeps
  using for a while (speculative insertion costs a second index probe, a lock and a WAL record per row);
* the arrays are encoded here, in PostgreSQL's binary format (`text_array` and the like), where
  psycopg's generic list dumper cost the writer thread more than the rest of the batch.
"""

from __future__ import annotations

import functools
import itertools
import struct
import time
from typing import Any, Iterable, Optional, Sequence

import psycopg
from psycopg import pq
from psycopg.adapt import Dumper

from .journal_api import SHARED, Join, NewJob, Outcome, Start

#: The writer connection's session settings (see the module docstring). Every statement it runs finds its
#: rows by key: the batch statements, their duplicates' states, a canvas join's members, the probe.
WRITER_SETTINGS = ("SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET enable_bitmapscan = off;"
                   " SET enable_nestloop = off")

OUTCOMES = ("UPDATE zqsync_jobs j SET state = o.state, attempts = o.attempts, next_at = o.next_at, error = o.error,"
            " result = o.result, running = 0, updated_at = %(now)b, finished_at = CASE WHEN o.state = 'pending'"
            " THEN NULL ELSE %(now)b END FROM unnest(%(o_id)b, %(o_state)b, %(o_attempts)b, %(o_next_at)b,"
            " %(o_error)b, %(o_result)b) AS o(id, state, attempts, next_at, error, result)"
            " WHERE j.id = ANY(%(o_id)b) AND j.id = o.id AND j.state <> 'cancelled'")
STARTS = ("UPDATE zqsync_jobs j SET attempts = j.attempts + 1, running = s.running, next_at = s.retry_at,"
          " updated_at = %(now)b, started_at = %(now)b FROM unnest(%(s_id)b, %(s_running)b, %(s_retry_at)b)"
          " AS s(id, running, retry_at) WHERE j.id = ANY(%(s_id)b) AND j.id = s.id AND j.state = 'pending'"
          " RETURNING j.id")
INSERT = ("INSERT INTO zqsync_jobs (id, task, body, state, owner, retries, created_at, updated_at, next_at, replay,"
          " attempts, running, started_at) SELECT n.id, n.task, n.body, 'pending', %(owner)s::text, n.retries,"
          " %(now)b, %(now)b, n.next_at, n.replay, n.attempts, n.running, n.started_at FROM unnest(%(n_id)b,"
          " %(n_task)b, %(n_body)b, %(n_retries)b, %(n_next_at)b, %(n_replay)b, %(n_attempts)b, %(n_running)b,"
          " %(n_started_at)b) AS n(id, task, body, retries, next_at, replay, attempts, running, started_at)")
#: Appended to `INSERT`: plain (a duplicate id fails the statement, so if it succeeds every job was inserted),
#: or ``safe`` (a duplicate id is skipped, and the ids inserted are returned).
ON_DUPLICATE = {False: "", True: " ON CONFLICT (id) DO NOTHING RETURNING id"}


@functools.cache
def statement(outcomes: bool, starts: bool, inserts: bool, safe: bool) -> str:
    """The one statement of a batch with these kinds. It returns rows ``(False, id)`` per attempt counted
    and, ``safe``, ``(True, id)`` per job inserted; none when the batch has neither."""
    parts = [f"done AS ({OUTCOMES})"] if outcomes else []
    answers = []
    if starts:
        parts.append(f"begun AS ({STARTS})")
        answers.append("SELECT false, id FROM begun")
    if inserts and (safe or answers):
        parts.append(f"added AS ({INSERT}{ON_DUPLICATE[safe]})")
        if safe:
            answers.insert(0, "SELECT true, id FROM added")
    main = " UNION ALL ".join(answers) if answers else INSERT if inserts else ""
    if not main:  # outcomes alone
        return OUTCOMES
    return f"WITH {', '.join(parts)} {main}" if parts else main


# -- arrays in PostgreSQL's binary format ---------------------------------------------------------------

class BinaryArray(bytes):
    """A one-dimensional PostgreSQL array in its binary wire format, sent as a ``%b`` parameter;
    ``OID`` is its array type (the dumpers `register_arrays` installs send it as is)."""

    OID = 0


class TextArray(BinaryArray):
    OID = 1009


class ByteaArray(BinaryArray):
    OID = 1001


class Int4Array(BinaryArray):
    OID = 1007


class Int2Array(BinaryArray):
    OID = 1005


class Float8Array(BinaryArray):
    OID = 1022


#: ``(dimensions, has NULLs, element type, length, lower bound)``, then each element as its size and bytes.
_HEADER = struct.Struct("!iiIii")
_SIZE = struct.Struct("!i")
_NULL = _SIZE.pack(-1)


def _array(kind: type[BinaryArray], element: int, items: Sequence[Optional[bytes]]) -> BinaryArray:
    """An array of a variable-size type: each item its bytes, or ``None`` for NULL."""
    if not items:
        return kind(struct.pack("!iiI", 0, 0, element))
    if None in items:
        sized: Iterable[bytes] = (_NULL if item is None else _SIZE.pack(len(item)) + item for item in items)
    else:
        sized = itertools.chain.from_iterable(zip(map(_SIZE.pack, map(len, items)), items))  # type: ignore[arg-type]
    return kind(_HEADER.pack(1, None in items, element, len(items), 1) + b"".join(sized))


def _fixed(kind: type[BinaryArray], element: int, code: str, values: Sequence[Any]) -> BinaryArray:
    """An array of a fixed-size type (``code``: its `struct` letter) without NULLs."""
    if not values:
        return kind(struct.pack("!iiI", 0, 0, element))
    size = struct.calcsize("!" + code)
    elements = struct.pack("!" + ("i" + code) * len(values), *itertools.chain.from_iterable(
        zip(itertools.repeat(size), values)))
    return kind(_HEADER.pack(1, 0, element, len(values), 1) + elements)


def text_array(values: Iterable[Optional[str]]) -> TextArray:
    """``text[]`` (UTF-8: the writer connection's client encoding)."""
    return _array(TextArray, 25, [None if value is None else value.encode() for value in values])  # type: ignore[return-value]


def bytea_array(values: Iterable[Optional[bytes]]) -> ByteaArray:
    return _array(ByteaArray, 17, [None if value is None else bytes(value) for value in values])  # type: ignore[return-value]


def int4_array(values: Sequence[int]) -> Int4Array:
    return _fixed(Int4Array, 23, "i", values)  # type: ignore[return-value]


def int2_array(values: Sequence[int]) -> Int2Array:
    return _fixed(Int2Array, 21, "h", values)  # type: ignore[return-value]


def float8_array(values: Sequence[Optional[float]]) -> Float8Array:
    """``float8[]``; ``None`` is NULL."""
    if None not in values:
        return _fixed(Float8Array, 701, "d", values)  # type: ignore[return-value]
    return _array(Float8Array, 701, [None if value is None else struct.pack("!d", value)  # type: ignore[return-value]
                                     for value in values])


class _ArrayDumper(Dumper):
    format = pq.Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return obj  # type: ignore[no-any-return]


def register_arrays(db: psycopg.Connection) -> None:
    """Have ``db`` send `BinaryArray` parameters as they are, typed by their ``OID``."""
    for kind in (TextArray, ByteaArray, Int4Array, Int2Array, Float8Array):
        db.adapters.register_dumper(kind, type(f"{kind.__name__}Dumper", (_ArrayDumper,), {"oid": kind.OID}))


# -- one batch ------------------------------------------------------------------------------------------

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
        self.kinds = (bool(done), bool(begun), bool(self.new))
        self.fresh: set[str] = set()  # the ids of the jobs to insert
        params: dict[str, Any] = {"now": now, "owner": token}
        if done:
            params.update(o_id=text_array([o.id for o in done]), o_state=text_array([o.state for o in done]),
                          o_attempts=int4_array([o.attempts for o in done]),
                          o_next_at=float8_array([o.next_at for o in done]),
                          o_error=text_array([o.error for o in done]), o_result=bytea_array([o.result for o in done]))
        if begun:
            params.update(s_id=text_array([s.id for s in begun]), s_running=int2_array([s.running for s in begun]),
                          s_retry_at=float8_array([s.retry_at for s in begun]))
        if self.new:
            fresh = list({job.id: job for job in reversed(self.new)}.values())[::-1]  # an id twice: its first copy
            self.fresh = {job.id for job in fresh}
            first = [job.retry_at > 0 for job in fresh]
            params.update(n_id=text_array([job.id for job in fresh]), n_task=text_array([job.task for job in fresh]),
                          n_body=bytea_array([job.body for job in fresh]),
                          n_retries=int4_array([job.retries for job in fresh]),
                          n_next_at=float8_array([job.retry_at if go else job.due for job, go in zip(fresh, first)]),
                          n_replay=int2_array([int(job.due > 0) for job in fresh]), n_attempts=int4_array(first),
                          n_running=int2_array([SHARED if go else 0 for go in first]),
                          n_started_at=float8_array([now if go else None for go in first]))
        self.params = params

    def at_once_rows(self, db: psycopg.Connection, safe: bool) -> tuple[set[str], set[str]]:
        """Run the batch's `statement` (``db`` in autocommit: its own transaction); the ids inserted and the
        ids counted.

        :raises psycopg.errors.UniqueViolation: not ``safe``, and a new job's id is journaled already.
        """
        query = statement(*self.kinds, safe)
        cursor = db.execute(query, self.params)
        rows = cursor.fetchall() if cursor.description else []
        counted = {row[1] for row in rows if not row[0]}
        return ({row[1] for row in rows if row[0]} if safe else set(self.fresh)), counted

    def in_steps(self, db: psycopg.Connection, safe: bool) -> tuple[set[str], set[str]]:
        """Run the statements one by one (``db`` in a transaction): outcomes first, so an attempt counted
        after its previous one's outcome sees it; the joins are the caller's. Same answer as `at_once_rows`."""
        has_outcomes, has_starts, has_inserts = self.kinds
        if has_outcomes:
            db.execute(OUTCOMES, self.params)
        counted = {row[0] for row in db.execute(STARTS, self.params).fetchall()} if has_starts else set()
        inserted = set()
        if has_inserts:
            cursor = db.execute(INSERT + ON_DUPLICATE[safe], self.params)
            inserted = {row[0] for row in cursor.fetchall()} if safe else set(self.fresh)
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
        states: dict[str, str] = dict(db.execute("SELECT id, state FROM zqsync_jobs WHERE id = ANY(%b)",
                                                 (text_array(known),)).fetchall())
        return [None if job_id is None else str(states[job_id]) for job_id in answers]
