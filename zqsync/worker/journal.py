"""The SQLite journal of confirmed jobs (the default), through the standard ``sqlite3`` module, in WAL mode.

The rules every journal keeps, and the types, are in ``journal_api.py``; this module re-exports them.

One file (``STATE_DIR/journal.sqlite3``) is shared by every process of a
worker. A row is written, and committed, before the job is acknowledged;
so an acknowledged job survives a SIGKILL of any worker process and runs at
least once. ``synchronous=NORMAL`` (the default here) makes a commit durable
against process death, which is what at-least-once under SIGKILL needs;
``synchronous=FULL`` adds durability against power loss at an fsync per
commit (SQLite documentation, "PRAGMA synchronous" and "Write-Ahead Logging").

A job's ``id`` is its primary key, so a client's retry of an acknowledged
job is recognised and not run twice while the row is kept (retention).

Ownership: each worker process, at each boot, registers a random **owner
token** and holds an exclusive ``flock`` on ``STATE_DIR/owners/TOKEN.lock``
for as long as it lives. Rows belong to a token, never to a pid: pids repeat
across restarts in a fresh PID namespace (a container is PID 1 again), locks
do not outlive their process. A pending row whose owner's lock can be taken
(or has no owner: requeued, or journaled by an older version) is an orphan,
and a live worker that has the row's task claims it.

Attempts are counted *before* a job runs (`SqliteJournal.write_all`, ``starts``),
with ``running`` set (1: alongside other jobs, 2: alone). A row left
``running`` by a dead owner is a suspect: the job may have killed its
process. It is replayed after its backoff, alone; one that died running
alone with ``attempts > retries`` is dead-lettered with the reason
`DIED`.

States: ``pending`` (to run, possibly after ``next_at``: a delayed job is
journaled already marked for replay, with ``next_at`` its due time), ``done``
(with its msgpack ``result`` reply), ``dead`` (retries exhausted, or failed
with none: the dead-letter table is this state), ``cancelled``. A cancelled row
is never started and never overwritten by the outcome of an attempt that
was already running elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import sqlite3
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from .._common import native_lock
from ..errors import ConfigurationError
from .journal_api import ALONE, CANCELLED, DIED, FIELDS, SHARED, Claim, Join, JournalBackend, NewJob, Outcome, Row, Start, joined

__all__ = ["ALONE", "CANCELLED", "DIED", "SHARED", "Claim", "Journal", "JournalGone", "NewJob", "Outcome", "Row",
           "SqliteJournal", "Start", "journal_path", "recover"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL DEFAULT 0,
    owner_pid INTEGER,
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS probes (owner TEXT PRIMARY KEY, at REAL NOT NULL);
"""
#: Columns added since the first version (``ALTER TABLE`` on older journals).
COLUMNS = {
    "owner": "TEXT",
    "running": "INTEGER NOT NULL DEFAULT 0",
    "replay": "INTEGER NOT NULL DEFAULT 0",
    "retries": "INTEGER NOT NULL DEFAULT 0",
    "result": "BLOB",
    "started_at": "REAL",
    "finished_at": "REAL",
}
INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_to_replay ON jobs (owner, replay, next_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS jobs_by_state_updated ON jobs (state, updated_at);
"""
#: Indexes of older journals, dropped when the schema is written: ``(state, owner)`` served nothing the two
#: above do not (the pending owners are in ``jobs_to_replay``; counts and lists by state in
#: ``jobs_by_state_updated``), and every insert and outcome wrote one more page for it.
DROPPED = ("jobs_by_state_owner_token",)
SELECT = f"SELECT {', '.join(FIELDS)} FROM jobs"

FILENAME = "journal.sqlite3"
#: `SqliteJournal.write_now` hands every this many-th batch back to `write_all`, whose commit may checkpoint.
NOW_HANDS_BACK = 64
OWNERS = "owners"


class JournalGone(sqlite3.DatabaseError):
    """The journal file was deleted or replaced since it was opened: acknowledging into it would lose jobs."""


def journal_path(state_dir: str) -> str:
    """The journal file inside ``state_dir``."""
    return os.path.join(state_dir, FILENAME)


def _file_id(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


class SqliteJournal(JournalBackend):
    """A connection to the SQLite journal in ``state_dir`` (created, with the directory, if missing).

    :param state_dir: directory of the journal file.
    :param synchronous: SQLite ``PRAGMA synchronous``: ``"NORMAL"`` or ``"FULL"``.
    :param busy_timeout: seconds to wait for another process's write lock
        before a transaction fails with ``sqlite3.OperationalError``.

    Blocking (plain ``sqlite3``); a gevent worker calls it from its thread
    pool, from more than one thread at a time, so every use of the one
    connection is serialised by a lock (a transaction begun by one thread
    must never be committed by another). A connection owns no rows until
    `register` (the ``zqsync jobs`` command never registers).
    """

    def __init__(self, state_dir: str, *, synchronous: str = "NORMAL", busy_timeout: float = 30.0) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ConfigurationError(f"journal synchronous must be NORMAL or FULL, got {synchronous!r}", setting="journal_sync")
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.path = journal_path(state_dir)
        self.token: Optional[str] = None
        self._lock_fd: Optional[int] = None
        self._db = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        self._file = _file_id(self.path)
        self._lock = native_lock()
        self._synchronous = synchronous.upper()
        self._setup(self._synchronous, time.monotonic() + busy_timeout)
        self._now: Optional[sqlite3.Connection] = None  # write_now's own connection, opened on first use
        self._now_offered = 0

    def _setup(self, synchronous: str, deadline: float) -> None:
        # Switching to WAL takes an exclusive lock that SQLite's busy handler
        # does not wait for, so processes starting together retry here.
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"PRAGMA synchronous={synchronous}")
                if self._outdated():
                    self._db.executescript(SCHEMA)
                    self._transaction(self._migrate)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _outdated(self) -> bool:
        """Whether the schema needs writing (only reads: a worker boots while another process holds
        the write lock, and its loops wait for the lock instead)."""
        with self._lock:
            present = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
            names = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
        wanted = {"probes", *(line.split()[5] for line in INDEXES.strip().splitlines())}
        return not (set(COLUMNS) <= present and wanted <= names) or not names.isdisjoint(DROPPED)

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        for name, kind in COLUMNS.items():
            if name not in present:
                db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
        for statement in INDEXES.strip().splitlines():
            db.execute(statement)
        for name in DROPPED:
            db.execute(f"DROP INDEX IF EXISTS {name}")

    def _transaction(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            return _commit(self._db, work)

    # -- ownership ---------------------------------------------------------

    def register(self) -> str:
        """Become a live owner: a new random token, its lock file created and ``flock``-ed. Returns the token.

        The lock is made under a temporary name and renamed into place once
        held, so no other process ever sees an unlocked live owner's file.
        A process forked from this one does not inherit ownership (its copy
        of the descriptor is closed after the fork).
        """
        directory = os.path.join(self.state_dir, OWNERS)
        os.makedirs(directory, exist_ok=True)
        token = f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(8)}"
        temporary = os.path.join(directory, f".{token}.tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temporary, self._owner_file(token))
        self.token, self._lock_fd = token, fd
        os.register_at_fork(after_in_child=_forget_lock(weakref.ref(self)))
        return token

    def _owner_file(self, token: str) -> str:
        return os.path.join(self.state_dir, OWNERS, f"{token}.lock")

    def owner_alive(self, token: Optional[str]) -> bool:
        """Whether ``token``'s process still holds its lock. A dead owner's lock file is removed."""
        if token is None:
            return False
        return token == self.token or _lock_held(self._owner_file(token))

    def sweep_owners(self) -> int:
        """Remove the lock files of owners that are gone (a SIGKILLed process leaves its file behind);
        returns how many."""
        directory = os.path.join(self.state_dir, OWNERS)
        names = [name for name in os.listdir(directory) if name.endswith(".lock")] if os.path.isdir(directory) else []
        return sum(not self.owner_alive(name[: -len(".lock")]) for name in names)

    def check_file(self) -> None:
        """:raises JournalGone: the journal file is no longer the one opened (deleted, replaced, directory removed)."""
        try:
            same = _file_id(self.path) == self._file
        except OSError as exc:
            raise JournalGone(f"journal file {self.path} is gone ({exc.strerror})") from exc
        if not same:
            raise JournalGone(f"journal file {self.path} was replaced by another file since the worker opened it")

    def repair_hint(self, exc: BaseException) -> str:
        """For a damaged file (``database disk image is malformed``): how to recover it."""
        if not isinstance(exc, sqlite3.DatabaseError) or "malformed" not in str(exc):
            return ""
        return (f" (the journal file is damaged: stop the worker and run `zqsync jobs recover --state-dir "
                f"{self.state_dir}`, which keeps every readable job)")

    # -- writes ------------------------------------------------------------

    def probe(self) -> None:
        """Whether the journal can be written again: `check_file`, and one row of this owner's
        written to the ``probes`` table and committed (an empty transaction would succeed on a full disk).

        :raises JournalGone, sqlite3.Error: as `write_all`.
        """
        def work(db: sqlite3.Connection) -> None:
            self.check_file()
            db.execute("INSERT OR REPLACE INTO probes (owner, at) VALUES (?, ?)", (self.token, time.time()))

        self._transaction(work)

    def write_all(
        self, jobs: Iterable[tuple[Any, ...]] = (), outcomes: Iterable[Outcome] = (), starts: Iterable[Start] = (),
    ) -> tuple[list[Optional[str]], set[str]]:
        """`JournalBackend.write_all`; before committing new jobs it checks the file is still the one opened.

        :raises JournalGone: the journal file was deleted or replaced (nothing is committed).
        :raises sqlite3.Error: the write failed (disk full, lock timeout, ...; nothing is committed).
        """
        return self._transaction(self._writes(jobs, outcomes, starts))

    def write_now(
        self, jobs: Iterable[tuple[Any, ...]] = (), outcomes: Iterable[Outcome] = (),
    ) -> Optional[tuple[list[Optional[str]], set[str]]]:
        """`JournalBackend.write_now`: on a connection of its own that never waits for SQLite's write lock
        (``busy_timeout`` 0) and never checkpoints (``wal_autocheckpoint`` 0). It declines (``None``) when
        another connection holds the write lock, under ``synchronous=FULL`` (an fsync per commit), and for
        every `NOW_HANDS_BACK`-th batch: that one goes through `write_all`, whose connection checkpoints the
        WAL once it holds 1000 pages (SQLite's automatic checkpoint counts every connection's frames).

        :raises JournalGone, sqlite3.Error: as `write_all` (nothing is committed).
        """
        self._now_offered += 1
        if self._synchronous != "NORMAL" or self._now_offered % NOW_HANDS_BACK == 0:
            return None
        db = self._now
        if db is None:
            db = self._now = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            db.execute("PRAGMA wal_autocheckpoint=0")
        work = self._writes(jobs, outcomes, ())
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return None
            raise
        return _commit(db, work, begun=True)

    def _writes(self, jobs: Iterable[tuple[Any, ...]], outcomes: Iterable[Outcome], starts: Iterable[Start],
                ) -> Callable[[sqlite3.Connection], tuple[list[Optional[str]], set[str]]]:
        """The work of one `write_all` transaction, to run on a connection in a transaction."""
        new = [NewJob(*job) for job in jobs]
        outcomes = list(outcomes)
        joins = sorted({o.join.key: o.join for o in outcomes if o.join is not None}.items())

        def apply(db: sqlite3.Connection) -> tuple[list[Optional[str]], set[str]]:
            now = time.time()
            # Outcomes first: a retry's start may share the transaction with the outcome of the attempt before.
            db.executemany(
                "UPDATE jobs SET state = ?, attempts = ?, next_at = ?, error = ?, result = ?, running = 0,"
                " updated_at = ?, finished_at = CASE WHEN ? = 'pending' THEN NULL ELSE ? END"
                " WHERE id = ? AND state != 'cancelled'",
                [(o.state, o.attempts, o.next_at, o.error, o.result, now, o.state, now, o.id) for o in outcomes])
            refused = {start.id for start in starts if not db.execute(
                "UPDATE jobs SET attempts = attempts + 1, running = ?, next_at = ?, updated_at = ?, started_at = ?"
                " WHERE id = ? AND state = 'pending'", (start.running, start.retry_at, now, now, start.id)).rowcount}
            for _, join in joins:  # one writer at a time (BEGIN IMMEDIATE): the lock on its key
                self._join(db, join, now)
            fresh = [self._insert(db, job, now) for job in new]
            if new:
                self.check_file()
            return fresh, refused

        return apply

    @staticmethod
    def _join(db: sqlite3.Connection, join: Join, now: float) -> None:
        marks = ",".join("?" for _ in join.members)
        job = joined(join, db.execute(f"SELECT id, state, result, error FROM jobs WHERE id IN ({marks})", join.members))
        if job is not None:
            db.execute("INSERT OR IGNORE INTO jobs (id, task, body, state, owner, retries, created_at, updated_at,"
                       " next_at) VALUES (?, ?, ?, 'pending', NULL, ?, ?, ?, 0)",
                       (job.id, job.task, job.body, job.retries, now, now))

    def _insert(self, db: sqlite3.Connection, job: NewJob, now: float) -> Optional[str]:
        started = job.retry_at > 0
        inserted = db.execute(
            "INSERT OR IGNORE INTO jobs (id, task, body, state, owner, owner_pid, retries, created_at, updated_at,"
            " next_at, replay, attempts, running, started_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job.id, job.task, job.body, self.token, os.getpid(), job.retries, now, now,
             job.retry_at if started else job.due, int(job.due > 0), int(started), SHARED if started else 0,
             now if started else None),
        ).rowcount
        job_id = job.id
        if inserted == 1:
            return None
        return str(db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])

    def claim(self, tasks: Sequence[str]) -> Claim:
        """Take over the pending jobs of dead owners whose task is in ``tasks``; they are marked for
        replay (`take_replays`). Suspects that died running alone with ``attempts > retries``
        are dead-lettered (`DIED`) instead. Needs `register` first."""
        assert self.token is not None, "register() first"
        now = time.time()
        marks = ",".join("?" for _ in tasks) or "NULL"

        def claim(db: sqlite3.Connection) -> Claim:
            owners = [row[0] for row in db.execute(
                "SELECT DISTINCT owner FROM jobs WHERE state = 'pending' AND owner IS NOT ?", (self.token,))]
            result = Claim()
            for owner in owners:
                if not self.owner_alive(owner):
                    self._claim_from(db, owner, tasks, marks, now, result)
            return result

        return self._transaction(claim)

    def _claim_from(self, db: sqlite3.Connection, owner: Optional[str], tasks: Sequence[str], marks: str,
                    now: float, result: Claim) -> None:
        mine = f"state = 'pending' AND owner IS ? AND task IN ({marks})"
        died = f"{mine} AND running = {ALONE} AND attempts > retries"
        result.died.extend(row[0] for row in db.execute(f"SELECT id FROM jobs WHERE {died}", (owner, *tasks)))
        db.execute(f"UPDATE jobs SET state = 'dead', error = ?, running = 0, updated_at = ? WHERE {died}",
                   (DIED, now, owner, *tasks))
        result.claimed += db.execute(f"UPDATE jobs SET owner = ?, owner_pid = ?, replay = 1 WHERE {mine}",
                                     (self.token, os.getpid(), owner, *tasks)).rowcount
        for task, count in db.execute(
                f"SELECT task, COUNT(*) FROM jobs WHERE state = 'pending' AND owner IS ? AND task NOT IN ({marks})"
                " GROUP BY task", (owner, *tasks)):
            result.foreign[task] = result.foreign.get(task, 0) + count

    def take_replays(self, limit: int) -> list[Row]:
        """At most ``limit`` of this owner's claimed rows that are due, unsuspected ones first, then by
        ``next_at``; each is handed out once (its replay mark is cleared in the same transaction)."""
        query = (f"{SELECT} WHERE state = 'pending' AND owner = ? AND replay = 1 AND next_at <= ?"
                 " ORDER BY running > 0, next_at, created_at LIMIT ?")

        def take(db: sqlite3.Connection) -> list[Row]:
            rows = [Row(*row) for row in db.execute(query, (self.token, time.time(), limit))]
            db.executemany("UPDATE jobs SET replay = 0 WHERE id = ?", [(row.id,) for row in rows])
            return rows

        return self._transaction(take)

    # -- operators -----------------------------------------------------------

    def rows(self, states: Iterable[str] = ("pending", "dead"), *, ids: Sequence[str] = (),
             limit: int = 1000, offset: int = 0) -> list[Row]:
        """Jobs in ``states`` (or with one of ``ids``, any state), oldest first, at most ``limit``
        after skipping ``offset``."""
        wanted = list(ids) or list(states)
        marks = ",".join("?" for _ in wanted)
        column = "id" if ids else "state"
        with self._lock:
            return [Row(*row) for row in self._db.execute(
                f"{SELECT} WHERE {column} IN ({marks}) ORDER BY created_at, id LIMIT ? OFFSET ?",
                (*wanted, limit, offset))]

    def cancel(self, job_id: str) -> bool:
        """Mark a pending (or delayed, or waiting for a retry) job ``cancelled``, so that it never starts
        again; returns whether it did. A job running in a live process is left alone (only that process
        can interrupt it): this returns ``False`` for it."""
        now = time.time()

        def cancel(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT running, owner FROM jobs WHERE id = ? AND state = 'pending'", (job_id,)).fetchone()
            if row is None or (row[0] and self.owner_alive(row[1])):
                return False
            db.execute("UPDATE jobs SET state = 'cancelled', running = 0, replay = 0, updated_at = ?,"
                       " finished_at = ?, error = ? WHERE id = ?", (now, now, CANCELLED, job_id))
            return True

        return bool(self._transaction(cancel))

    def iter_rows(self, states: Iterable[str], batch: int = 1000) -> Iterator[Row]:
        """Every job in ``states``, oldest first, read ``batch`` rows at a time.

        In insertion order (``rowid``: a job keeps its row when it is retried or requeued), so each batch
        starts where the last ended on the table's own b-tree (``+state`` keeps SQLite off the state index,
        which would sort the matches again for every batch), and a whole listing reads the table once:
        ordering by ``created_at``, which has no index, took 224 s for 500,000 rows, this 35 s.
        """
        wanted = list(states)
        marks = ",".join("?" for _ in wanted)
        after = -1
        while True:
            with self._lock:
                found = self._db.execute(f"SELECT rowid, {', '.join(FIELDS)} FROM jobs WHERE +state IN ({marks})"
                                         " AND rowid > ? ORDER BY rowid LIMIT ?", (*wanted, after, batch)).fetchall()
            yield from (Row(*row[1:]) for row in found)
            if len(found) < batch:
                return
            after = found[-1][0]

    def counts(self) -> dict[str, int]:
        """Number of jobs per state."""
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())

    def pending_split(self, now: float) -> list[tuple[Optional[str], bool, bool, int]]:
        """`JournalBackend.pending_split`."""
        with self._lock:
            return [(owner, bool(running), bool(later), int(count)) for owner, running, later, count in self._db.execute(
                "SELECT owner, running > 0, next_at > ?, COUNT(*) FROM jobs WHERE state = 'pending' GROUP BY 1, 2, 3",
                (now,)).fetchall()]

    def requeue(self, ids: Sequence[str] = (), *, all_dead: bool = False, as_of: Optional[float] = None) -> int:
        """`JournalBackend.requeue`."""
        now = time.time()
        reset = ("UPDATE jobs SET state = 'pending', attempts = 0, next_at = 0, error = NULL, running = 0,"
                 " owner = NULL, replay = 0, result = NULL, started_at = NULL, finished_at = NULL, updated_at = ?")
        unchanged, since = ("", ()) if as_of is None else (" AND updated_at <= ?", (as_of,))
        if all_dead:
            return self._transaction(lambda db: db.execute(f"{reset} WHERE state = 'dead'{unchanged}",
                                                           (now, *since)).rowcount)
        return self._transaction(lambda db: sum(db.execute(
            f"{reset} WHERE id = ? AND state != 'pending'{unchanged}", (now, job_id, *since)).rowcount for job_id in ids))

    def purge(self, states: Iterable[str], older_than: float) -> int:
        """Delete rows in ``states`` (``done``/``dead``/``cancelled``) last updated more than ``older_than`` seconds ago;
        returns how many."""
        cutoff = time.time() - older_than
        wanted = [state for state in states if state != "pending"]
        marks = ",".join("?" for _ in wanted) or "NULL"
        return self._transaction(lambda db: db.execute(
            f"DELETE FROM jobs WHERE state IN ({marks}) AND updated_at < ?", (*wanted, cutoff)).rowcount)

    def close(self) -> None:
        """Close the connection and give up ownership (its lock file is removed: no rows are left to it
        unless a stop left pending ones, which any live worker then claims)."""
        with self._lock:
            self._db.close()
            if self._now is not None:
                self._now.close()
        if self._lock_fd is not None and self.token is not None:
            try:
                os.unlink(self._owner_file(self.token))
            except FileNotFoundError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = None


def _commit(db: sqlite3.Connection, work: Callable[[sqlite3.Connection], Any], *, begun: bool = False) -> Any:
    """``work(db)`` in one ``BEGIN IMMEDIATE`` transaction (``begun``: already begun), committed; rolled back
    if it raises."""
    if not begun:
        db.execute("BEGIN IMMEDIATE")
    try:
        result = work(db)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return result


#: The name the SQLite journal had before the PostgreSQL one existed.
Journal = SqliteJournal


def _lock_held(path: str) -> bool:
    """Whether a live process holds the ``flock`` of the owner file ``path``; a free one is removed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return False


