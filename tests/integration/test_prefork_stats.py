"""``zqsync.stats`` for a whole prefork worker (one answer, every child's counters), and job
counters that agree for confirmed jobs. Real supervisors, real children, real sockets. The prefork
workers here use the router, which spreads one client's calls over the children and skips a stopped
one (direct mode's stats: ``test_direct_prefork.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import zqsync
from tests.helpers import children_of, slack, wait_for

CALLS = 20


def prefork(zq_worker, tmp_path, processes=2):
    args = ["--processes", str(processes), "--router", "--state-dir", str(tmp_path / "state")]
    return zq_worker(extra_args=args, concurrency=10)


def test_a_confirmed_job_counts_as_received_before_it_succeeds(zq_worker, tmp_path):
    worker = zq_worker(extra_args=["--state-dir", str(tmp_path / "state")])
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue_with_options("echo", args=("x",), confirm=True)
    stats = wait_for(lambda: (s := worker.stats())["jobs_succeeded"] == 1 and s, what="the confirmed job to run")
    assert (stats["jobs_received"], stats["confirmed_accepted"], stats["plain_received"]) == (1, 1, 0)


@pytest.mark.timeout(120)
def test_one_stats_call_answers_for_every_child(zq_worker, tmp_path):
    worker = prefork(zq_worker, tmp_path)
    children = children_of(worker.proc.pid)
    assert len(children) == 2
    with zqsync.Client(worker.endpoint) as client:
        # A child's first credits can reach the router after the first calls on a busy machine: call
        # until each child has served some (checked from the children's own counters), then count.
        calls = 0
        while calls < CALLS or not all(child["counters"]["calls_succeeded"] > 0
                                       for child in client.call("zqsync.stats")["children"]):
            assert client.call("echo", calls) == calls and calls < 100 * CALLS
            calls += 1
        served = {client.call("zqsync.stats")["pid"] for _ in range(10)}
        stats = client.call("zqsync.stats")
    assert served == set(children), "both children answer stats calls (round-robin)"
    assert stats["calls_succeeded"] == calls, "the total over both children, whichever answered"
    assert [child["pid"] for child in stats["children"]] == children
    assert sum(child["counters"]["calls_succeeded"] for child in stats["children"]) == calls
    assert all(child["counters"]["calls_succeeded"] > 0 for child in stats["children"])
    assert stats["durations"]["echo"]["count"] == calls
    assert stats["supervisor"]["pid"] == worker.proc.pid and stats["supervisor"]["processes"] == 2
    assert stats["unreachable"] == 0 and {child["state"] for child in stats["children"]} == {"up"}
    printed = subprocess.run([sys.executable, "-m", "zqsync", "stats", worker.endpoint, "--json"],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["calls_succeeded"] == calls
    text = subprocess.run([sys.executable, "-m", "zqsync", "stats", worker.endpoint],
                          capture_output=True, text=True, timeout=60).stdout
    assert f"supervisor pid {worker.proc.pid}" in text and f"child pid {children[1]}: up" in text


@pytest.mark.timeout(120)
def test_a_stopped_child_is_listed_unreachable_and_the_answer_still_comes(zq_worker, tmp_path):
    worker = prefork(zq_worker, tmp_path)
    stopped, free = children_of(worker.proc.pid)
    os.kill(stopped, signal.SIGSTOP)
    try:
        with zqsync.Client(worker.endpoint) as client:

            def answer_from_the_free_child():
                try:
                    started = time.monotonic()
                    stats = client.call_with_options("zqsync.stats", timeout=slack(4.0))
                    return stats["pid"] == free and (stats, time.monotonic() - started)
                except zqsync.CallTimeout:  # the proxy handed this one to the stopped child
                    return None

            stats, seconds = wait_for(answer_from_the_free_child, timeout=60, what="the free child to answer")
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert stats["unreachable"] == 1
    assert {child["pid"]: child["state"] for child in stats["children"]} == {stopped: "unreachable", free: "up"}
    assert seconds < slack(2.5), f"the answer took {seconds:.1f} s: a stopped child must cost at most ~1 s"
