"""What only the SQLite journal does: owner lock files, and `write_now` (a commit that never waits) for the
hub. The rules every journal keeps are checked on each backend by tests/contract/test_journal_contract.py."""

from __future__ import annotations

import os
import sqlite3
import time

from zqsync.worker import journal as journal_module
from zqsync.worker.journal import Journal, NewJob, Outcome


def owner(tmp_path) -> Journal:
    journal = Journal(str(tmp_path))
    journal.register()
    return journal


def test_lock_files_of_owners_that_are_gone_are_swept(tmp_path):
    me, gone = owner(tmp_path), owner(tmp_path)
    os.close(gone._lock_fd)  # as a SIGKILL would: the lock is released, the file stays
    gone._lock_fd = None
    assert len(os.listdir(tmp_path / "owners")) == 2
    assert me.sweep_owners() == 1
    assert os.listdir(tmp_path / "owners") == [f"{me.token}.lock"]


def _row(journal: Journal, job_id: str) -> tuple:
    with sqlite3.connect(journal.path) as db:  # another connection sees committed rows only
        return db.execute("SELECT state, attempts FROM jobs WHERE id = ?", (job_id,)).fetchone()


def test_write_now_commits_jobs_and_outcomes_on_a_connection_that_never_checkpoints(tmp_path):
    journal = owner(tmp_path)
    assert journal.write_now([NewJob("a", "t", b"body", 0, 0.0, time.time() + 1.0)]) == ([None], set())
    assert journal.write_now([NewJob("b", "t", b"body", 0), NewJob("a", "t", b"body", 0)],
                             [Outcome("a", "done", 1, 0.0, None, b"")]) == ([None, "done"], set())
    assert (_row(journal, "a"), _row(journal, "b")) == (("done", 1), ("pending", 0))
    # its own connection: SQLite's automatic checkpoint never runs in the hub's commits
    assert journal._now.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)


def test_write_now_declines_at_once_under_another_connections_write_lock_and_writes_nothing(tmp_path):
    journal = owner(tmp_path)
    holder = sqlite3.connect(journal.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert journal.write_now([NewJob("locked-out", "t", b"body", 0)]) is None
        assert time.monotonic() - started < 1.0, "write_now waited for the write lock"
    finally:
        holder.rollback()
        holder.close()
    assert _row(journal, "locked-out") is None
    assert journal.write_now([NewJob("after", "t", b"body", 0)]) == ([None], set())


def test_write_now_declines_under_synchronous_full_and_hands_every_64th_batch_back(tmp_path):
    full = Journal(str(tmp_path / "full"), synchronous="FULL")
    full.register()
    assert full.write_now([NewJob("fsync", "t", b"body", 0)]) is None  # an fsync per commit would stall the hub
    journal = owner(tmp_path / "normal")
    declined = [index for index in range(3 * journal_module.NOW_HANDS_BACK)
                if journal.write_now([NewJob(f"job-{index}", "t", b"body", 0)]) is None]
    assert declined == [journal_module.NOW_HANDS_BACK * n - 1 for n in (1, 2, 3)]


def test_an_older_journals_unused_state_owner_index_is_dropped_and_its_rows_kept(tmp_path):
    journal = owner(tmp_path)
    journal.write_all([NewJob("kept", "t", b"body", 0)])
    with sqlite3.connect(journal.path) as db:  # as journals made before it was dropped have it
        db.execute("CREATE INDEX jobs_by_state_owner_token ON jobs (state, owner)")
    journal.close()
    reopened = owner(tmp_path)
    with sqlite3.connect(reopened.path) as db:
        indexes = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "jobs_by_state_owner_token" not in indexes  # each insert and outcome wrote a page for it
    assert {"jobs_to_replay", "jobs_by_state_updated"} <= indexes
    assert _row(reopened, "kept") == ("pending", 0)
