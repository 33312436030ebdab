"""``--metrics-bind HOST:PORT``, every ``zqsync.stats`` counter exported, and the prefork multiprocess dir."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import zqsync
from tests.helpers import wait_for
from tests.integration.test_metrics import free_port, scrape

STOP_AND_JOURNAL = ("jobs_discarded_on_stop", "calls_refused_on_stop", "confirms_ignored_on_stop",
                    "confirmed_refused", "journal_errors", "confirms_shed")


def test_every_worker_counter_of_stats_is_scraped_with_its_value(zq_worker, tmp_path):
    port = free_port()
    worker = zq_worker(extra_args=["--metrics-bind", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")])
    with zqsync.Client(worker.endpoint) as client:
        client.call("add", 1, 2)
        client.enqueue_with_options("add", args=[1, 2], confirm=True)
    stats = wait_for(lambda: (s := worker.stats())["jobs_succeeded"] == 1 and s, what="the confirmed job")
    samples = wait_for(lambda: (s := scrape(port)).get("zqsync_worker_jobs_succeeded_total") == 1 and s,
                       what="the exporter to catch up")
    for key in STOP_AND_JOURNAL + ("confirmed_received", "calls_succeeded"):
        assert samples[f"zqsync_worker_{key}_total"] == stats[key], key


def test_metrics_bind_rejects_a_malformed_address():
    result = subprocess.run([sys.executable, "-m", "zqsync", "worker", "zqsync.demo.tasks", "--metrics-bind", "9100"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "expected HOST:PORT such as 0.0.0.0:9100, got '9100'" in result.stderr


@pytest.mark.parametrize("multiproc_dir", [None, "", "/nonexistent/zqsync"], ids=["unset", "empty", "missing"])
def test_prefork_metrics_dir_is_warned_about_and_removed_on_exit(zq_worker, short_tmp, multiproc_dir):
    port, tmp = free_port(), short_tmp
    env = {"TMPDIR": str(tmp)}
    if multiproc_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
    worker = zq_worker(extra_args=["--metrics-bind", f"127.0.0.1:{port}", "--processes", "2"], env=env)
    with zqsync.Client(worker.endpoint) as client:
        for _ in range(5):
            client.call("echo", "x")
    wait_for(lambda: scrape(port).get("zqsync_worker_calls_succeeded_total") == 5, timeout=30,
             what="the children's counters summed")
    created = [name for name in os.listdir(tmp) if name.startswith("zqsync-metrics-")]
    assert len(created) == 1
    warned = "PROMETHEUS_MULTIPROC_DIR=" in worker.output()
    assert warned == (multiproc_dir is not None), worker.output()
    assert worker.stop() == 0
    assert not (tmp / created[0]).exists(), "the worker removes the directory it made"
