"""A worker whose journal is PostgreSQL, for ``bench_rq.py``'s confirmed rows (``zqsync bench --only rq``).

The server is the tests' own (``tests/pgserver.py``: Debian's ``initdb`` and ``pg_ctl``, loopback, an
ephemeral port, default settings, so ``synchronous_commit = on``); the worker runs
``zqsync.demo.tasks`` with ``--journal postgresql://...``. Both are stopped by pid on the way out.

The server runs on the worker's CPUs: the SQLite journal it is compared with does its work in the
worker's own process, so both journals get the same CPUs. (It used to inherit this process's pinning,
started after the SQLite worker's placement, so it competed with the callers instead.)
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from benchmarks.harness import REPO_ROOT, pin, placed
from tests import pgserver
from zqsync.processes import WorkerProcess

#: The variant's name in bench_rq's rows.
NAME = "zqsync confirmed, PostgreSQL journal"
#: Target: its throughput over the SQLite journal's ("zqsync confirmed"), same callers (issue 24).
MIN_RATIO = 0.5


def unavailable() -> Optional[str]:
    """Why there is no PostgreSQL to measure (with how to install it), or ``None``."""
    reason = pgserver.unavailable()
    return None if reason is None else f"skipped: {reason}"


@contextlib.contextmanager
def running_worker(layout: str) -> Iterator[WorkerProcess]:
    """A started PostgreSQL server, and a ``zqsync.demo.tasks`` worker journaling into a new database of it,
    placed per ``layout`` (``harness.placed``), the server on the worker's CPUs."""
    server = pgserver.start()
    try:
        worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT,
                               extra_args=["--journal", server.database()])
        try:
            with placed(worker.start(), layout):
                if hasattr(os, "sched_getaffinity"):  # backends forked later inherit the postmaster's CPUs
                    for pid in server.pids():
                        pin(pid, os.sched_getaffinity(worker.pid))
                yield worker
        finally:
            worker.stop()
    finally:
        server.stop()
