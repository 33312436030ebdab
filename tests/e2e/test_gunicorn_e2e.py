"""S03: a Flask app under real gunicorn -k gevent, client created at import time.

Each request enqueues one job and makes one call. The worker must see a
small, bounded number of socket identities per gunicorn process, not one
per request.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers import wait_for
from zqsync.processes import GunicornProcess

pytestmark = pytest.mark.processes_only

REQUESTS = 300
POOL_SIZE = 4


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "no-preload"])
def test_gunicorn_gevent_workers_reuse_a_few_sockets_across_requests(zq_worker, root, preload):
    """S03."""
    worker = zq_worker()
    web = GunicornProcess(
        "zqsync.demo.webapp:app", config="python:zqsync.demo.gunicorn_conf",
        workers=2, preload=preload, env={"ZQSYNC_ENDPOINT": worker.endpoint, "ZQSYNC_POOL_SIZE": str(POOL_SIZE)},
    )
    with web, requests.Session() as session:
        session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=20))

        def get(index: int) -> dict:
            response = session.get(f"{web.url}/?n={index}", timeout=30)
            assert response.status_code == 200, response.text
            return response.json()

        with ThreadPoolExecutor(20) as pool:
            bodies = list(pool.map(get, range(REQUESTS)))

        assert [body["result"] for body in bodies] == [index + 1 for index in range(REQUESTS)]
        calls_by_pid = Counter(body["pid"] for body in bodies)
        stats = wait_for(lambda: (s := worker.stats())["jobs_succeeded"] == REQUESTS and s, what="every job to run")
    assert stats["calls_succeeded"] == REQUESTS
    assert len({body["job_id"] for body in bodies}) == REQUESTS
    identities = stats["identities_by_pid"]
    for pid in calls_by_pid:
        assert 1 <= identities[str(pid)] <= POOL_SIZE, (pid, identities)
    assert set(identities) - {"?"} == {str(pid) for pid in calls_by_pid}, "only gunicorn workers called"
    # Peer-side view of PUSH reuse too: TCP connections accepted on the jobs socket.
    assert stats["connections_jobs"] <= POOL_SIZE * len(calls_by_pid)
