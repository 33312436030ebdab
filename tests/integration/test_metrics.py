"""Metrics follow real traffic: the worker's and the client's counters, the stats command, Prometheus."""

from __future__ import annotations

import gc
import json
import socket
import subprocess
import sys
import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import zqsync
from tests.helpers import over_prefork_modes, wait_for
from zqsync.contrib.prometheus import MetricsSync

CALLS = 25


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_after_n_calls_and_jobs_the_counters_say_n(zq_worker):
    worker = zq_worker()
    with zqsync.Client(worker.endpoint) as client:
        for index in range(CALLS):
            assert client.call("add", index, 1) == index + 1
            client.enqueue("add", index, 1)
        client_stats = client.stats()
    assert client_stats["calls"] == CALLS and client_stats["enqueued"] == CALLS
    assert client_stats["dealer"]["opened"] == 1 and client_stats["dealer"]["reused"] == CALLS - 1
    stats = wait_for(lambda: (s := worker.stats())["jobs_succeeded"] == CALLS and s, what="every job to run")
    assert stats["calls_succeeded"] == CALLS, "asking for stats is not counted as a call"
    assert stats["durations"]["add"]["count"] == 2 * CALLS
    assert 0 < stats["durations"]["add"]["p50"] <= stats["durations"]["add"]["p99"]


def test_stats_command_shows_the_live_counters(zq_worker):
    worker = zq_worker()
    with zqsync.Client(worker.endpoint) as client:
        for _ in range(3):
            client.call("echo", 1)
    result = subprocess.run([sys.executable, "-m", "zqsync", "stats", worker.endpoint, "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["calls_succeeded"] == 3
    text = subprocess.run([sys.executable, "-m", "zqsync", "stats", worker.endpoint],
                          capture_output=True, text=True, timeout=60).stdout
    assert "calls" in text and "duration echo" in text


def test_prometheus_endpoint_serves_parseable_text_that_follows_traffic(zq_worker):
    port = free_port()
    worker = zq_worker(extra_args=["--metrics-port", str(port)])
    with zqsync.Client(worker.endpoint) as client:
        for _ in range(CALLS):
            client.call("echo", "x")
    samples = wait_for(lambda: (s := scrape(port)).get("zqsync_worker_calls_succeeded_total") == CALLS and s,
                       what="the exporter to catch up")
    assert samples["zqsync_task_duration_seconds_count{task=echo}"] == CALLS


@over_prefork_modes
def test_prefork_supervisor_exports_the_sum_over_its_children(zq_worker, tmp_path, mode):
    port = free_port()
    worker = zq_worker(extra_args=["--metrics-port", str(port), "--processes", "2", *mode])
    with zqsync.Client(worker.endpoint, expand_prefork=True) as client:  # direct: over both children's slots
        # the worker's own tasks are not counted
        wait_for(lambda: len({client.call("zqsync.stats")["pid"] for _ in range(10)}) == 2, what="both children")
        for _ in range(CALLS):
            client.call("echo", "x")
    wait_for(lambda: scrape(port).get("zqsync_worker_calls_succeeded_total") == CALLS, timeout=30,
             what="the children's counters summed")


def _enqueued(sync, registry) -> float:
    sync.update()
    return registry.get_sample_value("zqsync_client_enqueued_total")


def test_a_client_that_goes_away_takes_none_of_the_counted_jobs_with_it(zq_worker):
    worker = zq_worker()
    registry = CollectorRegistry()
    sync = MetricsSync(registry=registry, baseline=True)  # other tests' clients may still be alive here
    first, second = zqsync.Client(worker.endpoint), zqsync.Client(worker.endpoint)
    for client, jobs in ((first, 3), (second, 2)):
        for _ in range(jobs):
            client.enqueue("add", 1, 1)
    assert _enqueued(sync, registry) == 5
    first.close()
    del first, client
    gc.collect()
    assert _enqueued(sync, registry) == 5, "the closed client's jobs stay counted, once"
    second.enqueue("add", 1, 1)
    assert _enqueued(sync, registry) == 6
    second.close()


def test_a_baseline_sync_counts_only_what_happens_after_it(zq_worker):
    worker = zq_worker()
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue("add", 1, 1)  # counted before the (forked child's) sync starts
        registry = CollectorRegistry()
        sync = MetricsSync(registry=registry, baseline=True)
        assert _enqueued(sync, registry) == 0
        client.enqueue("add", 1, 1)
        assert _enqueued(sync, registry) == 1
