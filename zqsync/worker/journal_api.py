"""What the worker needs of a journal of confirmed jobs, and how a journal is chosen by URL.

Two implementations keep the same rows with the same rules:

* ``sqlite:///PATH`` (``journal.py``, the default, ``--state-dir PATH``): one
  SQLite file shared by the processes of one worker host;
* ``postgresql://USER@HOST:PORT/DB`` (``journal_pg.py``): one database shared by
  a fleet of workers on any number of hosts.

The rules both keep (``tests/contract/test_journal_contract.py`` checks them on both):

* A job's ``id`` is unique in the journal: a second insert of it is refused and
  answered with the state of the row already there (a duplicate).
* Rows belong to an **owner token**, one per worker process and boot
  (`JournalBackend.register`); an owner is alive while its process holds
  it (an ``flock`` for SQLite, a renewed lease for PostgreSQL). A live worker
  claims the pending rows of owners that are gone (`claim`),
  for its own tasks, and replays them in bounded batches (`take_replays`).
* Attempts are counted *before* a job runs (``starts``, ``running`` set: `SHARED`
  alongside other jobs, `ALONE` alone). A claimed row that was running alone with
  ``attempts > retries`` is dead-lettered with `DIED` (the poison-job rule).
* States: ``pending`` (``next_at`` its due or retry time), ``done`` (with its ``result``),
  ``dead`` (the dead letters), ``cancelled`` (never started again, never overwritten by the
  outcome of an attempt already running), ``expired`` (not started by its expiry, recorded by the
  worker that would have started it: never started, claimed or replayed).
* A `Join` (canvas: a chain's next step, a chord's callback) travels with the outcome of one of
  its members. In the transaction that stores that outcome, under a lock on the join's key (SQLite:
  its one writer; PostgreSQL: ``pg_advisory_xact_lock``), the members' rows are read; once all are
  finished the successor is inserted, unowned (any live worker with its task claims it), and only
  once: its id is the primary key, so two members finishing at the same instant, or an outcome
  stored twice, cannot journal it twice, and a kill between "member done" and "successor journaled"
  cannot separate them.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib.util
import urllib.parse
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Sequence

from ..errors import ConfigurationError

#: The dead-letter reason of a job whose process died while it ran alone, retries exhausted.
DIED = "worker died while running it"
#: The error of a job cancelled before an attempt started.
CANCELLED = "JobCancelled: the job was cancelled before it ran"
#: ``running`` values.
SHARED, ALONE = 1, 2
#: The row states.
STATES = ("pending", "done", "dead", "cancelled", "expired")
#: The states a row never leaves (but by ``requeue``), which ``purge`` deletes.
FINISHED_STATES = STATES[1:]


class Row(NamedTuple):
    """One journaled job. ``body`` is the original request frame (msgpack bytes); times are epoch seconds."""

    id: str
    task: str
    body: bytes
    state: str
    attempts: int
    next_at: float
    owner: Optional[str]
    error: Optional[str]
    created_at: float
    updated_at: float
    running: int
    retries: int
    result: Optional[bytes] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None


FIELDS = Row._fields


class NewJob(NamedTuple):
    """A confirmed job to journal: ``due`` (epoch seconds) above 0 makes it a delayed job.

    ``retry_at`` above 0 counts its first attempt in the insert itself, as a `Start` would
    (``running`` `SHARED`, ``retry_at`` its ``next_at``): the job starts as soon as it is
    committed, so it needs no transaction of its own to count that attempt. A row that already
    exists is left as it is.
    """

    id: str
    task: str
    body: bytes
    retries: int
    due: float = 0.0
    retry_at: float = 0.0


class Member(NamedTuple):
    """A job a `Join` waits for, as its row stands (``result``: the encoded result of a ``done`` one)."""

    id: str
    state: str
    result: Optional[bytes]
    error: Optional[str]


class Join(NamedTuple):
    """A successor to journal once every job of ``members`` is finished (the module docstring).

    ``make(members, in the order of `members`)`` builds it, or returns ``None`` when none is due (a
    member failed and the canvas stops); it runs in the journal's transaction and must not raise.
    ``key`` (the successor's id) serialises the joins of one successor across transactions.
    """

    key: str
    members: tuple[str, ...]
    make: Callable[[list[Member]], Optional[NewJob]]


def joined(join: Join, found: Iterable[Sequence[Any]]) -> Optional[NewJob]:
    """The successor of ``join`` if every member is finished (``found``: their ``(id, state, result, error)``
    rows, any order), else ``None``."""
    members = {row[0]: Member(*row) for row in found}
    if len(members) < len(set(join.members)) or any(m.state not in FINISHED_STATES for m in members.values()):
        return None
    return join.make([members[job_id] for job_id in join.members])


class Outcome(NamedTuple):
    """What became of one attempt: the new ``state``, ``attempts``, ``next_at`` and ``error``; ``join``: the
    canvas successor this job is a member of, evaluated in the same transaction."""

    id: str
    state: str
    attempts: int
    next_at: float
    error: Optional[str]
    result: Optional[bytes] = None
    join: Optional[Join] = None


#: The columns an `Outcome` writes.
OUTCOME_COLUMNS = Outcome._fields[:6]


class Start(NamedTuple):
    """An attempt about to start: counted first. ``running`` is `SHARED` or `ALONE`;
    ``retry_at`` is when to retry it should its process die meanwhile (epoch seconds)."""

    id: str
    running: int
    retry_at: float


@dataclasses.dataclass
class Claim:
    """What one `JournalBackend.claim` did: rows taken over, rows dead-lettered as `DIED`
    (their ids), and orphans left alone because their task is not ours (``{task: rows}``)."""

    claimed: int = 0
    died: list[str] = dataclasses.field(default_factory=list)
    foreign: dict[str, int] = dataclasses.field(default_factory=dict)


class JournalBackend(abc.ABC):
    """A connection to a journal. Every method blocks (a gevent worker calls them from native
    threads: its writer thread and its thread pool, more than one at a time) and raises the
    backend's database error (``sqlite3.Error``, ``psycopg.Error``) when the journal cannot be
    read or written; nothing is committed then. A connection owns no rows until `register`
    (``zqsync jobs`` never registers)."""

    #: This connection's owner token once registered, else ``None``.
    token: Optional[str] = None

    # -- ownership ---------------------------------------------------------

    @abc.abstractmethod
    def register(self) -> str:
        """Become a live owner with a new random token, held until `close` or the process's
        death; returns the token. A process forked from this one does not inherit it."""

    @abc.abstractmethod
    def owner_alive(self, token: Optional[str]) -> bool:
        """Whether the owner ``token`` is alive (``None``, no owner, is not)."""

    @abc.abstractmethod
    def sweep_owners(self) -> int:
        """Forget owners that are gone; returns how many."""

    def repair_hint(self, exc: BaseException) -> str:
        """What an operator can do about ``exc`` from this journal (with a leading space), or ``""``."""
        return ""

    # -- writes ------------------------------------------------------------

    @abc.abstractmethod
    def probe(self) -> None:
        """Whether the journal can be written again: one row of this owner's written and committed
        (an empty transaction would succeed on a full disk). Raises as `write_all`."""

    @abc.abstractmethod
    def write_all(
        self, jobs: Iterable[tuple[Any, ...]] = (), outcomes: Iterable[Outcome] = (), starts: Iterable[Start] = (),
    ) -> tuple[list[Optional[str]], set[str]]:
        """In one transaction (group commit), in this order: store attempt ``outcomes`` (not over a
        ``cancelled`` row), count the ``starts`` (attempts + 1, ``running`` and ``next_at`` set), journal
        the successors of the outcomes' joins that are due (`joined`, unowned, keys locked in sorted
        order), and journal new ``jobs`` (`NewJob` fields), owned by this connection's token.

        :returns: per job, ``None`` if it is new, else the state of the row already journaled under
            its id; and the ids of ``starts`` refused because their row is no longer pending
            (cancelled meanwhile): those attempts must not run.
        """

    def write_now(
        self, jobs: Iterable[tuple[Any, ...]] = (), outcomes: Iterable[Outcome] = (),
    ) -> Optional[tuple[list[Optional[str]], set[str]]]:
        """`write_all` (no starts) from the hub's own thread, if it can be done without waiting: never for a
        lock another connection or process holds, an fsync, or a checkpoint. ``None``: it was not done (the
        caller hands the work to `write_all` in the writer thread); this default never does it.

        :raises: as `write_all` (nothing is committed).
        """
        return None

    def write(
        self, jobs: Iterable[tuple[Any, ...]] = (), outcomes: Iterable[Outcome] = (), starts: Iterable[Start] = (),
    ) -> list[Optional[str]]:
        """`write_all`, returning only the per-job answers."""
        return self.write_all(jobs, outcomes, starts)[0]

    @abc.abstractmethod
    def claim(self, tasks: Sequence[str]) -> Claim:
        """Take over the pending rows of owners that are gone (or of none) whose task is in ``tasks``;
        they are marked for replay (`take_replays`). Those that died running alone with
        ``attempts > retries`` are dead-lettered (`DIED`) instead. Needs `register`."""

    @abc.abstractmethod
    def take_replays(self, limit: int) -> list[Row]:
        """At most ``limit`` of this owner's claimed rows that are due, unsuspected ones first, then by
        ``next_at``; each is handed out once (its replay mark is cleared in the same transaction)."""

    # -- operators -----------------------------------------------------------

    @abc.abstractmethod
    def rows(self, states: Iterable[str] = ("pending", "dead"), *, ids: Sequence[str] = (),
             limit: int = 1000, offset: int = 0) -> list[Row]:
        """Jobs in ``states`` (or with one of ``ids``, any state), oldest first (by ``created_at``,
        then ``id``), at most ``limit`` after skipping ``offset``."""

    @abc.abstractmethod
    def iter_rows(self, states: Iterable[str], batch: int = 1000) -> Iterator[Row]:
        """Every job in ``states``, oldest first, read ``batch`` rows at a time."""

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Number of jobs per state (states without jobs are left out)."""

    @abc.abstractmethod
    def cancel(self, job_id: str) -> bool:
        """Mark a pending (or delayed, or waiting for a retry) job ``cancelled``, so that it never starts
        again; returns whether it did. A job running under a live owner is left alone (only its process
        can interrupt it): this returns ``False`` for it."""

    @abc.abstractmethod
    def pending_split(self, now: float) -> list[tuple[Optional[str], bool, bool, int]]:
        """The pending jobs counted by ``(owner, running, due after now, count)``, so that a status can
        tell running (an attempt counted under a live owner), scheduled (due later) and pending apart."""

    @abc.abstractmethod
    def requeue(self, ids: Sequence[str] = (), *, all_dead: bool = False, as_of: Optional[float] = None) -> int:
        """Make ``ids`` (or every dead job) pending again, unowned, attempts reset: a live worker with
        the task claims and runs them. Done jobs can be requeued too. With ``as_of`` (epoch seconds),
        only rows last changed at or before it: a requeue sent twice for one listing (read at ``as_of``)
        requeues once, since the first one changed them. Returns how many rows changed."""

    @abc.abstractmethod
    def purge(self, states: Iterable[str], older_than: float) -> int:
        """Delete rows in ``states`` (never ``pending``) last updated more than ``older_than`` seconds
        ago; returns how many."""

    def prune(self, older_than: float) -> int:
        """Delete ``done`` rows last updated more than ``older_than`` seconds ago; returns how many."""
        return self.purge(("done",), older_than)

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection and give up ownership: pending rows left to it are claimed by any
        live worker at once."""


class JournalURL(NamedTuple):
    """A parsed journal URL: ``kind`` is ``"sqlite"`` (``target`` the state directory) or
    ``"postgresql"`` (``target`` the libpq connection URL)."""

    kind: str
    target: str


def parse_journal_url(url: str, setting: str = "journal") -> JournalURL:
    """Parse ``sqlite:///PATH`` (PATH is everything after the third slash: ``sqlite:////var/lib/zqsync``
    is absolute, ``sqlite:///state`` relative) or ``postgresql://USER@HOST:PORT/DB`` (``postgres://``
    too; any libpq URL parameter may follow).

    :raises ConfigurationError: anything else, naming ``setting``.
    """
    text = str(url).strip()
    parts = urllib.parse.urlsplit(text)
    if parts.scheme == "sqlite":
        path = text[len("sqlite:///"):] if text.startswith("sqlite:///") else ""
        if not path:
            raise ConfigurationError(f"a SQLite journal URL is sqlite:///PATH (the state directory), got {url!r}",
                                     setting=setting)
        return JournalURL("sqlite", path)
    if parts.scheme in ("postgresql", "postgres"):
        if not parts.hostname or not parts.path.strip("/"):
            raise ConfigurationError(f"a PostgreSQL journal URL is postgresql://USER@HOST:PORT/DB, got {url!r}",
                                     setting=setting)
        try:
            _ = parts.port
        except ValueError:
            raise ConfigurationError(f"the port of journal URL {url!r} is not a number", setting=setting) from None
        return JournalURL("postgresql", text)
    raise ConfigurationError(f"a journal is sqlite:///PATH or postgresql://USER@HOST:PORT/DB, got {url!r}",
                             setting=setting)


def open_journal(url: str, *, synchronous: str = "NORMAL", busy_timeout: float = 30.0,
                 lease: float = 10.0) -> JournalBackend:
    """Open the journal at ``url`` (`parse_journal_url`), creating its schema if missing.

    :param synchronous: SQLite's ``synchronous`` (ignored by PostgreSQL, whose server settings decide).
    :param busy_timeout: seconds a write waits for another's lock before it fails.
    :param lease: PostgreSQL: seconds an owner's lease lasts unless renewed (ignored by SQLite, whose
        owners hold an ``flock`` for as long as they live).
    :raises ConfigurationError: a bad URL, ``psycopg`` not installed for a PostgreSQL URL, or a SQLite
        journal that cannot be opened (its directory cannot be made, its file is not a database).
    :raises psycopg.Error: a PostgreSQL journal cannot be opened.
    """
    kind, target = parse_journal_url(url)
    if kind == "sqlite":
        import sqlite3

        from .journal import SqliteJournal

        try:
            return SqliteJournal(target, synchronous=synchronous, busy_timeout=busy_timeout)
        except (OSError, sqlite3.Error) as exc:
            damaged = isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)
            hint = f" (a damaged file: run `zqsync jobs recover --state-dir {target}`)" if damaged else ""
            raise ConfigurationError(f"cannot open the journal in {target}: {exc}{hint}", setting="state_dir") from exc
    if importlib.util.find_spec("psycopg") is None:
        raise ConfigurationError("a PostgreSQL journal needs psycopg: pip install 'zqsync[postgresql]'",
                                 setting="journal")
    from .journal_pg import PostgresJournal

    return PostgresJournal(target, busy_timeout=busy_timeout, lease=lease)
