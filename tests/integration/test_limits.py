"""Rate limits, soft time limits and expiry, seen from a client of a real worker core (in-process).

The tasks run in this process (the worker's own thread and hub), so they note what they saw in
lists the test reads; a soft time limit on a task that never yields needs the watchdog of a real
worker process: ``test_time_limits.py``.
"""

from __future__ import annotations

import datetime
import time

import gevent
import pytest

import zqsync
from tests.helpers import slack
from zqsync.worker import Registry

pytestmark = pytest.mark.timeout(60)

registry = Registry()
starts: list[float] = []
seen: list[str] = []


@registry.task(rate_limit="1/m")
def rare(tag):
    seen.append(tag)
    return tag


@registry.task(rate_limit="40/s")
def paced():
    starts.append(time.monotonic())


@registry.task
def add(a, b):
    seen.append(f"add {a} {b}")
    return a + b


@registry.task
def hold(seconds):
    gevent.sleep(seconds)


@registry.task(soft_time_limit=0.1, time_limit=slack(20.0))
def tidy(seconds):
    try:
        gevent.sleep(seconds)
    except zqsync.SoftTimeLimitExceeded:
        gevent.sleep(0.05)  # the cleanup may yield: the hard limit is still far
        return "cleaned up"
    return "finished"


@registry.task(soft_time_limit=0.1, retries=0)
def careless(seconds):
    gevent.sleep(seconds)


@registry.task(soft_time_limit=0.1, time_limit=0.4)
def stubborn(seconds):
    try:
        gevent.sleep(seconds)
    except zqsync.SoftTimeLimitExceeded:
        seen.append("soft limit seen")
        gevent.sleep(seconds)  # cleans up for too long: the hard limit ends it


@pytest.fixture(autouse=True)
def clean():
    starts.clear()
    seen.clear()


def test_jobs_over_the_rate_wait_their_turn_without_a_task_slot_and_stats_count_them(zq_inprocess):
    worker = zq_inprocess(registry, concurrency=1)
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        for tag in "abc":
            client.enqueue("rare", tag)
        worker.wait(lambda counters: counters["plain_received"] == 3 and counters["jobs_succeeded"] == 1)
        client.enqueue("add", 1, 2)  # the one slot is free: the two waiting jobs do not hold it
        worker.wait(lambda counters: counters["jobs_succeeded"] == 2)
        assert client.call("add", 2, 2) == 4
        assert client.call("zqsync.stats")["rate_limited"] == {"rare": 2}
    assert seen == ["a", "add 1 2", "add 2 2"]
    worker.stop()
    assert worker.worker.runner.counters["jobs_discarded_on_stop"] == 2  # kept in memory only: the loss is counted


def test_a_rate_spaces_the_starts_of_a_task_and_drops_no_job(zq_inprocess):
    worker = zq_inprocess(registry, concurrency=4)
    with zqsync.Client(worker.endpoint) as client:
        sent = time.monotonic()
        for _ in range(30):
            client.enqueue("paced")
        counters = worker.join(30, timeout=slack(30.0))
    assert counters["jobs_succeeded"] == 30 and len(starts) == 30
    # The k-th start comes k intervals (25 ms) after the first reservation at the earliest; 20 ms of
    # allowance is for the clock the hub's timers read.
    assert all(start - sent >= k * 0.025 - 0.02 for k, start in enumerate(sorted(starts))), [s - sent for s in starts]
    assert max(starts) - sent >= 29 * 0.025 - 0.02


def test_a_confirmed_job_over_the_rate_waits_pending_while_other_tasks_run(zq_inprocess, tmp_path):
    worker = zq_inprocess(registry, concurrency=1, state_dir=str(tmp_path))
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        first = client.enqueue_with_options("rare", args=("a",), confirm=True)
        second = client.enqueue_with_options("rare", args=("b",), confirm=True)
        assert first.result(timeout=slack(10.0)) == "a"
        assert client.enqueue_with_options("add", args=(1, 1), confirm=True).result(timeout=slack(10.0)) == 2
        assert client.call("zqsync.stats")["rate_limited"] == {"rare": 1}
        assert second.status().state == "pending"
    assert seen == ["a", "add 1 1"]


def test_a_yielding_task_sees_its_soft_limit_and_cleans_up(zq_inprocess):
    worker = zq_inprocess(registry)
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        started = time.monotonic()
        assert client.call("tidy", 30.0) == "cleaned up"
        assert time.monotonic() - started < slack(5.0)
        assert client.call("tidy", 0.0) == "finished"
        with pytest.raises(zqsync.SoftTimeLimitExceeded, match="soft time limit of 0.1 s"):
            client.call("careless", 30.0)
        client.enqueue("careless", 30.0)
        assert worker.join(1, timeout=slack(10.0))["jobs_failed"] == 1


def test_the_hard_limit_still_ends_a_task_that_cleans_up_too_long(zq_inprocess):
    worker = zq_inprocess(registry)
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        with pytest.raises(zqsync.TimeLimitExceeded, match="time limit of 0.4 s"):
            client.call("stubborn", 30.0)
    assert seen == ["soft limit seen"]


def test_a_confirmed_job_not_started_by_its_expiry_never_runs_and_says_so(zq_inprocess, tmp_path):
    worker = zq_inprocess(registry, concurrency=1, state_dir=str(tmp_path))
    in_a_moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=0.1)
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        client.enqueue_with_options("hold", args=(0.5,), confirm=True)  # holds the only slot past both expiries
        by_seconds = client.enqueue_with_options("add", args=(1, 2), confirm=True, expires=0.1)
        by_date = client.enqueue_with_options("add", args=(3, 4), confirm=True, expires=in_a_moment)
        for job in (by_seconds, by_date):
            with pytest.raises(zqsync.JobExpired, match="expired before it started"):
                job.result(timeout=slack(10.0))
            assert job.status().state == "expired"
        listed = client.call("zqsync.jobs", "expired")
        assert sorted(row["id"] for row in listed["rows"]) == sorted([by_seconds, by_date])
        assert client.call("zqsync.stats")["jobs_expired"] == 2
        assert client.call("zqsync.purge", ["expired"], 0.0) == 2
    assert seen == []


def test_a_plain_job_not_started_by_its_expiry_is_counted_not_run(zq_inprocess):
    worker = zq_inprocess(registry, concurrency=1)
    in_a_moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=0.1)
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue("rare", "a")  # the next turns of `rare` are a minute and more away
        client.enqueue_with_options("rare", args=("b",), expires=in_a_moment)
        client.enqueue_with_options("rare", args=("c",), deadline=0.1)  # the older name, seconds only
        counters = worker.wait(lambda counters: counters["jobs_expired"] == 2, timeout=slack(10.0))
        assert client.call("zqsync.stats")["rate_limited"] == {"rare": 0}
    assert counters["jobs_succeeded"] == 1 and seen == ["a"]
