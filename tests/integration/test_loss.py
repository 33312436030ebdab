"""Plain enqueue loses nothing it accepted while the worker lives (issue 11, items 1, 2 and 7).

Accepted means ``enqueue`` returned an id and counted the job as enqueued;
executed is counted at the worker (``zqsync.demo.tasks:record`` appends one line
per job). Every scenario runs against a real ``zqsync worker`` with small
concurrency, so back-pressure builds, and asserts accepted == executed. Socket
discards are seen from the worker's side: ``disconnections_jobs``.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import gevent
import pytest

import zqsync
from benchmarks.loss_check import run_once
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(120)

PADDING = "x" * 1000


def executed(path) -> set[str]:
    return set(path.read_text().split()) if path.exists() else set()


@pytest.mark.parametrize("exit", ["close", "atexit"])
def test_a_plain_script_under_back_pressure_loses_no_accepted_job_at_close_or_exit(exit):
    """Item 7: a subprocess enqueues 15,000 1 KB jobs to a worker with concurrency 4, then exits.

    Before the fix a contiguous tail (hundreds of jobs) never arrived: a heartbeat
    reply reached the closing socket and the kernel reset the connection.
    """
    result = run_once(jobs=15_000, concurrency=4, delay=0.0002, payload=1000, exit=exit, linger=30.0,
                      settle=60.0, gevent=os.environ.get("ZQSYNC_TEST_MONKEY") == "1")
    print(f"\n{exit}: {result}")
    assert result["refused"] == 0
    assert result["lost"] == 0, f"lost {result['lost']} accepted jobs: {result['missing']}"
    assert result["job_pool"]["unsent_at_close"] == 0


def test_a_worker_that_stops_reading_for_longer_than_the_heartbeat_keeps_its_connection_and_jobs(zq_worker, tmp_path):
    """Item 1: a worker that reads nothing for 4.5 s (SIGSTOP: its kernel still ACKs) is busy, not dead."""
    worker = zq_worker(concurrency=4)
    target = tmp_path / "record.txt"
    client = zqsync.Client(worker.endpoint, send_timeout=30.0)
    try:
        client.enqueue("record", str(target), "first")
        wait_for(lambda: "first" in executed(target), what="the connecting job")
        accepted = []
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            number = 0
            while time.monotonic() - stopped_at < 4.5:  # heartbeats (1 s, timeout 3 s) would give up meanwhile
                client.enqueue_with_options("record", args=(str(target), f"{number}-{PADDING}"), send_timeout=0.2)
                accepted.append(f"{number}-{PADDING}")
                number += 1
        except zqsync.Congested:
            time.sleep(max(0.0, 4.5 - (time.monotonic() - stopped_at)))
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        wait_for(lambda: executed(target) >= set(accepted), timeout=30,
                 what=f"all {len(accepted)} accepted jobs to run")
        assert worker.stats()["disconnections_jobs"] == 0, "the client dropped the busy worker's connection"
    finally:
        client.close()


def test_close_with_a_stalled_worker_waits_out_its_linger_and_reports_what_it_left(zq_worker, caplog):
    """Item 1: close(linger=) blocks for the linger, then counts and logs the jobs left unsent."""
    worker = zq_worker(concurrency=1, extra_args=["--hwm", "5"])
    client = zqsync.Client(worker.endpoint, hwm=5, send_timeout=0.2)
    client.enqueue("echo", "connect")
    wait_for(lambda: worker.stats()["jobs_received"] == 1, what="the connecting job")
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        with pytest.raises(zqsync.Congested):
            for _ in range(10_000):
                client.enqueue("echo", "y" * 65536)
        with caplog.at_level(logging.WARNING, logger="zqsync.client.pool"):
            started = time.monotonic()
            client.close(linger=0.5)
            took = time.monotonic() - started
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    unsent = client.stats()["jobs"]["unsent_at_close"]
    assert 0.45 <= took < 5.0
    assert 0 < unsent <= 5, unsent  # at most the HWM of the one socket
    assert any("up to" in record.getMessage() and "unsent" in record.getMessage() for record in caplog.records)


def test_close_to_a_healthy_worker_counts_nothing_unsent(zq_worker, caplog):
    worker = zq_worker()
    client = zqsync.Client(worker.endpoint)
    for number in range(200):
        client.enqueue("echo", number)
    with caplog.at_level(logging.WARNING, logger="zqsync.client.pool"):
        client.close(linger=5.0)
    assert client.stats()["jobs"]["unsent_at_close"] == 0
    assert not [record for record in caplog.records if "unsent" in record.getMessage()]
    wait_for(lambda: worker.stats()["jobs_received"] == 200, what="all 200 jobs")


def _enqueue_many(client: zqsync.Client, target, prefix: str, count: int, accepted: list[str],
                  on_refused) -> None:
    for number in range(count):
        line = f"{prefix}{number}-{PADDING * 16}"
        try:
            client.enqueue_with_options("record", args=(str(target), line, 0.01), send_timeout=0.05)
        except zqsync.Congested:
            on_refused()
            continue
        accepted.append(line)


def test_one_callers_congested_keeps_the_jobs_other_callers_queued_on_the_socket(zq_worker, tmp_path):
    """Item 2: 20 greenlets share 4 PUSH sockets to a slow worker; many enqueues raise Congested.

    Before the fix every Congested closed its socket with linger 0 and threw
    away the jobs other greenlets had queued on it. The worker is stopped
    until the first refusal, so the back-pressure happens on any machine.
    """
    worker = zq_worker(concurrency=2, extra_args=["--hwm", "50"])
    target = tmp_path / "record.txt"
    client = zqsync.Client(worker.endpoint, hwm=50)
    client.enqueue("record", str(target), "connect")
    wait_for(lambda: "connect" in executed(target), what="the connecting job")
    accepted: list[str] = ["connect"]
    resumed: list[bool] = []

    def resume_worker() -> None:
        if not resumed:
            resumed.append(True)
            os.kill(worker.pid, signal.SIGCONT)

    os.kill(worker.pid, signal.SIGSTOP)
    try:
        gevent.joinall([gevent.spawn(_enqueue_many, client, target, f"g{index}.", 60, accepted, resume_worker)
                        for index in range(20)], raise_error=True)
        refused = 20 * 60 + 1 - len(accepted)
        assert refused > 0, "no enqueue was congested: the scenario did not happen"
        wait_for(lambda: executed(target) >= set(accepted), timeout=60,
                 what=f"all {len(accepted)} accepted jobs to run ({refused} refused)")
        assert worker.stats()["disconnections_jobs"] == 0, "a PUSH socket was discarded"
        assert client.stats()["jobs"]["kept_after_error"] == refused
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        client.close()


def test_killing_greenlets_blocked_in_enqueue_keeps_the_jobs_queued_before_them(zq_worker, tmp_path):
    """Item 2: a killed greenlet's job was never queued; the jobs accepted before it still run."""
    worker = zq_worker(concurrency=2, extra_args=["--hwm", "20"])
    target = tmp_path / "record.txt"
    client = zqsync.Client(worker.endpoint, hwm=20, pool_size=1, send_timeout=60.0, lease_timeout=60.0)
    client.enqueue("record", str(target), "first")
    wait_for(lambda: "first" in executed(target), what="the connecting job")
    accepted: list[str] = []

    def sender(index: int) -> None:
        line = f"k{index}-{'y' * 65536}"
        client.enqueue("record", str(target), line)
        accepted.append(line)

    os.kill(worker.pid, signal.SIGSTOP)
    try:
        senders = [gevent.spawn(sender, index) for index in range(400)]
        gevent.sleep(1.0)  # the stopped worker's buffers fill; the rest block in enqueue
        blocked = [greenlet for greenlet in senders if not greenlet.dead]
        assert accepted and blocked, "no enqueue blocked: the scenario did not happen"
        gevent.killall(blocked)  # including the one blocked in send on the only socket
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    wait_for(lambda: executed(target) >= set(accepted), timeout=60, interval=0.5,
             what=f"all {len(accepted)} accepted jobs to run")
    assert worker.stats()["disconnections_jobs"] == 0, "the PUSH socket was discarded"
    client.close()
