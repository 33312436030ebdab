"""The SQLite journal: duplicates by id, orphan claims, pruning, and safety across threads."""

from __future__ import annotations

import time

import gevent

from zqsync.worker.journal import Journal, Outcome


def test_a_job_id_is_journaled_once(tmp_path):
    journal = Journal(str(tmp_path))
    assert journal.write([("a", "t", b"1"), ("b", "t", b"2"), ("a", "t", b"1")], owner_pid=1) == [True, True, False]
    assert journal.counts() == {"pending": 2}


def test_claiming_takes_only_the_pending_jobs_of_dead_owners(tmp_path):
    journal = Journal(str(tmp_path))
    journal.write([("dead-1", "t", b"")], owner_pid=101)
    journal.write([("alive-1", "t", b"")], owner_pid=102)
    journal.write([("mine", "t", b"")], owner_pid=103)
    journal.write([("done", "t", b"")], owner_pid=101)
    journal.write([], [Outcome("done", "done", 1, 0.0, None)], owner_pid=101)
    claimed = journal.claim_orphans(103, is_alive=lambda pid: pid == 102)
    assert [row.id for row in claimed] == ["dead-1"]
    assert journal.claim_orphans(103, is_alive=lambda pid: pid == 102) == [], "claimed once, not again"


def test_prune_deletes_only_old_done_rows(tmp_path):
    journal = Journal(str(tmp_path))
    journal.write([("old", "t", b""), ("pending", "t", b"")], owner_pid=1)
    journal.write([], [Outcome("old", "done", 1, 0.0, None)], owner_pid=1)
    assert journal.prune(older_than=3600) == 0
    time.sleep(0.01)
    assert journal.prune(older_than=0.0) == 1
    assert journal.counts() == {"pending": 1}


def test_writes_and_claims_from_two_native_threads_never_interleave_transactions(tmp_path):
    """The worker's write loop and orphan loop call in from different thread-pool threads."""
    journal = Journal(str(tmp_path))
    deadline = time.monotonic() + 1.0
    errors: list[BaseException] = []

    def hammer(work) -> None:
        while time.monotonic() < deadline:
            try:
                work()
            except Exception as exc:  # collected and asserted below
                errors.append(exc)

    counter = iter(range(10**9))
    pool = gevent.get_hub().threadpool  # native threads, plain or monkey-patched
    jobs = [
        pool.spawn(hammer, lambda: journal.write([(f"j{next(counter)}", "t", b"")], owner_pid=1)),
        pool.spawn(hammer, lambda: journal.claim_orphans(2, is_alive=lambda pid: True)),
    ]
    for job in jobs:
        job.get(timeout=30)
    assert errors == []
