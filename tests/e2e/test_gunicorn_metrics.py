"""Prometheus counters from gunicorn workers that come and go (``--max-requests``) equal the work done."""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter

import pytest
import requests

from tests.helpers import slack, wait_for
from zqsync.processes import GunicornProcess

pytestmark = pytest.mark.processes_only

REQUESTS = 400


def enqueued_total(text: str) -> float:
    match = re.search(r"^zqsync_client_enqueued_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def workers_of(master: int) -> set[int]:
    """The pids of a gunicorn master's worker processes (its children, from /proc)."""
    with open(f"/proc/{master}/task/{master}/children") as children:
        return {int(pid) for pid in children.read().split()}


@pytest.mark.timeout(120)
def test_counters_equal_the_jobs_enqueued_across_recycled_gunicorn_workers(zq_worker, root, tmp_path):
    worker = zq_worker()
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    env = {"ZQSYNC_ENDPOINT": worker.endpoint, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
           "GUNICORN_CMD_ARGS": "--max-requests 25"}
    web = GunicornProcess("tests.e2e.metrics_app:app", chdir=root, config="python:zqsync.demo.gunicorn_conf",
                          workers=2, preload=False, env=env)
    with web, requests.Session() as session:
        pids: Counter = Counter()

        def enqueue(count: int) -> None:
            for _ in range(count):
                # A connection per request, as from many browsers: a recycled worker is left at once.
                response = session.get(f"{web.url}/enqueue", timeout=30, headers={"Connection": "close"})
                assert response.status_code == 200, response.text
                pids[response.json()["pid"]] += 1

        first = workers_of(web.proc.pid)
        # A worker past --max-requests stops within about a second and serves until then: keep the
        # requests coming while the first workers go (what they counted since their last sync must
        # not go with them), then send the rest.
        deadline = time.monotonic() + slack(60)
        while not workers_of(web.proc.pid).isdisjoint(first):
            assert time.monotonic() < deadline, f"--max-requests recycled no worker: {pids}"
            enqueue(1)
        enqueue(max(0, REQUESTS - sum(pids.values())))
        total = sum(pids.values())
        assert len(pids) > 2, f"--max-requests recycled no worker: {pids}"
        wait_for(lambda: worker.stats()["jobs_succeeded"] == total, what="every job to run")
        # The live workers sync every second; the ones that exited must have synced on the way out.
        totals: list[float] = []

        def reached() -> bool:
            totals.append(enqueued_total(session.get(f"{web.url}/metrics", timeout=30).text))
            return totals[-1] == total

        with contextlib.suppress(AssertionError):
            wait_for(reached, timeout=slack(15), what="the counter to reach the jobs enqueued")
    assert totals[-1] == total, f"zqsync_client_enqueued_total read {totals[-1]:.0f} for {total} jobs enqueued"
