"""Prometheus metrics for clients and workers (``prometheus_client``, extra ``prometheus``).

zqsync keeps its own counters (``Client.stats()``, ``SocketPool.stats()``,
the worker's ``zqsync.stats``); nothing here touches the hot path. A
`MetricsSync` mirrors those counters into ``prometheus_client``
metrics every ``interval`` seconds, and task durations feed a histogram as
tasks finish.

Because it uses ordinary metric objects, it works in ``prometheus_client``'s
multiprocess mode too: that is what a gunicorn app and a prefork worker use.

* One process: ``serve(port)`` starts an HTTP exporter and the sync.
* gunicorn: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before
  starting gunicorn. ``zqsync.contrib.gunicorn.post_fork`` then starts the
  sync in every worker and ``child_exit`` marks dead workers; serve
  `multiprocess_text` from a view (see the README).
* ``zqsync worker --metrics-bind HOST:PORT``: one process serves directly; with
  ``--processes`` the supervisor serves the children's numbers in
  multiprocess mode.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.exposition import generate_latest

from .._common import live_clients

PREFIX = "zqsync"

#: Client.stats() keys mirrored as counters.
CLIENT_COUNTERS = ("enqueued", "dropped", "confirmed", "confirm_retries", "calls", "call_errors", "call_timeouts")
#: SocketPool.stats() keys mirrored as counters (labelled by pool).
POOL_COUNTERS = ("opened", "reused", "discarded_poisoned", "discarded_full", "waits", "wait_seconds",
                 "stale_replies", "forks_detected", "swept", "fd_exhausted")
POOL_GAUGES = ("open", "in_flight")
#: ``Client.stats()`` keys of its two pools, the ``pool`` label's values.
POOLS = ("jobs", "dealer")
#: Worker counter keys mirrored as counters; ``in_flight`` is a gauge.
#: ``confirmed_refused`` and ``journal_errors`` exist only with a journal (``--state-dir``); 0 otherwise.
WORKER_COUNTERS = ("jobs_received", "plain_received", "jobs_replayed", "jobs_succeeded", "jobs_failed",
                   "jobs_retried", "jobs_dead", "confirmed_received", "confirmed_accepted", "confirmed_duplicates",
                   "confirmed_refused", "journal_errors", "calls_received", "calls_succeeded", "calls_failed",
                   "timed_out", "unknown_task", "malformed", "calls_expired", "jobs_expired",
                   "jobs_discarded_on_stop", "calls_refused_on_stop", "confirms_ignored_on_stop", "confirms_shed",
                   "fd_exhausted")
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MetricsSync:
    """Mirrors zqsync's counters into ``prometheus_client`` metrics.

    Counters grow by what each client (and the worker) counted since the
    previous `update`, so a client that is closed or collected between
    two updates loses only what it counted since the last one.

    :param worker: a `zqsync.worker.server.Worker` whose counters and
        task durations to export, or ``None`` for a client-only process.
    :param registry: where the metrics live (default: the global registry).
    :param baseline: count only what happens from now on: what the clients of
        this process counted so far is taken as already exported (for a forked
        child, whose clients carry the parent's numbers).
    """

    def __init__(self, worker: Any = None, *, registry: CollectorRegistry = REGISTRY, baseline: bool = False) -> None:
        self.worker = worker
        self._last: dict[tuple, float] = {}
        self._seen: "weakref.WeakKeyDictionary[Any, dict[tuple, float]]" = weakref.WeakKeyDictionary()
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._define(registry)
        if worker is not None:
            worker.runner.durations.listeners.append(self._observe)
        if baseline:
            for client in live_clients():
                self._seen[client] = _client_counts(client.stats())

    def _define(self, registry: CollectorRegistry) -> None:
        for key in CLIENT_COUNTERS:
            self._counters[f"client_{key}"] = Counter(f"{PREFIX}_client_{key}", f"Client {key}", registry=registry)
        for key in POOL_COUNTERS:
            self._counters[f"pool_{key}"] = Counter(f"{PREFIX}_pool_{key}", f"Socket pool {key}", ["pool"],
                                                    registry=registry)
        for key in POOL_GAUGES:
            self._gauges[f"pool_{key}"] = Gauge(f"{PREFIX}_pool_sockets_{key}", f"Pooled sockets {key}", ["pool"],
                                                multiprocess_mode="livesum", registry=registry)
        if self.worker is None:
            return
        for key in WORKER_COUNTERS:
            self._counters[f"worker_{key}"] = Counter(f"{PREFIX}_worker_{key}", f"Worker {key}", registry=registry)
        self._gauges["worker_in_flight"] = Gauge(f"{PREFIX}_worker_in_flight", "Tasks running now",
                                                 multiprocess_mode="livesum", registry=registry)
        self._histogram = Histogram(f"{PREFIX}_task_duration_seconds", "Task run time", ["task"],
                                    buckets=DURATION_BUCKETS, registry=registry)

    def _observe(self, task: str, seconds: float) -> None:
        self._histogram.labels(task=task).observe(seconds)

    def _count(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        delta = value - self._last.get(key, 0.0)
        self._last[key] = value
        metric = self._counters[name]
        (metric.labels(**labels) if labels else metric).inc(delta if delta >= 0 else value)

    def update(self) -> None:
        """Read the current counters and bring the metrics up to date."""
        gauges: dict[tuple, float] = {(key, pool): 0 for key in POOL_GAUGES for pool in POOLS}
        for client in live_clients():
            stats = client.stats()
            counts = _client_counts(stats)
            before = self._seen.get(client, {})
            for (name, pool), value in counts.items():
                delta = value - before.get((name, pool), 0.0)
                if delta > 0:
                    metric = self._counters[name]
                    (metric.labels(pool=pool) if pool else metric).inc(delta)
            self._seen[client] = counts
            for key, pool in gauges:
                gauges[(key, pool)] += stats[pool].get(key, 0)
        for (key, pool), value in gauges.items():
            self._gauges[f"pool_{key}"].labels(pool=pool).set(value)
        if self.worker is not None:
            counters = self.worker.runner.counters
            for key in WORKER_COUNTERS:
                self._count(f"worker_{key}", counters.get(key, 0))
            self._gauges["worker_in_flight"].set(counters["in_flight"])

    def start(self, interval: float = 1.0) -> "MetricsSync":
        """Update every ``interval`` seconds from a daemon thread (a greenlet when monkey-patched)."""

        def loop() -> None:
            while True:
                self.update()
                time.sleep(interval)

        threading.Thread(target=loop, name="zqsync-metrics", daemon=True).start()
        return self


def _client_counts(stats: dict[str, Any]) -> dict[tuple, float]:
    """A client's counters from its ``stats()``: ``{(metric name, pool label or ""): value}``."""
    counts: dict[tuple, float] = {(f"client_{key}", ""): stats[key] for key in CLIENT_COUNTERS}
    for pool in POOLS:
        counts.update({(f"pool_{key}", pool): stats[pool].get(key, 0) for key in POOL_COUNTERS})
    return counts


def multiprocess_registry() -> CollectorRegistry:
    """A registry that sums every process's numbers (needs ``PROMETHEUS_MULTIPROC_DIR``)."""
    registry = CollectorRegistry()
    _multiprocess.MultiProcessCollector(registry)
    return registry


def multiprocess_text() -> bytes:
    """The exposition text of every process's numbers, for a ``/metrics`` view in a gunicorn app."""
    return generate_latest(multiprocess_registry())


def mark_process_dead(pid: int) -> None:
    """Forget a dead process's live gauges (gunicorn ``child_exit``, the prefork supervisor)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _multiprocess.mark_process_dead(pid)


def start_exporter(port: int, *, addr: str = "127.0.0.1") -> None:
    """Serve metrics over HTTP on ``addr:port``: this process's, or in multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR`` set) the sum over every process."""
    registry = multiprocess_registry() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else REGISTRY
    start_http_server(port, addr=addr, registry=registry)


def serve(port: int, *, worker: Any = None, interval: float = 1.0, addr: str = "127.0.0.1") -> MetricsSync:
    """`start_exporter`, plus the sync of this process's counters every ``interval`` seconds."""
    start_exporter(port, addr=addr)
    return MetricsSync(worker).start(interval)

