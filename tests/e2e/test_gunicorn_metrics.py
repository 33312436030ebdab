"""Prometheus counters from gunicorn workers that come and go (``--max-requests``) equal the work done."""

from __future__ import annotations

import contextlib
import re
from collections import Counter

import pytest
import requests

from tests.helpers import slack, wait_for
from zqsync.processes import GunicornProcess

REQUESTS = 400


def enqueued_total(text: str) -> float:
    match = re.search(r"^zqsync_client_enqueued_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


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
        pids = Counter()
        for _ in range(REQUESTS):
            response = session.get(f"{web.url}/enqueue", timeout=30)
            assert response.status_code == 200, response.text
            pids[response.json()["pid"]] += 1
        assert len(pids) > 2, f"--max-requests recycled no worker: {pids}"
        wait_for(lambda: worker.stats()["jobs_succeeded"] == REQUESTS, what="every job to run")
        # The live workers sync every second; the ones that exited must have synced on the way out.
        totals: list[float] = []

        def reached() -> bool:
            totals.append(enqueued_total(session.get(f"{web.url}/metrics", timeout=30).text))
            return totals[-1] == REQUESTS

        with contextlib.suppress(AssertionError):
            wait_for(reached, timeout=slack(15), what="the counter to reach the jobs enqueued")
    assert totals[-1] == REQUESTS, f"zqsync_client_enqueued_total read {totals[-1]:.0f} for {REQUESTS} jobs enqueued"
