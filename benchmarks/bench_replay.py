"""Replay memory: a worker restarted over N pending confirmed jobs streams them from the journal.

Seeds a journal with N pending rows of a dead owner (a boot token whose process is gone), starts a
real worker on it, and reports its peak RSS (``VmHWM``) and the time to run them all. Memory must
stay flat in N: replay reads :data:`zqsync.worker.replay.REPLAY_BATCH` rows at a time, through
the worker's bounded backlog.

    python -m benchmarks.bench_replay --rows 400000
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time

from zqsync.processes import WorkerProcess
from zqsync.wire import envelope
from zqsync.worker.journal import Journal

APP = "tests.integration.crash_tasks:registry"


def seed(state_dir: str, rows: int) -> None:
    """``rows`` pending ``noop`` jobs owned by a token that is dead once this returns."""
    journal = Journal(state_dir)
    journal.register()
    for start in range(0, rows, 50_000):
        journal.write([(f"job-{index}", "noop", envelope.encode_request("job", f"job-{index}", "noop", (index,), {}), 0)
                       for index in range(start, min(rows, start + 50_000))])
    journal.close()  # the lock is released: an orphan for the next worker


def peak_rss_kib(pid: int) -> int:
    """``VmHWM`` of ``pid``: its peak resident set size, KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def pending(state_dir: str) -> int:
    db = sqlite3.connect(os.path.join(state_dir, "journal.sqlite3"), timeout=30)
    try:
        return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'pending'").fetchone()[0]
    finally:
        db.close()


def run(rows: int, timeout: float = 3600.0) -> dict:
    """Seed, replay, measure. :returns: ``{"rows", "seconds", "peak_rss_mib", "jobs_per_s"}``."""
    state_dir = tempfile.mkdtemp(prefix="zqsync-replay-")
    seed(state_dir, rows)
    with WorkerProcess(APP, extra_args=["--state-dir", state_dir], cwd=_root()) as worker:
        started = time.monotonic()
        while pending(state_dir) and time.monotonic() - started < timeout:
            time.sleep(0.5)
        seconds = time.monotonic() - started
        peak = peak_rss_kib(worker.pid)
    return {"rows": rows, "seconds": round(seconds, 1), "peak_rss_mib": round(peak / 1024, 1),
            "jobs_per_s": round(rows / seconds)}


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="pending rows; repeat for several runs")
    args = parser.parse_args()
    for rows in args.rows or [1_000, 400_000]:
        print(run(rows), flush=True)


if __name__ == "__main__":
    main()
