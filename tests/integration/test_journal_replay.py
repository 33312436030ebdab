"""Replay memory is flat in the number of pending jobs: a worker restarted over many of them
streams them from the journal in batches instead of loading them all.

The journal is seeded with the first version's schema (the worker migrates it), rows owned by
no live process. ``benchmarks/bench_replay.py`` runs the same with 400,000 rows.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.helpers import wait_for
from zqsync.wire import envelope

TASKS = "tests.integration.crash_tasks:registry"
#: The journal table as the first version made it.
FIRST_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, body BLOB NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL DEFAULT 0, owner_pid INTEGER,
    error TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL
);
"""
NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: never a live process


def seed(state, rows: int) -> None:
    state.mkdir()
    db = sqlite3.connect(state / "journal.sqlite3")
    db.executescript(FIRST_SCHEMA)
    db.executemany(
        "INSERT INTO jobs (id, task, body, state, owner_pid, created_at, updated_at)"
        " VALUES (?, 'noop', ?, 'pending', ?, ?, ?)",
        [(f"job-{i}", envelope.encode_request("job", f"job-{i}", "noop", (i,), {}), NO_SUCH_PID, i, i)
         for i in range(rows)])
    db.commit()
    db.close()


def pending(state) -> int:
    db = sqlite3.connect(state / "journal.sqlite3", timeout=30)
    try:
        return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'pending'").fetchone()[0]
    finally:
        db.close()


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def replay_peak(zq_worker, state, rows: int) -> float:
    seed(state, rows)
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    wait_for(lambda: pending(state) == 0, timeout=60, what=f"{rows} journaled jobs to be replayed")
    peak = peak_rss_mib(worker.pid)
    worker.stop()
    return peak


@pytest.mark.timeout(150)
def test_replay_memory_is_flat_in_the_number_of_pending_jobs(zq_worker, tmp_path):
    # Both sizes above the worker's bounded caches of recent job ids and outcomes (`status.MAX_KEPT`,
    # 10,000): between 1,000 and 20,000 those caches alone grew the RSS by about 8 MiB, at the bound.
    small = replay_peak(zq_worker, tmp_path / "small", 12_000)
    large = replay_peak(zq_worker, tmp_path / "large", 48_000)
    print(f"replay peak RSS: 12,000 pending {small:.1f} MiB, 48,000 pending {large:.1f} MiB")
    assert large - small < 8.0, "36,000 more pending jobs grew the replaying worker by 8 MiB or more"