def recover(state_dir: str) -> tuple[int, str]:
    """Rebuild a damaged journal (``database disk image is malformed``) from the rows SQLite can still read.

    Every row of ``jobs`` is read by a full table scan (``NOT INDEXED``, so a corrupt index page is
    never touched), the damaged file and its ``-wal``/``-shm`` are moved aside to
    ``journal.sqlite3.damaged-UNIXTIME``, and the rows are written into a new journal with fresh
    indexes. Pending rows keep their owners, whose processes are gone, so the next worker claims and
    replays them; done and dead rows keep their state. Blocking; run it with every worker on this
    ``state_dir`` stopped (``zqsync jobs recover --state-dir DIR``).

    :param state_dir: the worker's ``--state-dir``.
    :returns: ``(rows copied, path of the damaged file kept aside)``.
    :raises ConfigurationError: no journal in ``state_dir``, or a live worker still owns it.
    :raises sqlite3.DatabaseError: the table's own pages are unreadable too (the damaged file is left in
        place; ``sqlite3 journal.sqlite3 .recover`` may still save rows).
    """
    path = journal_path(state_dir)
    if not os.path.exists(path):
        raise ConfigurationError(f"no journal in {state_dir!r}", setting="state_dir")
    owners = os.path.join(state_dir, OWNERS)
    live = [name for name in (os.listdir(owners) if os.path.isdir(owners) else [])
            if name.endswith(".lock") and _lock_held(os.path.join(owners, name))]
    if live:
        raise ConfigurationError(f"a worker still owns the journal in {state_dir!r} ({live[0][:-5]}): stop it first",
                                 setting="state_dir")
    damaged = sqlite3.connect(path, isolation_level=None)
    try:
        columns = [row[1] for row in damaged.execute("PRAGMA table_info(jobs)")]
        rows = damaged.execute(f"SELECT {', '.join(columns)} FROM jobs NOT INDEXED").fetchall()
    finally:
        damaged.close()
    aside = f"{path}.damaged-{int(time.time())}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    journal = SqliteJournal(state_dir)
    insert = f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    try:
        journal._transaction(lambda db: db.executemany(insert, rows))
    finally:
        journal.close()
    return len(rows), aside


def _forget_lock(journal: "weakref.ReferenceType[SqliteJournal]") -> Callable[[], None]:
    def forget() -> None:
        alive = journal()
        if alive is not None and alive._lock_fd is not None:
            os.close(alive._lock_fd)  # our copy only: the parent's lock stays held
            alive._lock_fd = None
            alive.token = None

    return forget
