"""What the PostgreSQL journal's group commits cost the server (``zqsync/worker/journal_pg_batch.py``),
seen from the server's own statistics (``pg_stat_user_tables``). A real server (``tests/pgserver.py``);
skipped with the reason where none can be started."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'zqsync[postgresql]')")

from zqsync.worker.journal_api import Outcome  # noqa: E402
from zqsync.worker.journal_pg import PostgresJournal  # noqa: E402  (needs psycopg)

#: Rows the table grows by between the batches that prepare the statement and those measured; batches
#: in each of the three parts, and confirms and outcomes in each batch.
ROWS, BATCHES, SIZE = 20000, 10, 20


def rows_scanned(url: str, inserted: int, updated: int) -> int:
    """Rows of ``zqsync_jobs`` read by sequential scans so far, once the server's statistics count ``inserted``
    inserts and ``updated`` updates (a backend reports its statistics as it exits)."""
    def counted():
        with psycopg.connect(url, autocommit=True) as db:
            row = db.execute("SELECT seq_tup_read, n_tup_ins, n_tup_upd FROM pg_stat_user_tables"
                             " WHERE relname = 'zqsync_jobs'").fetchone()
        return row if row and row[1] >= inserted and row[2] >= updated else None

    return int(wait_for(counted, what=f"the statistics to count {inserted} inserts and {updated} updates")[0])


def batches(journal: PostgresJournal, first: int) -> None:
    """``BATCHES`` group commits as a busy worker's: ``SIZE`` confirms, and the outcomes of the batch before."""
    for batch in range(first, first + BATCHES):
        journal.write_all([(f"job-{batch}-{n}", "t", b"body", 0) for n in range(SIZE)],
                          [Outcome(f"job-{batch - 1}-{n}", "done", 1, 0.0, None, b"result") for n in range(SIZE)])


def test_a_batch_finds_its_rows_by_key_after_the_table_grew_under_its_prepared_statement(pg_url):
    # psycopg prepares a statement on its 6th run; the plan PostgreSQL then kept for any arrays (a generic
    # plan), made from the statistics of the small table, joined every later batch to the whole table by a
    # sequential scan until the next ANALYZE
    journal = PostgresJournal(pg_url)
    journal.register()
    filling = PostgresJournal(pg_url)
    try:
        batches(journal, 0)
        with psycopg.connect(pg_url, autocommit=True) as db:
            db.execute("ANALYZE zqsync_jobs")  # as autovacuum does once a new table has some rows
        batches(journal, BATCHES)
        for start in range(0, ROWS, 5000):
            filling.write_all([(f"old-{n}", "t", b"body", 0) for n in range(start, start + 5000)])
        filling.close()
        before = rows_scanned(pg_url, ROWS, 0)
        batches(journal, 2 * BATCHES)
    finally:
        journal.close()
    scanned = rows_scanned(pg_url, ROWS + 3 * BATCHES * SIZE, (3 * BATCHES - 1) * SIZE) - before
    assert scanned < ROWS, f"the batches read {scanned} rows by sequential scans (the table has {ROWS} and more)"
    with psycopg.connect(pg_url) as db:
        assert dict(db.execute("SELECT state, count(*) FROM zqsync_jobs GROUP BY state").fetchall()) == {
            "pending": ROWS + SIZE, "done": (3 * BATCHES - 1) * SIZE}
