"""The journal contract (``zqsync/worker/journal_api.py``), checked on every backend: SQLite and PostgreSQL.

Each test opens connections to one journal as separate owners (as separate worker processes would),
and makes an owner die as its process or host would (:meth:`Backend.lose`): the SQLite owner's
``flock`` released, the PostgreSQL owner's lease left to expire. The PostgreSQL runs use a real
server started by the tests (``tests/pgserver.py``) and skip with the reason where there is none.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import gevent
import pytest

from tests.helpers import wait_for
from zqsync.worker.journal_api import ALONE, CANCELLED, DIED, SHARED, JournalBackend, Outcome, Start, open_journal

#: Seconds a PostgreSQL owner's lease lasts here: a lost owner is seen expired this long after.
LEASE = 1.0


class Backend:
    """Opens owners of one journal and loses them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.opened: list[JournalBackend] = []

    def open(self) -> JournalBackend:
        """A connection that is not an owner (as ``zqsync jobs`` opens one)."""
        journal = open_journal(self.url, lease=LEASE)
        self.opened.append(journal)
        return journal

    def owner(self) -> JournalBackend:
        journal = self.open()
        journal.register()
        return journal

    def lose(self, journal: JournalBackend) -> None:
        """``journal``'s owner dies without closing (SIGKILL, host gone); returns once others see it dead."""
        token = journal.token
        if self.url.startswith("sqlite"):
            os.close(journal._lock_fd)  # type: ignore[attr-defined]  # the lock goes, the file stays
            journal._lock_fd = None  # type: ignore[attr-defined]
        else:
            journal._renewing.release()  # type: ignore[attr-defined]  # its lease is renewed no more
            journal._renewing = None  # type: ignore[attr-defined]
        observer = self.open()
        wait_for(lambda: not observer.owner_alive(token), what=f"owner {token} seen dead")

    def close(self) -> None:
        for journal in self.opened:
            try:
                journal.close()
            except Exception:  # a connection closed by its test already
                pass


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path) -> Iterator[Backend]:
    url = f"sqlite:///{tmp_path}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    opened = Backend(url)
    yield opened
    opened.close()


def test_a_job_id_is_journaled_once_fleet_wide(backend):
    one, other = backend.owner(), backend.owner()
    assert one.write([("a", "t", b"1", 0), ("b", "t", b"2", 0), ("a", "t", b"1", 0)]) == [None, None, "pending"]
    assert other.write([("a", "t", b"1", 0), ("c", "t", b"3", 0)]) == ["pending", None]
    one.write(outcomes=[Outcome("a", "done", 1, 0.0, None, b"result")])
    assert other.write([("a", "t", b"1", 0)]) == ["done"]
    assert backend.open().counts() == {"pending": 2, "done": 1}
    assert [row.owner for row in one.rows(ids=["c"])] == [other.token]


def test_two_owners_journaling_the_same_ids_at_once_journal_each_once(backend):
    """Two workers given the same jobs at the same instant (a failover's resends): each id is new to one."""
    owners = backend.owner(), backend.owner()
    chunks = [[(f"j{n}", "t", b"", 0) for n in range(start, start + 20)] for start in range(0, 400, 20)]
    pool = gevent.get_hub().threadpool  # native threads, plain or monkey-patched
    writers = [pool.spawn(lambda owner: [answer for chunk in chunks for answer in owner.write(chunk)], owner)
               for owner in owners]
    answers = list(zip(*(writer.get(timeout=60) for writer in writers)))
    assert [sorted(pair, key=str) for pair in answers] == [[None, "pending"]] * 400  # new to one, a duplicate to the other
    assert backend.open().counts() == {"pending": 400}


def test_an_insert_keeps_the_job_as_sent(backend):
    journal = backend.owner()
    before = time.time()
    journal.write([("j", "task", b"\x00\xffbody", 3)])
    row = journal.rows(ids=["j"])[0]
    assert (row.task, row.body, row.state, row.attempts, row.retries, row.running, row.next_at) == (
        "task", b"\x00\xffbody", "pending", 0, 3, 0, 0.0)
    assert row.owner == journal.token and before <= row.created_at <= time.time()
    assert (row.result, row.error, row.started_at, row.finished_at) == (None, None, None, None)


