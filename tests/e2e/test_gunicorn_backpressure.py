"""A gunicorn ``-k gevent`` app enqueues while its worker stalls longer than a heartbeat timeout.

The worker is SIGSTOPped for 4.5 s in the middle of the load: it reads
nothing and answers no ZMTP heartbeat (1 s apart, dead after 3 s), as a
worker whose receive queue is full does. Every job a request was told was
accepted (HTTP 200 with a job id) must run once the worker resumes, and the
app's PUSH connections must survive the stall. Before PUSH sockets used TCP
keepalive instead of heartbeats, the app dropped its connections after 3 s
and the jobs queued on them with it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers import wait_for
from zqsync.processes import GunicornProcess

pytestmark = [pytest.mark.processes_only, pytest.mark.timeout(120)]

STALL = 4.5


def test_jobs_accepted_by_a_gunicorn_app_during_a_long_worker_stall_all_run(zq_worker):
    worker = zq_worker(concurrency=2)
    web = GunicornProcess(
        "zqsync.demo.webapp:app", config="python:zqsync.demo.gunicorn_conf", workers=1,
        env={"ZQSYNC_ENDPOINT": worker.endpoint, "ZQSYNC_SEND_TIMEOUT": "30"},
    )
    accepted: list[str] = []
    refused: list[int] = []
    stop = threading.Event()
    with web, requests.Session() as session:
        session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=10))

        def load() -> None:
            while not stop.is_set():
                response = session.get(f"{web.url}/enqueue", timeout=60)
                if response.status_code == 200:
                    accepted.append(response.json()["job_id"])
                else:
                    refused.append(response.status_code)

        with ThreadPoolExecutor(10) as pool:
            loaders = [pool.submit(load) for _ in range(10)]
            try:
                wait_for(lambda: len(accepted) >= 200, what="the load to be under way")
                os.kill(worker.pid, signal.SIGSTOP)
                try:
                    before_stall = len(accepted)
                    time.sleep(STALL)
                    during_stall = len(accepted) - before_stall
                finally:
                    os.kill(worker.pid, signal.SIGCONT)
                wait_for(lambda: len(accepted) >= before_stall + during_stall + 200, what="the load to go on")
            finally:
                stop.set()
            for loader in loaders:
                loader.result()
        stats = wait_for(lambda: (s := worker.stats())["jobs_succeeded"] >= len(accepted) and s, timeout=60,
                         what=f"all {len(accepted)} accepted jobs to run")
    print(f"accepted {len(accepted)} ({during_stall} during the stall), refused {len(refused)}, "
          f"executed {stats['jobs_succeeded']}")
    assert during_stall > 0, "no request was accepted during the stall: the scenario did not happen"
    assert not refused, f"requests refused: {refused[:5]}"
    assert len(set(accepted)) == len(accepted)
    assert stats["jobs_succeeded"] == len(accepted)
    assert stats["disconnections_jobs"] == 0, "the app dropped a PUSH connection to the stalled worker"
