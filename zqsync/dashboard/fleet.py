"""The dashboard's view of the fleet: one greenlet per worker polls ``zqsync.stats``.

Each poll keeps the latest answer per worker process: a prefork worker answers
for all its children (keyed by its supervisor's pid, children listed under
``children``); rates come from the difference with that process's previous
answer. The charts' series is sampled on its own timer: each sample's rates
count every job and call that the polls saw since the previous sample, so no
poll goes uncharted when two polls fall between two samples (a busy machine
delays the sampler). Nothing is stored beyond `HISTORY` samples in memory.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import gevent

from ..client.client import Client
from ..errors import CallTimeout, WorkerStopping, ZqsyncError
from ..wire.curve import Curve

log = logging.getLogger(__name__)

#: Samples of the fleet-wide series kept for the charts (one per poll).
HISTORY = 300
#: A process not heard from for this many poll intervals is dropped from the fleet.
FORGET_AFTER = 10
#: Counters whose rate the dashboard shows: finished jobs, and calls received.
JOB_COUNTERS = ("jobs_succeeded", "jobs_failed")
CALL_COUNTERS = ("calls_received",)


@dataclass
class Process:
    """The latest ``zqsync.stats`` answer of one worker process (or prefork supervisor), and its rates."""

    pid: int
    seen: float
    stats: dict[str, Any]
    jobs_per_s: float = 0.0
    calls_per_s: float = 0.0


@dataclass
class Worker:
    """One ``ENDPOINT`` given to the dashboard: its state and its processes by pid."""

    endpoint: str
    client: Client
    state: str = "unknown"
    error: Optional[str] = None
    processes: dict[int, Process] = field(default_factory=dict)


def _total(stats: dict[str, Any], names: tuple[str, ...]) -> int:
    return sum(int(stats.get(name, 0)) for name in names)


def _state(stats: dict[str, Any]) -> str:
    if stats.get("state") in ("stopping", "unreachable"):
        return str(stats["state"])
    return "busy" if stats.get("in_flight", 0) > 0 else "up"


def _pid(stats: dict[str, Any]) -> int:
    """The supervisor's pid for a prefork worker's whole-worker answer (any child answers), else the worker's."""
    return int((stats.get("supervisor") or {}).get("pid") or stats["pid"])


