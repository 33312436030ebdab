"""Eager mode runs tasks in-process with the wire's encoding, and restores the real client afterwards."""

from __future__ import annotations

import pytest

import zqsync
from tests.helpers import slack
from zqsync.testing import eager
from zqsync.worker import Registry

registry = Registry()
ran: list[tuple] = []


@registry.task
def add(a, b):
    ran.append(("add", a, b))
    return a + b


@registry.task(retries=2)
def flaky(key):
    ran.append(("flaky", key))
    if len([item for item in ran if item == ("flaky", key)]) < 3:
        raise RuntimeError("not yet")
    return "ok"


@registry.task
def broken():
    raise ValueError("always")


@pytest.fixture(autouse=True)
def fresh():
    ran.clear()
    # An endpoint where nothing listens: any real send would time out, not succeed.
    with zqsync.Client("tcp://127.0.0.1:9", call_timeout=0.2, send_timeout=0.2) as client:
        yield client


def test_enqueue_and_call_run_the_task_in_process(fresh):
    with eager(registry) as recorder:
        job_id = fresh.enqueue("add", 2, 3)
        assert fresh.call("add", 4, 5) == 9
    assert ran == [("add", 2, 3), ("add", 4, 5)]
    assert recorder.jobs == [(job_id, "add", True, 5, 1)]


def test_confirmed_jobs_run_with_their_retries(fresh):
    with eager(registry) as recorder:
        fresh.enqueue_with_options("flaky", args=("k",), confirm=True)
    assert recorder.jobs[0].ok and recorder.jobs[0].attempts == 3


def test_a_failing_call_raises_what_a_worker_reply_would(fresh):
    with eager(registry), pytest.raises(zqsync.RemoteError) as raised:
        fresh.call("broken")
    assert raised.value.remote_type == "ValueError" and "always" in raised.value.remote_message
    with eager(registry), pytest.raises(zqsync.UnknownTask):
        fresh.call("nosuch")


def test_a_failing_job_is_recorded_or_raised_when_asked(fresh):
    with eager(registry) as recorder:
        fresh.enqueue("broken")
    assert [job.value[0] for job in recorder.failed()] == ["ValueError"]
    with eager(registry, propagate=True), pytest.raises(zqsync.RemoteError, match="always"):
        fresh.enqueue("broken")


def test_what_the_wire_refuses_fails_in_eager_mode_too(fresh):
    with eager(registry), pytest.raises(zqsync.ProtocolError):
        fresh.call("add", {1, 2}, 3)  # msgpack has no set
    assert ran == []


def test_results_come_back_as_msgpack_decodes_them(fresh):
    with eager(registry):
        assert fresh.call("add", (1,), (2,)) == [1, 2]  # tuples travel as lists


def test_the_real_client_is_back_after_the_block(fresh):
    with eager(registry):
        pass
    with pytest.raises(zqsync.CallTimeout):
        fresh.call("add", 1, 2)


@registry.task
def huge():
    return 2**70


def test_job_result_and_cancel_answer_from_the_block_as_a_worker_would(fresh):
    with eager(registry):
        confirmed = fresh.enqueue_with_options("add", args=(1, 2), confirm=True)
        kept = fresh.enqueue_with_options("add", args=(3, 4), store_result=True)
        plain = fresh.enqueue("add", 5, 6)
        assert confirmed.result() == 3 and fresh.result(kept) == 7
        status = fresh.job(confirmed)
        assert (status.state, status.task, status.attempts, status.worker) == ("done", "add", 1, fresh.endpoints[0])
        assert fresh.cancel(confirmed).state == "done"
        assert fresh.job(plain).state == "unknown"  # nobody asked to keep it
    assert fresh.stats()["jobs"]["opened"] == 0 and fresh.stats()["dealer"]["opened"] == 0, "no socket opened"


def test_the_clients_own_checks_hold_in_eager_mode(fresh):
    import datetime

    with eager(registry):
        with pytest.raises(zqsync.ConfigurationError, match="aware datetime"):
            fresh.enqueue_with_options("add", args=(1, 2), confirm=True, expires=datetime.datetime(2030, 1, 1))
        with pytest.raises(zqsync.ConfigurationError, match="eta"):
            fresh.enqueue_with_options("add", args=(1, 2), eta=datetime.datetime(2030, 1, 1))
        with pytest.raises(zqsync.ConfigurationError, match="send_timeout"):
            fresh.enqueue_with_options("add", args=(1, 2), send_timeout=-1)
    assert ran == []


