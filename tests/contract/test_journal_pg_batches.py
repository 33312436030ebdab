"""What the PostgreSQL journal's group commits cost the server (``zqsync/worker/journal_pg_batch.py``),
seen from the server's own statistics (``pg_stat_user_tables``). A real server (``tests/pgserver.py``);
skipped with the reason where none can be started."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.helpers import wait_for

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'zqsync[postgresql]')")

from zqsync.worker.journal_api import Outcome  # noqa: E402
from zqsync.worker.journal_pg import PostgresJournal  # noqa: E402  (needs psycopg)

#: Rows the table grows by between the batches that prepare the statement and those measured; batches
#: in each of the three parts, and confirms and outcomes in each batch.
ROWS, BATCHES, SIZE = 20000, 10, 20


def rows_read(url: str, inserted: int, updated: int) -> int:
    """Rows of ``zqsync_jobs`` read so far by sequential scans and fetched through its indexes, once the
    server's statistics count ``inserted`` inserts and ``updated`` updates (a backend reports its statistics
    as it exits)."""
    def counted():
        with psycopg.connect(url, autocommit=True) as db:
            row = db.execute("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0), n_tup_ins, n_tup_upd"
                             " FROM pg_stat_user_tables WHERE relname = 'zqsync_jobs'").fetchone()
        return row if row and row[1] >= inserted and row[2] >= updated else None

    return int(wait_for(counted, what=f"the statistics to count {inserted} inserts and {updated} updates")[0])


def batches(journal: PostgresJournal, first: int) -> None:
    """``BATCHES`` group commits as a busy worker's: ``SIZE`` confirms, and the outcomes of the batch before."""
    for batch in range(first, first + BATCHES):
        journal.write_all([(f"job-{batch}-{n}", "t", b"body", 0) for n in range(SIZE)],
                          [Outcome(f"job-{batch - 1}-{n}", "done", 1, 0.0, None, b"result") for n in range(SIZE)])


def test_a_batch_finds_its_rows_by_key_after_the_table_grew_under_its_prepared_statement(pg_url):
    # A plan PostgreSQL keeps for any arrays (a generic plan), made from the statistics of the small table,
    # joined every later batch to the whole table by a sequential scan until the next ANALYZE; one that read
    # the table through an index without the batch's keys would read it whole too
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
        before = rows_read(pg_url, ROWS, 0)
        batches(journal, 2 * BATCHES)
    finally:
        journal.close()
    read = rows_read(pg_url, ROWS + 3 * BATCHES * SIZE, (3 * BATCHES - 1) * SIZE) - before
    assert read < ROWS, f"{BATCHES} batches read {read} rows (the table has {ROWS} and more)"
    with psycopg.connect(pg_url) as db:
        assert dict(db.execute("SELECT state, count(*) FROM zqsync_jobs GROUP BY state").fetchall()) == {
            "pending": ROWS + SIZE, "done": (3 * BATCHES - 1) * SIZE}


#: The table and indexes of a journal made before the partial index of finished rows (the old index held
#: every row, so a new job's insert and its outcome each added an entry to it).
PREVIOUS_SCHEMA = """
CREATE TABLE zqsync_jobs (
    id TEXT COLLATE "C" PRIMARY KEY, task TEXT NOT NULL, body BYTEA NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_at DOUBLE PRECISION NOT NULL DEFAULT 0, owner TEXT, error TEXT,
    created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL, running SMALLINT NOT NULL DEFAULT 0,
    replay SMALLINT NOT NULL DEFAULT 0, retries INTEGER NOT NULL DEFAULT 0, result BYTEA,
    started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION);
CREATE INDEX zqsync_jobs_to_replay ON zqsync_jobs (owner, replay, next_at) WHERE state = 'pending';
CREATE INDEX zqsync_jobs_by_state_updated ON zqsync_jobs (state, updated_at);
INSERT INTO zqsync_jobs (id, task, body, state, created_at, updated_at) VALUES
    ('old-pending', 't', '', 'pending', 1, 1), ('old-dead', 't', '', 'dead', 2, 2), ('old-done', 't', '', 'done', 3, 3);
"""


def secondary_index_bytes(db) -> int:
    """Bytes of the indexes of ``zqsync_jobs`` other than its primary key and the pending rows' index."""
    return int(db.execute("SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM pg_index WHERE indrelid ="
                          " 'zqsync_jobs'::regclass AND indexrelid::regclass::text NOT IN"
                          " ('zqsync_jobs_pkey', 'zqsync_jobs_to_replay')").fetchone()[0])


def test_a_journal_of_the_previous_schema_is_migrated_and_keeps_its_rows(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(PREVIOUS_SCHEMA)
    journal = PostgresJournal(pg_url)
    journal.register()
    try:
        assert [row.id for row in journal.rows(("pending", "dead", "done"))] == ["old-pending", "old-dead", "old-done"]
        with psycopg.connect(pg_url) as db:
            indexes = dict(db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'zqsync_jobs'"))
        assert sorted(indexes) == ["zqsync_jobs_finished", "zqsync_jobs_pkey", "zqsync_jobs_to_replay"]
        assert indexes["zqsync_jobs_finished"].endswith("WHERE (state <> 'pending'::text)")
        assert journal.purge(["dead", "done"], older_than=0.0) == 2
    finally:
        journal.close()


@pytest.fixture
def journal(pg_url) -> Iterator[PostgresJournal]:
    """A registered owner of a new journal."""
    opened = PostgresJournal(pg_url)
    opened.register()
    yield opened
    opened.close()


def test_a_new_job_adds_no_entry_to_the_index_of_finished_rows_until_it_finishes(pg_url, journal):
    # each entry of an index is work for the insert that makes it: the finished rows' index (purges, dead
    # letters) is partial, so a pending job costs its insert the primary key and the pending rows' index only
    with psycopg.connect(pg_url, autocommit=True) as db:
        empty = secondary_index_bytes(db)
        for start in range(0, 2000, 500):
            journal.write_all([(f"j{n}", "t", b"body", 0) for n in range(start, start + 500)])
        assert secondary_index_bytes(db) == empty
        for start in range(0, 2000, 500):
            journal.write_all(outcomes=[Outcome(f"j{n}", "done", 1, 0.0, None, b"r") for n in range(start, start + 500)])
        assert secondary_index_bytes(db) > empty + 8192


def test_listing_pending_and_dead_jobs_reads_them_through_indexes_not_the_whole_table(pg_url, journal):
    journal.write_all([("pending", "t", b"", 0), ("dead", "t", b"", 0)])
    journal.write_all(outcomes=[Outcome("dead", "dead", 1, 0.0, "E: e")])
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("INSERT INTO zqsync_jobs (id, task, body, state, created_at, updated_at) SELECT 'done-' || n,"
                   " 't', '', 'done', n, n FROM generate_series(1, %s) AS n", (ROWS,))
        db.execute("ANALYZE zqsync_jobs")

        def scanned() -> int:
            """Rows read by sequential scans, once the listing's session has reported its statistics."""
            journal._db.execute("SELECT pg_stat_force_next_flush()")  # reported before the answer
            db.execute("SELECT pg_stat_clear_snapshot()")
            return int(db.execute("SELECT seq_tup_read FROM pg_stat_user_tables"
                                  " WHERE relname = 'zqsync_jobs'").fetchone()[0])

        before = scanned()
        assert [row.id for row in journal.rows(("pending", "dead"))] == ["dead", "pending"]  # created at once
        assert [row.id for row in journal.iter_rows(("dead", "pending"))] == ["dead", "pending"]
        assert scanned() - before < ROWS
