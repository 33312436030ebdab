"""``zqsync demo``: the main job end to end on loopback.

A worker serves ``zqsync.demo.tasks``; real ``gunicorn -k gevent`` serves
``zqsync.demo.webapp`` (both ship in the package, so the demo runs from any
directory); N HTTP requests each enqueue one job and make one
call. The summary shows throughput, that no job or call was lost, and how
few client sockets the worker saw per gunicorn process.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import sys
import threading
import time
from collections import Counter
from typing import Any, Optional

from ..client.client import Client
from ..processes import GunicornProcess, WorkerProcess
from ..settings import ClientSettings


class _Driver:
    """Sends requests from ``concurrency`` threads, each with one keep-alive connection."""

    def __init__(self, url: str, total: int, concurrency: int, progress: Any) -> None:
        self.host, self.port = url.split("//", 1)[1].split(":")
        self.total, self.concurrency, self.progress = total, concurrency, progress
        self.next_index = 0
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: list[str] = []
        self.calls_by_pid: Counter[int] = Counter()
        self.job_ids: set[str] = set()

    def _take(self) -> Optional[int]:
        with self.lock:
            if self.next_index >= self.total:
                return None
            self.next_index += 1
            return self.next_index

    def run_one_connection(self) -> None:
        connection = http.client.HTTPConnection(self.host, int(self.port), timeout=30)
        try:
            while (index := self._take()) is not None:
                self._request(connection, index)
        finally:
            connection.close()

    def _request(self, connection: http.client.HTTPConnection, index: int) -> None:
        try:
            connection.request("GET", f"/?n={index}")
            response = connection.getresponse()
            body = json.loads(response.read())
            good = response.status == 200 and body.get("result") == index + 1
        except (OSError, ValueError, http.client.HTTPException) as exc:
            connection.close()
            body, good = {"error": repr(exc)}, False
        with self.lock:
            if good:
                self.ok += 1
                self.calls_by_pid[body["pid"]] += 1
                self.job_ids.add(body["job_id"])
            else:
                self.failures.append(f"request {index}: {body}")
        self.progress.update(1)

    def run(self) -> float:
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            for future in [pool.submit(self.run_one_connection) for _ in range(self.concurrency)]:
                future.result()
        return time.perf_counter() - started


def _wait_for_jobs(client: Client, expected: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = client.call("zqsync.stats")
        done = stats["jobs_succeeded"] + stats["jobs_failed"] + stats["unknown_task"]
        if done >= expected or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def run_demo(*, requests: int, concurrency: int, web_workers: int, preload: bool, timeout: float) -> int:
    """Run the demo; returns 0 if every request, job and call succeeded and sockets were reused."""
    from tqdm import tqdm

    pool_size = ClientSettings.from_env().pool_size
    mode = f"gunicorn -k gevent -w {web_workers}{' --preload' if preload else ''}"
    print(f"zqsync demo: {requests} requests, concurrency {concurrency}, {mode}, worker on loopback", flush=True)
    with WorkerProcess("zqsync.demo.tasks:registry", extra_args=["--log-level", "warning"]) as worker:
        web = GunicornProcess(
            "zqsync.demo.webapp:app", config="python:zqsync.demo.gunicorn_conf",
            workers=web_workers, preload=preload, env={"ZQSYNC_ENDPOINT": worker.endpoint},
        )
        with web:
            # disable=None: no bar unless stderr is a terminal (a log gets no redraws)
            with tqdm(total=requests, desc="requests", unit="req", file=sys.stderr, mininterval=0.5,
                      disable=None) as bar:
                driver = _Driver(web.url, requests, concurrency, bar)
                elapsed = driver.run()
            with Client(worker.endpoint, call_timeout=10.0) as client:
                stats = _wait_for_jobs(client, driver.ok, timeout=min(30.0, timeout))
    return _report(driver, stats, elapsed, requests, pool_size)


def _report(driver: _Driver, stats: dict[str, Any], elapsed: float, requests: int, pool_size: int) -> int:
    jobs_done = stats["jobs_succeeded"]
    print(f"  requests/s            {requests / elapsed:,.0f}  ({driver.ok} ok, {len(driver.failures)} failed, {elapsed:.2f} s)")
    print(f"  jobs                  {len(driver.job_ids)} enqueued, {jobs_done} executed (counted by the worker)")
    print(f"  calls                 {driver.ok} ok, {stats['calls_failed']} failed on the worker")
    print(f"  client sockets the worker saw, per gunicorn process (pool size {pool_size}):")
    identities = stats["identities_by_pid"]
    reused = True
    for pid, calls in sorted(driver.calls_by_pid.items()):
        seen = identities.get(str(pid), 0)
        reused &= 0 < seen <= pool_size
        print(f"    pid {pid}: {seen} DEALER identities for {calls} calls")
    print(f"  TCP connections accepted by the worker: jobs {stats['connections_jobs']}, "
          f"rpc {stats['connections_rpc']} (1 rpc connection is this summary's)")
    for failure in driver.failures[:5]:
        print(f"  FAILED {failure}")
    lost = driver.ok != requests or jobs_done != len(driver.job_ids) or stats["jobs_failed"] or stats["calls_failed"]
    if lost or not reused:
        print("  result: FAILED" + (" (requests, jobs or calls lost or failed)" if lost else " (sockets not reused)"))
        return 1
    print("  result: OK: every request, job and call succeeded over a few reused sockets")
    return 0