def test_a_delayed_job_waits_for_the_recorders_clock_and_can_be_cancelled(fresh):
    with eager(registry) as recorder:
        later = fresh.enqueue_with_options("add", args=(1, 1), delay=3600)
        never = fresh.enqueue_with_options("add", args=(2, 2), delay=3600)
        assert ran == [] and fresh.job(later).state == "scheduled"
        assert fresh.cancel(never).state == "cancelled"
        assert recorder.advance(3599) == []
        assert [job.id for job in recorder.advance(1)] == [later]
        assert fresh.result(later) == 2 and fresh.job(never).state == "cancelled"
    assert ran == [("add", 1, 1)]


def test_unknown_tasks_and_unencodable_results_go_as_on_a_worker(fresh):
    with eager(registry) as recorder:
        fresh.enqueue("nosuch")  # a worker drops it (and logs it): no error for the sender
        with pytest.raises(zqsync.UnknownTask):
            fresh.enqueue_with_options("nosuch", confirm=True)  # a worker refuses to journal it
        job_id = fresh.enqueue_with_options("huge", confirm=True)
        with pytest.raises(zqsync.RemoteError, match="64-bit") as raised:
            fresh.result(job_id)
    assert raised.value.remote_type == "TypeError"
    assert [(job.task, job.value[0]) for job in recorder.failed()] == [("nosuch", "UnknownTask"), ("huge", "TypeError")]


@registry.task(time_limit=0.3)
def spin(seconds):
    """A pure-Python loop that never yields: only a thread outside it can stop it."""
    import time

    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass
    return "spun"


@registry.task(time_limit=2.0, soft_time_limit=0.2)
def spin_and_clean_up(seconds):
    import time

    until = time.monotonic() + seconds
    try:
        while time.monotonic() < until:
            pass
    except zqsync.SoftTimeLimitExceeded:
        ran.append(("cleaned up",))
        raise
    return "spun"


def test_time_limits_hold_in_eager_mode_for_code_that_never_yields(fresh):
    """A worker ends a task that holds the GIL past its limit (its watchdog); eager mode stops it too,
    from a native thread, with the same error, and the caller's code after the task is not touched."""
    import time

    with eager(registry):
        started = time.monotonic()
        with pytest.raises(zqsync.TimeLimitExceeded):
            fresh.call_with_options("spin", args=(5.0,), timeout=10.0)
        took = time.monotonic() - started
        with pytest.raises(zqsync.SoftTimeLimitExceeded):
            fresh.call_with_options("spin_and_clean_up", args=(5.0,), timeout=10.0)
        # the client's 0.2 s call timeout is for the endpoint where nothing listens; a 0.05 s loop on a
        # loaded machine can take longer than that in wall time
        assert fresh.call_with_options("spin", args=(0.05,), timeout=slack(2.0)) == "spun"
        spun_after = time.monotonic()
        while time.monotonic() < spun_after + 0.5:  # past the limit of the call that returned: no late error
            pass
    assert took < slack(2.0), f"the 0.3 s limit stopped a 5 s loop only after {took:.2f} s"
    assert ran == [("cleaned up",)]


def test_eager_time_limits_stop_the_task_in_the_thread_that_runs_it(fresh):
    import threading

    outcome = []

    def in_a_thread():
        try:
            fresh.call_with_options("spin", args=(5.0,), timeout=10.0)
        except zqsync.TimeLimitExceeded as exc:
            outcome.append(type(exc).__name__)

    with eager(registry):
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join(timeout=10)
    assert outcome == ["TimeLimitExceeded"] and not thread.is_alive()


@registry.task
def nap(seconds):
    import time

    time.sleep(seconds)
    return "rested"


def test_a_call_that_outlasts_its_timeout_raises_call_timeout_as_a_real_client_would(fresh):
    """A real caller gives up at its deadline while the worker finishes the task: the task runs here
    too (eager mode has no second process to leave it to), and then the caller sees ``CallTimeout``."""
    with eager(registry):
        with pytest.raises(zqsync.CallTimeout):
            fresh.call_with_options("nap", args=(0.3,), timeout=0.1)
        assert fresh.call_with_options("nap", args=(0.0,), timeout=5.0) == "rested"
