"""The PostgreSQL journal of confirmed jobs: one database shared by a fleet of workers (psycopg 3).

The rows and their rules are those of every journal (``journal_api.py``), in
one table, ``zqsync_jobs``, whose primary key is the job id: an id is unique
fleet-wide, so a confirm that fails over to another worker is recognised as a
duplicate there, not run twice. A row is committed before its job is
acknowledged (group commit: the worker's writer thread commits a batch in one
transaction, and the acknowledgements are sent after ``COMMIT``); how durable
that commit is, is the server's ``synchronous_commit`` (``docs/operations.md``).

Ownership is a **lease**: `PostgresJournal.register` inserts the process's
owner token into ``zqsync_owners`` with ``expires_at = now() + lease`` (the
database's clock, so the workers' clocks never matter), and a native thread
renews it every ``lease / 3`` seconds on a connection of its own. When a lease
expires (the process, its host or its network is gone), the other workers'
`claim` takes that owner's pending and running rows
with ``FOR UPDATE SKIP LOCKED`` (two workers claiming at once take disjoint
rows) and replays them with the same rules as the SQLite journal. A stop
expires the lease at once, so its pending rows are taken over without waiting.
An expired owner is forgotten (`sweep_owners`) once it
owns no pending row.

Group commits (`PostgresJournal.write_all`, `probe`) run on a session of their own, the writer's
(``journal_pg_batch.py`` says how it keeps a job cheap for the server); every other call runs on the
main session. A broken connection (the server restarted or failed over) is replaced on the
next call; the call that saw it fails, and the worker retries it (group
commit's backoff). Every method blocks; a lock per session serialises it across threads, as in the
SQLite journal.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import psycopg
from gevent import monkey

from .._common import native_lock
from .journal_api import (
    ALONE,
    CANCELLED,
    DIED,
    FIELDS,
    Claim,
    Join,
    JournalBackend,
    Outcome,
    Row,
    Start,
    joined,
)
from .journal_pg_batch import WRITER_SETTINGS, Batch, register_arrays

log = logging.getLogger(__name__)

_start_thread = monkey.get_original("_thread", "start_new_thread")

#: Seconds a lease lasts unless renewed (the takeover time is about this plus the replay interval).
LEASE = 10.0
#: Seconds the writer inserts with ``ON CONFLICT DO NOTHING`` after a batch met a duplicate id
#: (``journal_pg_batch.py``): duplicates tend to come together (a client's resends, a failover).
SAFE_FOR = 10.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS zqsync_jobs (
    id TEXT COLLATE "C" PRIMARY KEY,
    task TEXT NOT NULL,
    body BYTEA NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    owner TEXT,
    error TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    running SMALLINT NOT NULL DEFAULT 0,
    replay SMALLINT NOT NULL DEFAULT 0,
    retries INTEGER NOT NULL DEFAULT 0,
    result BYTEA,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION
);
-- Pending rows by owner serve claims and replays, finished rows by age purges; every index costs each insert
-- and outcome it holds a row of (a pending job's insert is in the first only, its outcome in the second only).
CREATE INDEX IF NOT EXISTS zqsync_jobs_to_replay ON zqsync_jobs (owner, replay, next_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS zqsync_jobs_finished ON zqsync_jobs (state, updated_at) WHERE state <> 'pending';
-- Journals made before this index existed had every row in this one instead: migrated here.
DROP INDEX IF EXISTS zqsync_jobs_by_state_updated;
CREATE TABLE IF NOT EXISTS zqsync_owners (
    token TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS zqsync_probes (owner TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL);
"""
#: Serialises schema creation among workers starting together (``pg_advisory_xact_lock``).
SCHEMA_LOCK = 0x7A71_7379_6E63
SELECT = f"SELECT {', '.join(FIELDS)} FROM zqsync_jobs"
#: A pending row whose owner's lease expired, or that has no owner (requeued).
ORPHAN = ("j.state = 'pending' AND (j.owner IS NULL OR j.owner IN "
          "(SELECT token FROM zqsync_owners WHERE expires_at <= now()))")