def test_attempts_are_counted_before_the_run_and_outcomes_after(backend):
    journal = backend.owner()
    journal.write([("j", "t", b"", 1)])
    assert journal.write_all(starts=[Start("j", SHARED, 1234.5)]) == ([], set())
    row = journal.rows(ids=["j"])[0]
    assert (row.attempts, row.running, row.next_at, row.state) == (1, SHARED, 1234.5, "pending")
    assert row.started_at is not None
    journal.write(outcomes=[Outcome("j", "done", 1, 0.0, None, b"\x93result")])
    row = journal.rows(ids=["j"])[0]
    assert (row.state, row.running, row.result, row.error) == ("done", 0, b"\x93result", None)
    assert row.finished_at is not None


def test_one_batch_of_every_kind_inserts_finishes_and_counts_each_its_own_row(backend):
    journal = backend.owner()
    assert journal.write_all() == ([], set())  # a flush with nothing to write (group commit's "flush")
    journal.write([("finishing", "t", b"", 0), ("starting", "t", b"", 0), ("gone", "t", b"", 0)])
    journal.write(outcomes=[Outcome("gone", "done", 1, 0.0, None, b"")])
    assert journal.write_all([("new", "t", b"n", 0), ("finishing", "t", b"", 0)],
                             [Outcome("finishing", "done", 1, 0.0, None, b"r")],
                             [Start("starting", SHARED, 5.0), Start("gone", SHARED, 5.0)]) == ([None, "done"], {"gone"})
    rows = {row.id: row for row in journal.rows(("pending", "done"))}
    assert {name: (row.state, row.attempts, row.running) for name, row in rows.items()} == {
        "new": ("pending", 0, 0), "finishing": ("done", 1, 0), "starting": ("pending", 1, SHARED),
        "gone": ("done", 1, 0)}


def test_an_outcome_and_the_next_attempt_of_one_job_in_one_batch_apply_in_that_order(backend):
    journal = backend.owner()
    journal.write([("j", "t", b"", 2)])
    journal.write(starts=[Start("j", SHARED, 0.0)])
    assert journal.write_all(outcomes=[Outcome("j", "pending", 1, 0.0, "ValueError: once")],
                             starts=[Start("j", SHARED, 99.0)]) == ([], set())
    row = journal.rows(ids=["j"])[0]
    assert (row.state, row.attempts, row.running, row.next_at, row.error) == (
        "pending", 2, SHARED, 99.0, "ValueError: once")


