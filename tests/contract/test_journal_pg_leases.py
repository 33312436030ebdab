"""What only the PostgreSQL journal does: leases renewed, taken again once forgotten, swept, and claims
from two workers at once taking disjoint rows (``FOR UPDATE SKIP LOCKED``). A real server
(``tests/pgserver.py``); skipped with the reason where none can be started."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import wait_for

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'zqsync[postgresql]')")

from zqsync.worker.journal_pg import PostgresJournal  # noqa: E402  (needs psycopg)


@pytest.fixture
def journals(pg_url):
    opened: list[PostgresJournal] = []

    def open_one(register: bool = True) -> PostgresJournal:
        journal = PostgresJournal(pg_url, lease=1.0)
        opened.append(journal)
        if register:
            journal.register()
        return journal

    yield open_one
    for journal in opened:
        journal.close()


def expiry(url: str, token: str):
    with psycopg.connect(url) as db:
        row = db.execute("SELECT expires_at, expires_at > now() FROM zqsync_owners WHERE token = %s", (token,)).fetchone()
    return row


def test_a_lease_is_renewed_for_as_long_as_its_owner_lives(journals, pg_url):
    owner = journals()
    first, _ = expiry(pg_url, owner.token)
    wait_for(lambda: expiry(pg_url, owner.token)[0] > first, what="a renewal")
    with psycopg.connect(pg_url, autocommit=True) as db:  # wait until the first lease would have run out
        wait_for(lambda: db.execute("SELECT now() > %s", (first,)).fetchone()[0], what="the first lease's end")
    assert journals(register=False).owner_alive(owner.token)


def test_a_forgotten_lease_is_taken_again_by_its_next_renewal(journals, pg_url):
    owner = journals()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("DELETE FROM zqsync_owners WHERE token = %s", (owner.token,))
    wait_for(lambda: expiry(pg_url, owner.token), what="the owner known again")
    assert expiry(pg_url, owner.token)[1] is True


def test_owners_are_forgotten_only_long_expired_and_owning_no_pending_row(journals, pg_url):
    me, idle, busy, recent = journals(), journals(), journals(), journals()
    busy.write([("left", "t", b"", 0)])
    for journal in (idle, busy, recent):
        journal.close()  # expired now
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("UPDATE zqsync_owners SET expires_at = now() - interval '2 hours' WHERE token = ANY(%s)",
                   ([idle.token, busy.token],))
    assert me.sweep_owners() == 1
    assert [expiry(pg_url, journal.token) is None for journal in (idle, busy, recent)] == [True, False, False]


def test_workers_claiming_at_once_take_disjoint_rows(journals):
    gone, one, two = journals(), journals(), journals()
    gone.write([(f"j{n}", "t", b"", 0) for n in range(2000)])
    gone.close()
    claims: dict[str, int] = {}
    start = threading.Barrier(2)

    def claim(journal: PostgresJournal) -> None:
        start.wait()
        claims[journal.token] = journal.claim(["t"]).claimed

    threads = [threading.Thread(target=claim, args=(journal,)) for journal in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(claims.values()) == 2000
    owners = [row.owner for row in one.iter_rows(("pending",))]
    assert len(owners) == 2000 and set(owners) <= {one.token, two.token}
    assert owners.count(one.token) == claims[one.token]


def child_closes_and_writes(journal: PostgresJournal) -> str:
    journal.close()  # the parent's session: left alone
    try:
        journal.write([("from-child", "t", b"", 0)])
    except RuntimeError as exc:
        return str(exc)
    return "written"


def test_a_forked_child_neither_uses_nor_closes_its_parents_session(journals):
    from zqsync.testing import run_in_fork

    owner = journals()
    assert run_in_fork(child_closes_and_writes, owner) == (
        "this PostgreSQL journal connection belongs to the process that opened it")
    assert owner.write([("from-parent", "t", b"", 0)]) == [None]
    assert journals(register=False).owner_alive(owner.token), "its lease is still renewed"
