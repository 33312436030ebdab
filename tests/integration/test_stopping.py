"""A stopping worker, with real processes: it takes no work meant for its peers, and every plain
job that reached it either runs or is counted and logged as discarded."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

import zqsync
from tests.helpers import JobStream, slack, wait_for

pytestmark = pytest.mark.timeout(90)


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def logged(pattern: str, output: str) -> int:
    return sum(int(n) for n in re.findall(pattern, output))


def logged_discards(output: str) -> int:
    """Jobs the worker's log counts as discarded on a stop (never started): those still queued, and those
    the scheduler held waiting for a slot, a retry or a rate limit's turn."""
    return (logged(r"discarded (\d+) queued plain jobs on shutdown", output)
            + logged(r"dropped (\d+) pending plain job\(s\) \(waiting for a retry or a rate limit's turn\)", output))


def logged_kills(output: str) -> int:
    """Tasks the worker's log says it killed when the grace period ended (never finished)."""
    return logged(r"kill(?:ed|ing) (\d+)(?: of \d+)? task\(s\) still running", output)


def settled(target, expected: int, timeout: float = 30.0, stall: float = 5.0) -> list[str]:
    """The lines of ``target`` once there are ``expected`` of them, or once they stop growing for ``stall``
    seconds, or after ``timeout`` seconds (both slack-scaled: a busy worker drains a backlog of thousands of
    jobs slowly on a loaded machine, and a job still queued is not a job lost)."""
    timeout, stall = slack(timeout), slack(stall)
    deadline, last, since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        found = lines(target)
        if len(found) >= expected:
            return found
        if len(found) != last:
            last, since = len(found), time.monotonic()
        elif time.monotonic() - since > stall:
            break
        time.sleep(0.05)
    return lines(target)


def test_term_runs_or_counts_every_queued_plain_job(zq_worker, tmp_path):
    """300 jobs of 20 ms queued at a worker with one slot and a 1 s grace: some run, the rest are
    counted and logged as discarded or killed, exactly; none vanish."""
    worker = zq_worker(concurrency=1, extra_args=["--graceful-timeout", "1"])
    target = tmp_path / "ran.txt"
    with zqsync.Client(worker.endpoint) as client:
        for index in range(300):
            client.enqueue("record", str(target), str(index), 0.02)
        wait_for(lambda: len(lines(target)) >= 2, what="the first jobs to run")
        time.sleep(0.3)  # 30 kB on loopback: all of it is in the worker's process by now
        worker.proc.send_signal(signal.SIGTERM)
        status = worker.proc.wait(30)
    ran = lines(target)
    discarded, killed = logged_discards(worker.output()), logged_kills(worker.output())
    assert status == (1 if killed else 0)  # a stop that killed a task exits non-zero
    print(f"accepted 300, executed {len(ran)}, discarded (logged) {discarded}, killed (logged) {killed}")
    assert len(set(ran)) == len(ran)
    assert 0 < len(ran) < 300
    assert len(ran) + discarded + killed == 300


def test_a_pending_plain_retry_dropped_on_stop_is_logged(zq_worker, tmp_path):
    worker = zq_worker("tests.integration.journal_tasks:registry")
    target = tmp_path / "never.txt"
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue("fail_first", str(target), "k")
    wait_for(lambda: "retrying in" in worker.output(), what="the first attempt to fail")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(30) == 0
    output = worker.output()
    dropped = r"dropped 1 pending plain job\(s\) \(waiting for a retry or a rate limit's turn\) on shutdown"
    assert re.search(rf"{dropped}.*{job_id}", output), output
    assert not target.exists()


def test_a_stopping_worker_takes_no_jobs_or_calls_meant_for_its_peer(zq_worker, tmp_path):
    """w1 is in warm shutdown (one job still running): a client of both sends every job and call to w2."""
    w1, w2 = zq_worker(extra_args=["--graceful-timeout", "20"]), zq_worker()
    with zqsync.Client(w1.endpoint) as only_w1:
        only_w1.enqueue("sleep", 4.0)
        wait_for(lambda: w1.stats()["in_flight"] == 1, what="w1 to be busy")
    w1.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "warm shutdown" in w1.output(), what="w1's warm shutdown")
    target = tmp_path / "ran.txt"
    with zqsync.Client([w1.endpoint, w2.endpoint], call_timeout=5.0) as both:
        for index in range(100):
            both.enqueue("record", str(target), str(index))
        ran = settled(target, 100)
        print(f"accepted 100, executed {len(ran)}, lost {100 - len(ran)}")
        assert sorted(ran, key=int) == [str(index) for index in range(100)]
        wait_for(lambda: "stopped taking calls" in w1.output(), what="w1 to close its rpc socket")
        pids = {both.call("zqsync.stats")["pid"] for _ in range(10)}
    assert pids == {w2.pid}
    assert w1.proc.wait(30) == 0


#: The sender's jobs come in bursts of this many, 10 ms apart.
BURST = 200


def test_a_worker_stopped_mid_load_loses_only_what_its_log_says(zq_worker, tmp_path):
    """Jobs stream to two workers; one gets TERM. The other takes all later work, and every
    accepted job ran, or the stopped worker's log counts it as discarded or killed, exactly: its
    clients were told and fell quiet before it unbound. Before the stopping notice, 2,100 were
    lost (w1's socket queue and the client's queue for w1)."""
    w1, w2 = zq_worker(concurrency=10), zq_worker(concurrency=10)
    target = tmp_path / "ran.txt"
    sender = JobStream([w1.endpoint, w2.endpoint], target, burst=BURST, send_timeout=10.0)
    sender.start()
    wait_for(lambda: len(lines(target)) >= 2000, what="the load to be under way")
    w1.proc.send_signal(signal.SIGTERM)
    assert w1.proc.wait(30) == 0
    after_stop = w2.stats()["jobs_received"]
    wait_for(lambda: w2.stats()["jobs_received"] >= after_stop + 2000, what="w2 to take the later jobs")
    sender.stop()
    assert sender.error is None
    discarded, killed = logged_discards(w1.output()), logged_kills(w1.output())
    ran = settled(target, sender.accepted - discarded - killed)
    lost = sender.accepted - len(set(ran)) - discarded - killed
    print(f"accepted {sender.accepted}, executed {len(ran)}, discarded (logged) {discarded}, killed {killed}, "
          f"lost {lost}")
    assert len(set(ran)) == len(ran)
    assert lost == 0


def test_a_stopping_worker_answers_its_in_flight_call_and_refuses_new_ones_at_once(zq_worker):
    worker = zq_worker(extra_args=["--graceful-timeout", "20"])
    outcome: dict = {}
    with zqsync.Client(worker.endpoint, call_timeout=10.0) as client:
        caller = threading.Thread(target=lambda: outcome.update(value=client.call("sleep", 2.0)))
        caller.start()
        wait_for(lambda: worker.stats()["in_flight"] == 1, what="the call to be running")
        worker.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "warm shutdown" in worker.output(), what="the warm shutdown")
        started = time.monotonic()
        with pytest.raises(zqsync.WorkerStopping) as refused:
            client.call("echo", "late")
        assert refused.value.remote_type == "WorkerStopping"
        assert time.monotonic() - started < slack(2.0)  # refused at once, not at the call deadline
        caller.join(30)
    assert outcome == {"value": 2.0}
    assert worker.proc.wait(30) == 0