def test_a_retry_waits_for_its_backoff_and_then_dead_letters_after_its_retries(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([("later", "t", b"", 2), ("now", "t", b"", 2)])
    dead.write(starts=[Start("later", SHARED, 0.0), Start("now", SHARED, 0.0)])
    dead.write(outcomes=[Outcome("later", "pending", 1, time.time() + 3600, "ValueError: x"),
                         Outcome("now", "pending", 1, time.time() - 1, "ValueError: y")])
    row = dead.rows(ids=["later"])[0]
    assert (row.state, row.attempts, row.error, row.running, row.finished_at) == ("pending", 1, "ValueError: x", 0, None)
    backend.lose(dead)
    assert me.claim(["t"]).claimed == 2
    assert [row.id for row in me.take_replays(10)] == ["now"], "the other one's backoff has not run out"
    me.write(outcomes=[Outcome("now", "dead", 3, 0.0, "ValueError: y")])
    assert [(row.id, row.error) for row in me.rows(("dead",))] == [("now", "ValueError: y")]


def test_claiming_takes_only_the_pending_jobs_of_dead_owners(backend):
    dead, alive, me = backend.owner(), backend.owner(), backend.owner()
    dead.write([("dead-1", "t", b"", 0), ("done", "t", b"", 0)])
    dead.write(outcomes=[Outcome("done", "done", 1, 0.0, None)])
    alive.write([("alive-1", "t", b"", 0)])
    me.write([("mine", "t", b"", 0)])
    dead.close()  # it gave up ownership: its pending rows are anyone's at once
    claim = me.claim(["t"])
    assert claim.claimed == 1 and claim.died == []
    assert [row.id for row in me.take_replays(10)] == ["dead-1"]
    assert me.take_replays(10) == [], "handed out once"
    assert me.claim(["t"]).claimed == 0, "claimed once, not again"
    assert [row.owner for row in me.rows(ids=["alive-1"])] == [alive.token]


def test_an_owner_that_dies_without_closing_is_taken_over_running_jobs_and_all(backend):
    lost, me = backend.owner(), backend.owner()
    lost.write([("waiting", "t", b"", 0), ("running", "t", b"", 1)])
    lost.write(starts=[Start("running", SHARED, 0.0)])
    assert me.claim(["t"]).claimed == 0, "its owner is alive"
    backend.lose(lost)
    assert me.claim(["t"]).claimed == 2
    rows = {row.id: row for row in me.take_replays(10)}
    assert [(row.id, row.attempts, row.running, row.owner) for row in rows.values()] == [
        ("waiting", 0, 0, me.token), ("running", 1, SHARED, me.token)], "unsuspected first"


def test_a_job_that_died_running_alone_with_attempts_exhausted_is_dead_lettered(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([("poison", "t", b"", 1), ("shared", "t", b"", 0), ("young", "t", b"", 1)])
    dead.write(starts=[Start("poison", ALONE, 0.0), Start("shared", SHARED, 0.0), Start("young", ALONE, 0.0)])
    dead.write(starts=[Start("poison", ALONE, 0.0)])
    backend.lose(dead)
    claim = me.claim(["t"])
    assert claim.died == ["poison"] and claim.claimed == 2
    poison = me.rows(ids=["poison"])[0]
    assert (poison.state, poison.error, poison.attempts) == ("dead", DIED, 2)
    assert sorted((row.id, row.attempts, row.running) for row in me.take_replays(10)) == [
        ("shared", 1, SHARED), ("young", 1, ALONE)]


def test_an_insert_that_counts_the_first_attempt_dies_shared_so_the_job_is_replayed_not_dead_lettered(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([("taken", "t", b"", 0)])  # already journaled: a counting insert of the same id leaves it alone
    assert dead.write([("counted", "t", b"", 0, 0.0, 123.0), ("taken", "t", b"", 0, 0.0, 123.0)]) == [None, "pending"]
    rows = {row.id: row for row in dead.rows(ids=["counted", "taken"])}
    assert (rows["counted"].attempts, rows["counted"].running, rows["counted"].next_at) == (1, SHARED, 123.0)
    assert rows["counted"].started_at is not None
    assert (rows["taken"].attempts, rows["taken"].running, rows["taken"].started_at) == (0, 0, None)
    backend.lose(dead)  # died between the commit and the start, with no retries left
    claim = me.claim(["t"])
    assert claim.died == [] and claim.claimed == 2
    assert sorted((row.id, row.attempts, row.running) for row in me.take_replays(10)) == [
        ("counted", 1, SHARED), ("taken", 0, 0)]


def test_a_delayed_job_is_handed_out_by_its_own_owner_only_once_due(backend):
    journal = backend.owner()
    journal.write([("soon", "t", b"", 0, time.time() - 0.5), ("later", "t", b"", 0, time.time() + 3600)])
    assert [row.id for row in journal.take_replays(10)] == ["soon"], "no claim needed: journaled marked for replay"
    assert journal.take_replays(10) == []
    assert journal.rows(ids=["later"])[0].next_at > time.time() + 3000


def test_foreign_tasks_are_left_unclaimed_and_reported(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([("x", "theirs", b"", 0), ("y", "t", b"", 0)])
    dead.close()
    claim = me.claim(["t"])
    assert (claim.claimed, claim.foreign) == (1, {"theirs": 1})
    assert me.rows(ids=["x"])[0].owner != me.token


def test_replay_is_handed_out_in_bounded_batches_each_row_once(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([(f"j{n:02}", "t", b"", 1) for n in range(25)])
    dead.write(starts=[Start("j00", ALONE, 0.0)])  # a suspect: after the others
    backend.lose(dead)
    assert me.claim(["t"]).claimed == 25
    batches = [me.take_replays(10) for _ in range(4)]
    assert [len(batch) for batch in batches] == [10, 10, 5, 0]
    ids = [row.id for batch in batches for row in batch]
    assert sorted(ids) == [f"j{n:02}" for n in range(25)] and ids[-1] == "j00"


def test_cancel_stops_a_pending_job_and_refuses_its_start_and_its_late_outcome(backend):
    journal, other = backend.owner(), backend.owner()
    journal.write([("pending", "t", b"", 0), ("running", "t", b"", 0), ("done", "t", b"", 0)])
    journal.write(starts=[Start("running", SHARED, 0.0), Start("done", SHARED, 0.0)])
    journal.write(outcomes=[Outcome("done", "done", 1, 0.0, None)])
    assert other.cancel("pending") is True
    assert other.cancel("running") is False, "running under a live owner: only that process can interrupt it"
    assert other.cancel("done") is False and other.cancel("unknown") is False
    assert journal.write_all(starts=[Start("pending", SHARED, 0.0)]) == ([], {"pending"})
    journal.write(outcomes=[Outcome("pending", "done", 1, 0.0, None)])
    row = journal.rows(ids=["pending"])[0]
    assert (row.state, row.error, row.attempts) == ("cancelled", CANCELLED, 0)
    assert row.finished_at is not None


def test_an_expired_job_is_kept_expired_never_claimed_nor_started_until_requeued(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([("late", "t", b"", 0)])
    dead.write(outcomes=[Outcome("late", "expired", 0, 0.0, "JobExpired: job late expired before it started")])
    backend.lose(dead)
    assert me.claim(["t"]).claimed == 0 and me.take_replays(10) == []
    assert me.write_all(starts=[Start("late", SHARED, 0.0)]) == ([], {"late"})
    row = me.rows(("expired",))[0]
    assert (row.id, row.state, row.attempts, row.error) == ("late", "expired", 0,
                                                           "JobExpired: job late expired before it started")
    assert row.finished_at is not None and me.counts() == {"expired": 1}
    assert me.requeue(["late"]) == 1 and me.claim(["t"]).claimed == 1
    me.write(outcomes=[Outcome("late", "expired", 0, 0.0, "JobExpired: again")])
    time.sleep(0.01)
    assert me.purge(["expired"], older_than=0.0) == 1 and me.counts() == {}


def test_a_job_left_running_by_a_dead_owner_can_be_cancelled(backend):
    dead, me = backend.owner(), backend.owner()
    dead.write([("stuck", "t", b"", 0)])
    dead.write(starts=[Start("stuck", SHARED, 0.0)])
    backend.lose(dead)
    assert me.cancel("stuck") is True
    assert me.claim(["t"]).claimed == 0
    assert me.rows(ids=["stuck"])[0].state == "cancelled"


def test_requeue_makes_dead_and_done_jobs_pending_again_for_any_worker(backend):
    owner, me = backend.owner(), backend.owner()
    owner.write([("dead", "t", b"", 0), ("done", "t", b"", 0), ("pending", "t", b"", 0)])
    owner.write(starts=[Start("dead", SHARED, 0.0), Start("done", SHARED, 0.0)])
    owner.write(outcomes=[Outcome("dead", "dead", 1, 0.0, "ValueError: no"), Outcome("done", "done", 1, 0.0, None, b"x")])
    admin = backend.open()
    assert admin.requeue(["done", "pending", "unknown"]) == 1, "only rows that are not pending change"
    assert admin.requeue(all_dead=True) == 1
    rows = {row.id: row for row in admin.rows(ids=["dead", "done"])}
    assert [(row.state, row.attempts, row.owner, row.error, row.result) for row in rows.values()] == [
        ("pending", 0, None, None, None)] * 2
    assert me.claim(["t"]).claimed == 2, "unowned rows are anyone's, though their old owner lives"
    assert sorted(row.id for row in me.take_replays(10)) == ["dead", "done"]


def test_a_requeue_as_of_a_listing_leaves_rows_changed_since_alone(backend):
    owner, admin = backend.owner(), backend.open()
    owner.write([("a", "t", b"", 0), ("b", "t", b"", 0)])
    owner.write(starts=[Start("a", SHARED, 0.0), Start("b", SHARED, 0.0)])
    owner.write(outcomes=[Outcome("a", "dead", 1, 0.0, "E: a"), Outcome("b", "dead", 1, 0.0, "E: b")])
    listed = max(row.updated_at for row in admin.rows(("dead",)))
    assert admin.requeue(all_dead=True, as_of=listed) == 2
    assert owner.claim(["t"]).claimed == 2 and len(owner.take_replays(10)) == 2
    owner.write(starts=[Start("a", SHARED, 0.0), Start("b", SHARED, 0.0)])
    owner.write(outcomes=[Outcome("a", "dead", 1, 0.0, "E: a"), Outcome("b", "done", 1, 0.0, None, b"x")])
    assert admin.requeue(all_dead=True, as_of=listed) == 0, "the same click again: they died after the listing"
    assert admin.requeue(["a", "b"], as_of=listed) == 0
    assert admin.requeue(["a"]) == 1, "without as_of, as before"


def test_pending_rows_are_split_by_running_and_due(backend):
    owner, admin = backend.owner(), backend.open()
    owner.write([("ready", "t", b"", 0), ("delayed", "t", b"", 0, time.time() + 3600), ("run", "t", b"", 0)])
    owner.write(starts=[Start("run", SHARED, time.time() + 60)])
    owner.write([("done", "t", b"", 0)], outcomes=[])
    owner.write(outcomes=[Outcome("done", "done", 1, 0.0, None, b"x")])
    assert sorted(admin.pending_split(time.time())) == [
        (owner.token, False, False, 1), (owner.token, False, True, 1), (owner.token, True, True, 1)]


def test_purge_deletes_old_finished_rows_and_never_pending_ones(backend):
    journal = backend.owner()
    journal.write([("done", "t", b"", 0), ("dead", "t", b"", 0), ("gone", "t", b"", 0), ("pending", "t", b"", 0)])
    journal.write(outcomes=[Outcome("done", "done", 1, 0.0, None), Outcome("dead", "dead", 1, 0.0, "E: e")])
    journal.cancel("gone")
    assert journal.prune(older_than=3600) == 0
    time.sleep(0.01)
    assert journal.prune(older_than=0.0) == 1
    assert journal.purge(["dead", "cancelled", "pending"], older_than=0.0) == 2
    assert journal.counts() == {"pending": 1}


def test_rows_are_listed_oldest_first_by_page_and_in_full(backend):
    journal = backend.owner()
    for n in range(7):
        journal.write([(f"r{n}", "t", b"", 0)])
    journal.write(outcomes=[Outcome("r3", "done", 1, 0.0, None)])
    assert [row.id for row in journal.rows(("pending",), limit=3, offset=2)] == ["r2", "r4", "r5"]
    assert [row.id for row in journal.iter_rows(("pending", "done"), batch=2)] == [f"r{n}" for n in range(7)]
    assert [row.id for row in journal.rows(ids=["r6", "r3"])] == ["r3", "r6"]
    assert journal.counts() == {"pending": 6, "done": 1}


def test_a_probe_commits(backend):
    journal = backend.owner()
    journal.probe()
    journal.probe()


def test_writes_and_claims_from_two_native_threads_never_interleave_transactions(backend):
    """The worker's write loop and replay loop call in from different native threads."""
    journal = backend.owner()
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
    assert journal.counts()["pending"] > 0
