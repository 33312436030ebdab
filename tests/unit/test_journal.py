"""The SQLite journal: duplicates by id, ownership by boot token, claims, attempts, pruning, threads."""

from __future__ import annotations

import os
import time

import gevent

from zqsync.worker.journal import ALONE, DIED, SHARED, Journal, Outcome, Start


def test_a_job_id_is_journaled_once(tmp_path):
    journal = Journal(str(tmp_path))
    journal.register()
    assert journal.write([("a", "t", b"1", 0), ("b", "t", b"2", 0), ("a", "t", b"1", 0)]) == [None, None, "pending"]
    assert journal.counts() == {"pending": 2}


def owner(tmp_path) -> Journal:
    journal = Journal(str(tmp_path))
    journal.register()
    return journal


def test_claiming_takes_only_the_pending_jobs_of_dead_owners_whatever_the_pids(tmp_path):
    dead, alive, me = owner(tmp_path), owner(tmp_path), owner(tmp_path)
    dead.write([("dead-1", "t", b"", 0), ("done", "t", b"", 0)])
    dead.write(outcomes=[Outcome("done", "done", 1, 0.0, None)])
    alive.write([("alive-1", "t", b"", 0)])
    me.write([("mine", "t", b"", 0)])
    dead.close()  # its lock is released: its token is dead, though every pid here is the same
    claim = me.claim(["t"])
    assert claim.claimed == 1 and claim.died == []
    assert [row.id for row in me.take_replays(10)] == ["dead-1"]
    assert me.take_replays(10) == [], "handed out once"
    assert me.claim(["t"]).claimed == 0, "claimed once, not again"


def test_a_job_that_died_running_alone_with_attempts_exhausted_is_dead_lettered(tmp_path):
    dead, me = owner(tmp_path), owner(tmp_path)
    dead.write([("poison", "t", b"", 1), ("shared", "t", b"", 0), ("young", "t", b"", 1)])
    dead.write(starts=[Start("poison", ALONE, 0.0), Start("shared", SHARED, 0.0), Start("young", ALONE, 0.0)])
    dead.write(starts=[Start("poison", ALONE, 0.0)])
    dead.close()
    claim = me.claim(["t"])
    assert claim.died == ["poison"]
    assert me.rows(ids=["poison"])[0].error == DIED
    assert sorted((row.id, row.attempts, row.running) for row in me.take_replays(10)) == [
        ("shared", 1, SHARED), ("young", 1, ALONE)]


def test_an_insert_that_counts_the_first_attempt_dies_shared_so_the_job_is_replayed_not_dead_lettered(tmp_path):
    dead, me = owner(tmp_path), owner(tmp_path)
    dead.write([("taken", "t", b"", 0)])  # already journaled: a counting insert of the same id leaves it alone
    assert dead.write([("counted", "t", b"", 0, 0.0, 123.0), ("taken", "t", b"", 0, 0.0, 123.0)]) == [None, "pending"]
    rows = {row.id: row for row in dead.rows(ids=["counted", "taken"])}
    assert (rows["counted"].attempts, rows["counted"].running, rows["counted"].next_at) == (1, SHARED, 123.0)
    assert rows["counted"].started_at is not None
    assert (rows["taken"].attempts, rows["taken"].running, rows["taken"].started_at) == (0, 0, None)
    dead.close()  # died between the commit and the start, with no retries left
    claim = me.claim(["t"])
    assert claim.died == [] and claim.claimed == 2
    assert sorted((row.id, row.attempts, row.running) for row in me.take_replays(10)) == [
        ("counted", 1, SHARED), ("taken", 0, 0)]


def test_foreign_tasks_are_left_unclaimed_and_reported(tmp_path):
    dead, me = owner(tmp_path), owner(tmp_path)
    dead.write([("x", "theirs", b"", 0), ("y", "t", b"", 0)])
    dead.close()
    claim = me.claim(["t"])
    assert (claim.claimed, claim.foreign) == (1, {"theirs": 1})
    assert me.rows(ids=["x"])[0].owner != me.token


def test_prune_deletes_only_old_done_rows(tmp_path):
    journal = owner(tmp_path)
    journal.write([("old", "t", b"", 0), ("pending", "t", b"", 0)])
    journal.write(outcomes=[Outcome("old", "done", 1, 0.0, None)])
    assert journal.prune(older_than=3600) == 0
    time.sleep(0.01)
    assert journal.prune(older_than=0.0) == 1
    assert journal.counts() == {"pending": 1}


def test_writes_and_claims_from_two_native_threads_never_interleave_transactions(tmp_path):
    """The worker's write loop and replay loop call in from different thread-pool threads."""
    journal = owner(tmp_path)
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
        pool.spawn(hammer, lambda: journal.write([(f"j{next(counter)}", "t", b"", 0)])),
        pool.spawn(hammer, lambda: journal.claim(["t"])),
    ]
    for job in jobs:
        job.get(timeout=30)
    assert errors == []


def test_lock_files_of_owners_that_are_gone_are_swept(tmp_path):
    me, gone = owner(tmp_path), owner(tmp_path)
    os.close(gone._lock_fd)  # as a SIGKILL would: the lock is released, the file stays
    gone._lock_fd = None
    assert len(os.listdir(tmp_path / "owners")) == 2
    assert me.sweep_owners() == 1
    assert os.listdir(tmp_path / "owners") == [f"{me.token}.lock"]