class Fleet:
    """Polls every endpoint each ``interval`` seconds (float) from its own greenlet.

    :param endpoints: worker base endpoints (``tcp://HOST:PORT``).
    :param interval: seconds between polls; a poll waits at most ``2 * interval`` (at least 1 s)
        for an answer, then counts the worker ``unreachable``.
    :param curve: CURVE keys for workers that require them.
    :raises ConfigurationError: a malformed endpoint.
    """

    def __init__(self, endpoints: list[str], *, interval: float = 1.0, curve: Optional[Curve] = None) -> None:
        self.interval = interval
        self.timeout = max(1.0, 2 * interval)
        self.workers = [Worker(endpoint, Client(endpoint, curve=curve)) for endpoint in endpoints]
        self.history: collections.deque[dict[str, float]] = collections.deque(maxlen=HISTORY)
        self._unsampled = {"jobs": 0, "calls": 0}  # finished jobs and calls the polls saw since the last sample
        self._sampled_at = time.monotonic()
        self._greenlets: list[gevent.Greenlet] = []

    def start(self) -> None:
        """Start the polling greenlets (returns at once) and the sampler of the fleet series."""
        self._greenlets = [gevent.spawn(self._poll_forever, worker) for worker in self.workers]
        self._greenlets.append(gevent.spawn(self._sample_forever))

    def stop(self) -> None:
        """Kill the polling greenlets and close the clients."""
        gevent.killall(self._greenlets)
        for worker in self.workers:
            worker.client.close(linger=0)

    def worker(self, endpoint: str) -> Worker:
        """The worker polled at ``endpoint``. :raises KeyError: not one of the dashboard's endpoints."""
        for worker in self.workers:
            if worker.endpoint == endpoint:
                return worker
        raise KeyError(endpoint)

    # -- polling ---------------------------------------------------------------

    def _poll_forever(self, worker: Worker) -> None:
        while True:
            started = time.monotonic()
            self.poll(worker)
            gevent.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def poll(self, worker: Worker) -> None:
        """Ask ``worker`` for its stats once and update its state and rates."""
        try:
            stats = worker.client.call_with_options("zqsync.stats", timeout=self.timeout)
        except WorkerStopping as exc:
            worker.state, worker.error = "stopping", str(exc)
        except CallTimeout as exc:
            worker.state, worker.error = "unreachable", str(exc)
        except ZqsyncError as exc:
            log.warning("dashboard: %s answered zqsync.stats with an error: %s", worker.endpoint, exc)
            worker.state, worker.error = "error", str(exc)
        else:
            self._record(worker, stats)
        self._forget(worker)

    def _record(self, worker: Worker, stats: dict[str, Any]) -> None:
        now = time.monotonic()
        pid = _pid(stats)
        previous = worker.processes.get(pid)
        process = worker.processes[pid] = Process(pid, now, stats)
        if previous is not None:
            jobs = max(0, _total(stats, JOB_COUNTERS) - _total(previous.stats, JOB_COUNTERS))
            calls = max(0, _total(stats, CALL_COUNTERS) - _total(previous.stats, CALL_COUNTERS))
            self._unsampled["jobs"] += jobs
            self._unsampled["calls"] += calls
            elapsed = now - previous.seen
            if elapsed > 0:
                process.jobs_per_s, process.calls_per_s = jobs / elapsed, calls / elapsed
        worker.state, worker.error = _state(stats), None

    def _forget(self, worker: Worker) -> None:
        horizon = time.monotonic() - FORGET_AFTER * self.interval
        for pid in [pid for pid, process in worker.processes.items() if process.seen < horizon]:
            del worker.processes[pid]

    def _sample_forever(self) -> None:
        while True:
            gevent.sleep(self.interval)
            self.history.append(self.sample())

    # -- views -----------------------------------------------------------------

    def sample(self) -> dict[str, float]:
        """The fleet-wide point of the charts now, and the start of the next sample's period: epoch
        seconds, jobs/s and calls/s that the polls saw since the previous sample (or since the Fleet
        was made), in flight, and the slowest process's p50 and p99 task duration (seconds) over all tasks."""
        now, started, self._sampled_at = time.time(), self._sampled_at, time.monotonic()
        elapsed = max(self._sampled_at - started, 1e-6)
        jobs, calls = self._unsampled["jobs"], self._unsampled["calls"]
        self._unsampled = {"jobs": 0, "calls": 0}
        processes = [process for worker in self.workers for process in worker.processes.values()]
        overall = [process.stats.get("durations", {}).get("*", {}) for process in processes]
        return {
            "t": now,
            "jobs_per_s": jobs / elapsed,
            "calls_per_s": calls / elapsed,
            "in_flight": sum(process.stats.get("in_flight", 0) for process in processes),
            "p50": max((summary.get("p50", 0.0) for summary in overall), default=0.0),
            "p99": max((summary.get("p99", 0.0) for summary in overall), default=0.0),
        }

    def snapshot(self) -> list[dict[str, Any]]:
        """The fleet as JSON-ready rows: per worker its state, error and processes (children)."""
        return [self._worker_row(worker) for worker in self.workers]

    def _worker_row(self, worker: Worker) -> dict[str, Any]:
        processes = sorted(worker.processes.values(), key=lambda process: process.pid)
        rows = [_process_row(process) for process in processes]
        # Aggregated prefork stats list each child under "children".
        children = [_child_row(child) for process in processes for child in process.stats.get("children", ())]
        return {
            "endpoint": worker.endpoint,
            "state": worker.state,
            "error": worker.error,
            "processes": rows,
            "children": children,
            "in_flight": sum(row["in_flight"] for row in rows),
            "queued": sum(row["queued"] for row in rows),
            "jobs_per_s": sum(row["jobs_per_s"] for row in rows),
            "calls_per_s": sum(row["calls_per_s"] for row in rows),
            "uptime": max((row["uptime"] for row in rows), default=None),
        }


def _process_row(process: Process) -> dict[str, Any]:
    stats = process.stats
    return {
        "pid": process.pid,
        "prefork": "supervisor" in stats,
        "state": _state(stats),
        "in_flight": stats.get("in_flight", 0),
        "queued": stats.get("queued", 0),
        "delayed": stats.get("delayed", 0),
        "queues": stats.get("queues", {}),
        "uptime": stats.get("uptime", 0.0),
        "age": time.monotonic() - process.seen,
        "jobs_per_s": process.jobs_per_s,
        "calls_per_s": process.calls_per_s,
        "counters": {key: value for key, value in stats.items() if isinstance(value, int) and not isinstance(value, bool)},
        "durations": stats.get("durations", {}),
    }


def _child_row(child: dict[str, Any]) -> dict[str, Any]:
    counters = child.get("counters", {})
    return {"pid": child.get("pid"), "state": _state(child), "in_flight": child.get("in_flight", 0),
            "uptime": child.get("uptime"), "jobs_done": _total(counters, JOB_COUNTERS),
            "calls": _total(counters, CALL_COUNTERS)}
