"""Named worker queues: under a flood of low-priority jobs, high-priority jobs still start at once."""

import subprocess
import sys
import time

import pytest

from tests.helpers import slack, wait_for
from zqsync import Client

APP = "tests.integration.queue_tasks:registry"
FLOOD, LOW_SLOTS, SLOW = 200, 4, 0.1  # the flood needs FLOOD * SLOW / LOW_SLOTS = 5 s to drain
pytestmark = pytest.mark.timeout(90)


def test_high_priority_jobs_start_within_a_fraction_of_the_low_flood_s_drain_time(zq_worker, tmp_path):
    worker = zq_worker(APP, extra_args=["--queue", "high:2=tcp://127.0.0.1:0",
                                        "--queue", f"low:{LOW_SLOTS}=tcp://127.0.0.1:0"])
    queues = worker.stats()["queues"]
    assert [(name, queues[name]["concurrency"]) for name in queues] == [("high", 2), ("low", LOW_SLOTS)]
    latencies = tmp_path / "latencies.txt"
    with Client(queues["low"]["endpoint"]) as low, Client(queues["high"]["endpoint"]) as high:
        for _ in range(FLOOD):
            low.enqueue("slow")
        wait_for(lambda: worker.stats()["queues"]["low"]["running"] == LOW_SLOTS, what="the flood running")
        for _ in range(5):
            high.enqueue("urgent", time.time(), str(latencies))
            time.sleep(0.1)
        wait_for(lambda: latencies.exists() and len(latencies.read_text().split()) == 5, what="the urgent jobs")
        flood_done = worker.stats()["jobs_succeeded"] - 5  # the urgent ones have all run
    seen = [float(line) for line in latencies.read_text().split()]
    print(f"high-priority start latency under a {FLOOD}-job flood: max {max(seen) * 1000:.1f} ms, "
          f"all {[round(value * 1000, 1) for value in seen]} ms")
    # The flood was still draining when every urgent job had run. Counted by jobs done, not by a snapshot
    # of running ones: the four slots start and end their 0.1 s jobs together, so a snapshot can fall
    # between two of their jobs (seen in CI: 2 of 4 once, and 0 of 4).
    assert flood_done < FLOOD, f"the flood of {FLOOD} jobs had drained before the urgent jobs ran"
    assert max(seen) < slack(0.5), seen  # the issue asks 50 ms; the flood alone would take 5 s


def test_a_warm_stop_runs_the_jobs_waiting_in_a_named_queue(zq_worker, tmp_path):
    worker = zq_worker(APP, extra_args=["--queue", "low:1=tcp://127.0.0.1:0"])
    runs = tmp_path / "runs.txt"
    with Client(worker.stats()["queues"]["low"]["endpoint"]) as low:
        for _ in range(30):  # 3 s of work for the queue's one slot
            low.enqueue("counted", str(runs))
        wait_for(lambda: runs.exists(), what="the first job")
        assert worker.stop() == 0
    assert len(runs.read_text().split()) == 30, worker.output()
    assert "discarded" not in worker.output()


@pytest.mark.parametrize("flags, message", [
    (["--processes", "2", "--queue", "high=tcp://127.0.0.1:0"], "--queue needs a single process"),
    (["--queue", "high=nowhere"], "--queue: a queue is NAME[:CONCURRENCY]=tcp://HOST:PORT, got 'high=nowhere'"),
    (["--queue", "a=tcp://127.0.0.1:0", "--queue", "a=tcp://127.0.0.1:0"], "queue names must differ"),
])
def test_queue_flags_that_cannot_work_are_refused(flags, message):
    result = subprocess.run([sys.executable, "-m", "zqsync", "worker", APP, "--bind", "tcp://127.0.0.1:0", *flags],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and message in result.stderr, result.stderr