POISON = f"o.running = {ALONE} AND o.attempts > o.retries"
CLAIM = f"""
WITH orphans AS (
    SELECT id, running, attempts, retries FROM zqsync_jobs j
    WHERE {ORPHAN} AND j.task = ANY(%(tasks)s) FOR UPDATE OF j SKIP LOCKED),
died AS (
    UPDATE zqsync_jobs j SET state = 'dead', error = %(died)s, running = 0, updated_at = %(now)s
    FROM orphans o WHERE j.id = o.id AND {POISON} RETURNING j.id),
taken AS (
    UPDATE zqsync_jobs j SET owner = %(me)s, replay = 1
    FROM orphans o WHERE j.id = o.id AND NOT ({POISON}) RETURNING j.id)
SELECT (SELECT count(*) FROM taken), (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM died)
"""
FOREIGN = f"SELECT task, count(*) FROM zqsync_jobs j WHERE {ORPHAN} AND NOT (j.task = ANY(%s)) GROUP BY task"
REPLAYS = (f"WITH due AS (SELECT id FROM zqsync_jobs WHERE state = 'pending' AND owner = %s AND replay = 1"
           f" AND next_at <= %s ORDER BY running > 0, next_at, created_at LIMIT %s FOR UPDATE SKIP LOCKED)"
           f" UPDATE zqsync_jobs j SET replay = 0 FROM due WHERE j.id = due.id"
           f" RETURNING {', '.join('j.' + name for name in FIELDS)}")
#: Renews a lease, or takes it again if it expired and was forgotten (returns whether it was).
RENEW = ("INSERT INTO zqsync_owners AS o (token, host, pid, expires_at) VALUES (%s, %s, %s,"
         " now() + make_interval(secs => %s)) ON CONFLICT (token) DO UPDATE SET expires_at = EXCLUDED.expires_at"
         " RETURNING o.xmax = 0")
#: Seconds an expired owner is kept before it may be forgotten: a process that stalled past its lease and
#: then wrote new rows is known again by its next renewal long before that.
FORGET_AFTER = 3600.0
REQUEUE = ("UPDATE zqsync_jobs SET state = 'pending', attempts = 0, next_at = 0, error = NULL, running = 0,"
           " owner = NULL, replay = 0, result = NULL, started_at = NULL, finished_at = NULL, updated_at = %s")


