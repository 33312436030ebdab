"""The journal of confirmed jobs: SQLite through the standard ``sqlite3`` module, in WAL mode.

One file (``STATE_DIR/journal.sqlite3``) is shared by every process of a
worker. A row is written, and committed, before the job is acknowledged;
so an acknowledged job survives a SIGKILL of any worker process and runs at
least once. ``synchronous=NORMAL`` (the default here) makes a commit durable
against process death, which is what at-least-once under SIGKILL needs;
``synchronous=FULL`` adds durability against power loss at an fsync per
commit (SQLite documentation, "PRAGMA synchronous" and "Write-Ahead Logging").

A job's ``id`` is its primary key, so a client's retry of an acknowledged
job is recognised and not run twice while the row is kept (``retention``).
Rows belong to the process that journaled them (``owner_pid``); pending rows
of a process that no longer exists are claimed and replayed by a live one.

States: ``pending`` (to run, possibly after ``next_at``), ``done``, ``dead``
(retries exhausted: the dead-letter table is this state).
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, Callable, Iterable, NamedTuple, Optional

from .._common import native_lock
from ..errors import ConfigurationError

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
CREATE INDEX IF NOT EXISTS jobs_by_state_owner ON jobs (state, owner_pid);
"""

FILENAME = "journal.sqlite3"


class Row(NamedTuple):
    """One journaled job. ``body`` is the original request frame (msgpack bytes)."""

    id: str
    task: str
    body: bytes
    state: str
    attempts: int
    next_at: float
    owner_pid: Optional[int]
    error: Optional[str]
    created_at: float
    updated_at: float


class Outcome(NamedTuple):
    """What became of one attempt: the new ``state``, ``attempts``, ``next_at`` and ``error``."""

    id: str
    state: str
    attempts: int
    next_at: float
    error: Optional[str]


def journal_path(state_dir: str) -> str:
    """The journal file inside ``state_dir``."""
    return os.path.join(state_dir, FILENAME)


class Journal:
    """A connection to the journal in ``state_dir`` (created, with the directory, if missing).

    :param state_dir: directory of the journal file.
    :param synchronous: SQLite ``PRAGMA synchronous``: ``"NORMAL"`` or ``"FULL"``.
    :param busy_timeout: seconds to wait for another process's write lock.

    Blocking (plain ``sqlite3``); a gevent worker calls it from its thread
    pool, from more than one thread at a time, so every use of the one
    connection is serialised by a lock (a transaction begun by one thread
    must never be committed by another).
    """

    def __init__(self, state_dir: str, *, synchronous: str = "NORMAL", busy_timeout: float = 30.0) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ConfigurationError(f"journal synchronous must be NORMAL or FULL, got {synchronous!r}", setting="journal_sync")
        os.makedirs(state_dir, exist_ok=True)
        self.path = journal_path(state_dir)
        self._db = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        self._lock = native_lock()
        self._setup(synchronous.upper(), time.monotonic() + busy_timeout)

    def _setup(self, synchronous: str, deadline: float) -> None:
        # Switching to WAL takes an exclusive lock that SQLite's busy handler
        # does not wait for, so processes starting together retry here.
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"PRAGMA synchronous={synchronous}")
                self._db.executescript(SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _transaction(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = work(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

    def write(
        self, jobs: Iterable[tuple[str, str, bytes]], outcomes: Iterable[Outcome] = (), *, owner_pid: int
    ) -> list[bool]:
        """In one transaction (group commit): journal new ``(id, task, body)`` jobs and store attempt outcomes.

        :returns: per job, ``True`` if it is new, ``False`` if its id was already journaled.
        """
        now = time.time()

        def apply(db: sqlite3.Connection) -> list[bool]:
            db.executemany(
                "UPDATE jobs SET state = ?, attempts = ?, next_at = ?, error = ?, updated_at = ? WHERE id = ?",
                [(o.state, o.attempts, o.next_at, o.error, now, o.id) for o in outcomes],
            )
            return [
                db.execute(
                    "INSERT OR IGNORE INTO jobs (id, task, body, state, owner_pid, created_at, updated_at)"
                    " VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                    (job_id, task, body, owner_pid, now, now),
                ).rowcount == 1
                for job_id, task, body in jobs
            ]

        return self._transaction(apply)

    def claim_orphans(self, owner_pid: int, is_alive: Callable[[int], bool]) -> list[Row]:
        """Take over the pending jobs of processes that no longer exist.

        :returns: only the rows taken over now (oldest first), never ones ``owner_pid`` already had.
        """

        def claim(db: sqlite3.Connection) -> list[Row]:
            owners = [row[0] for row in db.execute(
                "SELECT DISTINCT owner_pid FROM jobs WHERE state = 'pending' AND owner_pid IS NOT ?", (owner_pid,))]
            claimed: list[Row] = []
            for pid in owners:
                if pid is not None and is_alive(pid):
                    continue
                claimed += [Row(*row) for row in db.execute(
                    "SELECT * FROM jobs WHERE state = 'pending' AND owner_pid IS ?", (pid,))]
                db.execute("UPDATE jobs SET owner_pid = ? WHERE state = 'pending' AND owner_pid IS ?", (owner_pid, pid))
            return sorted(claimed, key=lambda row: row.created_at)

        return self._transaction(claim)

    def rows(self, states: Iterable[str] = ("pending", "dead"), *, limit: int = 1000) -> list[Row]:
        """Jobs in ``states``, oldest first, at most ``limit``."""
        wanted = list(states)
        marks = ",".join("?" for _ in wanted)
        query = f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created_at LIMIT ?"
        with self._lock:
            return [Row(*row) for row in self._db.execute(query, (*wanted, limit))]

    def counts(self) -> dict[str, int]:
        """Number of jobs per state."""
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())

    def prune(self, older_than: float) -> int:
        """Delete ``done`` rows last updated more than ``older_than`` seconds ago; returns how many."""
        cutoff = time.time() - older_than
        return self._transaction(
            lambda db: db.execute("DELETE FROM jobs WHERE state = 'done' AND updated_at < ?", (cutoff,)).rowcount
        )

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()
