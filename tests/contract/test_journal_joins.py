"""The journal's joins (canvas successors, ``journal_api.Join``), checked on SQLite and PostgreSQL: a
successor is journaled in the transaction of its last member's outcome, unowned, once; two members
finishing at the same instant through two owners (two worker processes, or two hosts) journal it once."""

from __future__ import annotations

import gevent
import pytest
from gevent import monkey

from tests.contract.test_journal_contract import Backend, backend  # noqa: F401  (the fixture)
from zqsync.worker.journal_api import Join, NewJob, Outcome

pytestmark = pytest.mark.timeout(60)

_allocate_lock = monkey.get_original("_thread", "allocate_lock")


def successor(job_id: str):
    """A join's ``make``: the successor ``job_id`` whose body lists its members' states and results."""
    def make(members):
        return NewJob(job_id, "t", repr([(m.state, m.result) for m in members]).encode(), 0)

    return make


def done(job_id: str, join: Join, result: bytes = b"r") -> Outcome:
    return Outcome(job_id, "done", 1, 0.0, None, result, join)


def test_a_successor_is_journaled_with_its_last_members_outcome_unowned_and_once(backend):  # noqa: F811
    one, other = backend.owner(), backend.owner()
    one.write([("a", "t", b"1", 0), ("b", "t", b"2", 0)])
    join = Join("next", ("a", "b"), successor("next"))
    one.write(outcomes=[done("a", join, b"ra")])
    assert one.rows(ids=["next"]) == []
    other.write(outcomes=[done("b", join, b"rb")])
    other.write(outcomes=[done("b", join, b"rb")])  # an outcome stored twice
    [row] = one.rows(ids=["next"])
    assert (row.state, row.owner, row.body) == ("pending", None, repr([("done", b"ra"), ("done", b"rb")]).encode())
    assert backend.open().counts() == {"done": 2, "pending": 1}
    assert one.claim(["t"]).claimed == 1  # unowned: any live owner with its task takes it
    assert [row.id for row in one.take_replays(10)] == ["next"]


def test_a_join_whose_make_declines_journals_nothing(backend):  # noqa: F811
    one = backend.owner()
    one.write([("a", "t", b"1", 0)])
    one.write(outcomes=[Outcome("a", "dead", 1, 0.0, "ValueError: x", None, Join("next", ("a",), lambda m: None))])
    assert one.rows(ids=["next"]) == [] and one.rows(ids=["a"])[0].state == "dead"


def test_the_last_two_members_finishing_at_once_through_two_owners_journal_the_successor_once(backend):  # noqa: F811
    one, other = backend.owner(), backend.owner()
    trials = 40
    one.write([(f"{trial}-{member}", "t", b"", 0) for trial in range(trials) for member in "ab"])
    pool = gevent.get_hub().threadpool  # native threads, plain or monkey-patched, as the workers' writers are
    for trial in range(trials):
        join = Join(f"next-{trial}", (f"{trial}-a", f"{trial}-b"), successor(f"next-{trial}"))
        arrived = [0]
        lock = _allocate_lock()

        def finish(journal, member, join=join, arrived=arrived, lock=lock, trial=trial):
            with lock:
                arrived[0] += 1
            while arrived[0] < 2:  # both threads start their transactions at the same instant
                pass
            journal.write(outcomes=[done(f"{trial}-{member}", join)])

        for job in [pool.spawn(finish, one, "a"), pool.spawn(finish, other, "b")]:
            job.get(timeout=30)
    successors = [row.id for row in backend.open().rows(("pending",), limit=1000)]
    assert sorted(successors) == sorted(f"next-{trial}" for trial in range(trials))