class PostgresJournal(JournalBackend):
    """A connection to the PostgreSQL journal at ``url`` (its tables created if missing).

    :param url: a libpq URL, ``postgresql://USER@HOST:PORT/DB`` (password, ``sslmode`` and the like as
        libpq takes them, or from ``PGPASSWORD`` / ``~/.pgpass``).
    :param busy_timeout: seconds to connect, and to wait for another transaction's row locks
        (``lock_timeout``) before a statement fails.
    :param lease: seconds an owner's lease lasts unless renewed (renewed every ``lease / 3``).
    :raises psycopg.Error: the database cannot be reached or its tables cannot be created.
    """

    def __init__(self, url: str, *, busy_timeout: float = 30.0, lease: float = LEASE) -> None:
        self.url, self.busy_timeout, self.lease = url, busy_timeout, lease
        self.token: Optional[str] = None
        self._lock = native_lock()
        self._renewing: Optional[Any] = None  # held while the renewal thread is to run
        self._renewed: Optional[Any] = None  # held while it runs
        self._pid = os.getpid()  # a forked child must neither use nor close the parent's session
        self._db = self._connect()
        self._write_lock = native_lock()
        self._writer: Optional[psycopg.Connection] = None  # write_all's own session, opened by the first
        self._safe_until = 0.0  # time.monotonic() until which new jobs are inserted ON CONFLICT DO NOTHING
        with self._lock, self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            self._db.execute(SCHEMA)

    def _connect(self, writer: bool = False) -> psycopg.Connection:
        """A new session. Every statement is planned for its own parameters (``force_custom_plan``): psycopg
        prepares a statement on its 6th run, and the plan PostgreSQL then keeps for any parameters (a generic
        plan, which knows neither the batch's size nor the table's growth since its statistics were taken)
        joined a batch's arrays to the whole table, one sequential scan per batch. The ``writer`` session
        (`write_all`, `probe`) plans its statements once instead, under ``journal_pg_batch.WRITER_SETTINGS``,
        and sends its arrays in binary, UTF-8."""
        db = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, round(self.busy_timeout)),
                             application_name="zqsync writer" if writer else "zqsync", client_encoding="UTF8")
        plans = WRITER_SETTINGS if writer else "SET plan_cache_mode = force_custom_plan"
        db.execute(f"SET lock_timeout = {int(self.busy_timeout * 1000)}; {plans}")
        if writer:
            register_arrays(db)
        return db

    def _transaction(self, work: Callable[[psycopg.Connection], Any], atomic: bool = True) -> Any:
        """``work(connection)`` in one transaction (or, not ``atomic``, in autocommit: each statement its own
        transaction), under the lock (a broken connection replaced first)."""
        if os.getpid() != self._pid:
            raise RuntimeError("this PostgreSQL journal connection belongs to the process that opened it")
        with self._lock:
            if self._db.closed or self._db.broken:
                self._db = self._connect()
            return self._run(self._db, work, atomic)

    def _write(self, work: Callable[[psycopg.Connection], Any], atomic: bool = True) -> Any:
        """`_transaction` on the writer session (opened on first use)."""
        if os.getpid() != self._pid:
            raise RuntimeError("this PostgreSQL journal connection belongs to the process that opened it")
        with self._write_lock:
            if self._writer is None or self._writer.closed or self._writer.broken:
                self._writer = self._connect(writer=True)
            return self._run(self._writer, work, atomic)

    @staticmethod
    def _run(db: psycopg.Connection, work: Callable[[psycopg.Connection], Any], atomic: bool) -> Any:
        if not atomic:
            return work(db)
        with db.transaction():
            return work(db)

    def _read(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return list(self._transaction(lambda db: db.execute(query, params).fetchall()))

    # -- ownership ---------------------------------------------------------

    def register(self) -> str:
        """Become a live owner: a new random token with a lease, renewed by a native thread until
        `close`. Returns the token. A forked child does not inherit it."""
        token = f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(8)}"
        self._transaction(lambda db: db.execute(RENEW, (token, socket.gethostname(), os.getpid(), self.lease)))
        self.token = token
        self._renewing, self._renewed = native_lock(), native_lock()
        self._renewing.acquire()
        self._renewed.acquire()
        _start_thread(self._renew_loop, (token, self._renewing, self._renewed))
        os.register_at_fork(after_in_child=_forget_token(weakref.ref(self)))
        return token

    def _renew_loop(self, token: str, renewing: Any, renewed: Any) -> None:
        """The renewal thread: renew the lease every ``lease / 3`` s on its own connection until ``renewing``
        is released; a failed renewal is logged and tried again at the next tick."""
        db: Optional[psycopg.Connection] = None
        try:
            while not renewing.acquire(timeout=self.lease / 3):
                try:
                    if db is None or db.closed or db.broken:
                        db = self._connect()
                    row = db.execute(RENEW, (token, socket.gethostname(), os.getpid(), self.lease)).fetchone()
                    if row and row[0]:
                        log.error("the journal lease of %s had expired and was forgotten: its jobs may run "
                                  "again elsewhere", token)
                except Exception as exc:  # the thread must outlive any failure, or the lease lapses
                    log.error("could not renew the journal lease of %s (it expires %.0f s after the last "
                              "renewal): %s: %s", token, self.lease, type(exc).__name__, exc)
        finally:
            if db is not None:
                db.close()
            renewed.release()

    def owner_alive(self, token: Optional[str]) -> bool:
        """Whether ``token``'s lease is unexpired (by the database's clock)."""
        if token is None:
            return False
        return token == self.token or bool(self._read(
            "SELECT 1 FROM zqsync_owners WHERE token = %s AND expires_at > now()", (token,)))

    def sweep_owners(self) -> int:
        """Forget owners whose lease expired `FORGET_AFTER` s ago and who own no pending row (and
        their probe rows); returns how many."""
        def sweep(db: psycopg.Connection) -> int:
            gone = db.execute(
                "DELETE FROM zqsync_owners o WHERE expires_at <= now() - make_interval(secs => %s) AND NOT EXISTS"
                " (SELECT 1 FROM zqsync_jobs j WHERE j.state = 'pending' AND j.owner = o.token)",
                (FORGET_AFTER,)).rowcount
            db.execute("DELETE FROM zqsync_probes p WHERE NOT EXISTS (SELECT 1 FROM zqsync_owners o"
                       " WHERE o.token = p.owner)")
            return int(gone)

        return int(self._transaction(sweep))

    # -- writes ------------------------------------------------------------

    def probe(self) -> None:
        """One row of this owner's written to ``zqsync_probes`` and committed. :raises psycopg.Error: as `write_all`."""
        self._write(lambda db: db.execute(
            "INSERT INTO zqsync_probes (owner, at) VALUES (%s, %s) ON CONFLICT (owner) DO UPDATE SET at = EXCLUDED.at",
            (self.token or "", time.time())))

    def write_all(
        self, jobs: Iterable[tuple[Any, ...]] = (), outcomes: Iterable[Outcome] = (), starts: Iterable[Start] = (),
    ) -> tuple[list[Optional[str]], set[str]]:
        """`JournalBackend.write_all` in one PostgreSQL transaction on the writer session: most often one
        statement (``journal_pg_batch.py``). A batch that meets a duplicate id is written again with
        ``ON CONFLICT DO NOTHING``, as are those of the next `SAFE_FOR` seconds.

        :raises psycopg.Error: the write failed (server gone, lock timeout, disk full, ...; nothing is committed).
        """
        batch = Batch(self.token, jobs, outcomes, starts)
        if not any(batch.kinds):
            return [], set()
        try:
            return self._write_batch(batch, time.monotonic() < self._safe_until)
        except psycopg.errors.UniqueViolation:
            self._safe_until = time.monotonic() + SAFE_FOR
            return self._write_batch(batch, True)

    def _write_batch(self, batch: Batch, safe: bool) -> tuple[list[Optional[str]], set[str]]:
        def at_once(db: psycopg.Connection) -> tuple[list[Optional[str]], set[str]]:
            inserted, counted = batch.at_once_rows(db, safe)
            return batch.answers(db, inserted), batch.started - counted

        def in_steps(db: psycopg.Connection) -> tuple[list[Optional[str]], set[str]]:
            inserted, counted = batch.in_steps(db, safe)
            for join in batch.joins:
                self._join(db, join, batch.now)
            return batch.answers(db, inserted), batch.started - counted

        return self._write(at_once, atomic=False) if batch.at_once else self._write(in_steps)  # type: ignore[no-any-return]

    @staticmethod
    def _join(db: psycopg.Connection, join: Join, now: float) -> None:
        """Under a lock on the join's key (held to the commit; a member finishing at the same instant in
        another transaction waits, then reads this one's outcome): journal its successor if it is due."""
        db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (join.key,))
        job = joined(join, db.execute("SELECT id, state, result, error FROM zqsync_jobs WHERE id = ANY(%s)",
                                      (list(join.members),)).fetchall())
        if job is not None:
            db.execute("INSERT INTO zqsync_jobs (id, task, body, state, owner, retries, created_at, updated_at, next_at)"
                       " VALUES (%s, %s, %s, 'pending', NULL, %s, %s, %s, 0) ON CONFLICT (id) DO NOTHING",
                       (job.id, job.task, job.body, job.retries, now, now))

    def claim(self, tasks: Sequence[str]) -> Claim:
        """`JournalBackend.claim`: the pending rows of expired leases (or of no owner), taken with
        ``FOR UPDATE SKIP LOCKED`` so that workers claiming at once take disjoint rows."""
        assert self.token is not None, "register() first"

        def claim(db: psycopg.Connection) -> Claim:
            taken, died = db.execute(CLAIM, {"tasks": list(tasks), "died": DIED, "now": time.time(),
                                             "me": self.token}).fetchone() or (0, [])
            foreign: dict[str, int] = dict(db.execute(FOREIGN, (list(tasks),)).fetchall())
            return Claim(int(taken), list(died), {str(task): int(count) for task, count in foreign.items()})

        return self._transaction(claim)  # type: ignore[no-any-return]

    def take_replays(self, limit: int) -> list[Row]:
        """`JournalBackend.take_replays`."""
        rows = [Row(*row) for row in self._read(REPLAYS, (self.token, time.time(), limit))]
        return sorted(rows, key=lambda row: (row.running > 0, row.next_at, row.created_at))

    # -- operators -----------------------------------------------------------

    def rows(self, states: Iterable[str] = ("pending", "dead"), *, ids: Sequence[str] = (),
             limit: int = 1000, offset: int = 0) -> list[Row]:
        """`JournalBackend.rows`."""
        where, wanted = ("id = ANY(%s)", [list(ids)]) if ids else _in_states(states)
        return [Row(*row) for row in self._read(
            f"{SELECT} WHERE {where} ORDER BY created_at, id LIMIT %s OFFSET %s", (*wanted, limit, offset))]

    def iter_rows(self, states: Iterable[str], batch: int = 1000) -> Iterator[Row]:
        """`JournalBackend.iter_rows`."""
        where, wanted = _in_states(states)
        after: tuple[float, str] = (-1.0, "")
        while True:
            rows = [Row(*row) for row in self._read(
                f"{SELECT} WHERE {where} AND (created_at, id) > (%s, %s) ORDER BY created_at, id LIMIT %s",
                (*wanted, *after, batch))]
            yield from rows
            if len(rows) < batch:
                return
            after = (rows[-1].created_at, rows[-1].id)

    def counts(self) -> dict[str, int]:
        """`JournalBackend.counts`."""
        return {str(state): int(count) for state, count in self._read(
            "SELECT state, count(*) FROM zqsync_jobs GROUP BY state", ())}

    def cancel(self, job_id: str) -> bool:
        """`JournalBackend.cancel` (a job running under an unexpired lease is left alone)."""
        now = time.time()

        def cancel(db: psycopg.Connection) -> bool:
            row = db.execute("SELECT running, owner FROM zqsync_jobs WHERE id = %s AND state = 'pending' FOR UPDATE",
                             (job_id,)).fetchone()
            if row is None or (row[0] and (row[1] == self.token or db.execute(
                    "SELECT 1 FROM zqsync_owners WHERE token = %s AND expires_at > now()", (row[1],)).fetchone())):
                return False
            db.execute("UPDATE zqsync_jobs SET state = 'cancelled', running = 0, replay = 0, updated_at = %s,"
                       " finished_at = %s, error = %s WHERE id = %s", (now, now, CANCELLED, job_id))
            return True

        return bool(self._transaction(cancel))

    def pending_split(self, now: float) -> list[tuple[Optional[str], bool, bool, int]]:
        """`JournalBackend.pending_split`."""
        return [(owner, bool(running), bool(later), int(count)) for owner, running, later, count in self._read(
            "SELECT owner, running > 0, next_at > %s, count(*) FROM zqsync_jobs WHERE state = 'pending' GROUP BY 1, 2, 3",
            (now,))]

    def requeue(self, ids: Sequence[str] = (), *, all_dead: bool = False, as_of: Optional[float] = None) -> int:
        """`JournalBackend.requeue`."""
        now = time.time()
        unchanged, since = ("", ()) if as_of is None else (" AND updated_at <= %s", (as_of,))
        if all_dead:
            return int(self._transaction(lambda db: db.execute(
                f"{REQUEUE} WHERE state = 'dead'{unchanged}", (now, *since)).rowcount))
        return int(self._transaction(lambda db: db.execute(
            f"{REQUEUE} WHERE id = ANY(%s) AND state <> 'pending'{unchanged}", (now, sorted(set(ids)), *since)).rowcount))

    def purge(self, states: Iterable[str], older_than: float) -> int:
        """`JournalBackend.purge`."""
        wanted = [state for state in states if state != "pending"]
        return int(self._transaction(lambda db: db.execute(
            "DELETE FROM zqsync_jobs WHERE state = ANY(%s) AND updated_at < %s",
            (wanted, time.time() - older_than)).rowcount))

    def close(self) -> None:
        """Stop renewing, expire this owner's lease (its pending rows are claimed by any live worker at
        once) and close the connection. In a process forked from the owner it does nothing: the session is
        the parent's."""
        if os.getpid() != self._pid:
            return
        if self._renewing is not None and self._renewed is not None and self.token is not None:
            self._renewing.release()
            self._renewed.acquire(timeout=self.busy_timeout)
            try:
                self._transaction(lambda db: db.execute(
                    "UPDATE zqsync_owners SET expires_at = now() WHERE token = %s", (self.token,)))
            except psycopg.Error as exc:
                log.warning("could not expire the journal lease of %s (it expires within %.0f s): %s",
                            self.token, self.lease, exc)
            self._renewing = None
        with self._lock:
            self._db.close()
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()


def _in_states(states: Iterable[str]) -> tuple[str, list[Any]]:
    """A condition on ``state`` and its parameters. Pending and finished rows are in two partial indexes, and
    PostgreSQL uses both for ``state = 'pending' OR state = ANY(...)`` (a bitmap OR), where it would read
    the whole table for ``state = ANY('{pending,...}')``."""
    wanted = list(states)
    if "pending" not in wanted:
        return "state = ANY(%s)", [wanted]
    return "(state = 'pending' OR state = ANY(%s))", [[state for state in wanted if state != "pending"]]


def _forget_token(journal: "weakref.ReferenceType[PostgresJournal]") -> Callable[[], None]:
    def forget() -> None:
        alive = journal()
        if alive is not None:
            alive.token = None  # the child has no renewal thread: it owns nothing (the parent's lease is kept)
            alive._renewing = None

    return forget
