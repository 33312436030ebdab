"""Job handles: client.job and client.result for confirmed jobs (the journal) and plain jobs kept on
request (the worker's memory), found on whichever worker holds them.

One worker's answers come from the in-process worker core (``zq_inprocess``); finding a job on
another worker, and a stop under a long-poll, take worker processes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for
from tests.integration import job_tasks
from zqsync.client.jobs import Job
from zqsync.client.rendezvous import rank
from zqsync.wire.endpoints import split_endpoint

TASKS = "tests.integration.job_tasks:registry"


@pytest.fixture
def journaled(zq_inprocess, tmp_path):
    return zq_inprocess(job_tasks.registry, state_dir=str(tmp_path / "state"))


@pytest.mark.timeout(60)
def test_a_confirmed_job_reports_its_result_attempts_timestamps_and_worker(journaled, tmp_path):
    with zqsync.Client(journaled.endpoint) as client:
        before = time.time()
        job_id = client.enqueue_with_options("slow", args=(str(tmp_path / "out"), "a", 0.5), confirm=True)
        assert client.job(job_id).state in ("pending", "running")
        assert client.result(job_id, timeout=slack(20)) == "a"
        status = client.job(job_id)
    assert (status.state, status.task, status.attempts, status.result, status.error) == ("done", "slow", 1, "a", None)
    assert before <= status.enqueued_at <= status.started_at <= status.finished_at <= time.time()
    assert status.finished_at - status.started_at >= 0.5
    assert (status.worker, status.pid) == (journaled.endpoint, journaled.pid)


@pytest.mark.timeout(60)
def test_a_failed_confirmed_job_raises_its_error_from_result(journaled):
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("boom", args=("no luck",), confirm=True)
        with pytest.raises(zqsync.RemoteError) as raised:
            client.result(job_id, timeout=slack(20))
        status = client.job(job_id)
    assert (raised.value.remote_type, raised.value.remote_message) == ("ValueError", "no luck")
    assert (status.state, status.attempts, status.error.remote_type) == ("failed", 1, "ValueError")


@pytest.mark.timeout(60)
def test_result_waits_on_a_long_poll_and_answers_when_the_job_finishes(journaled, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("slow", args=(str(out), "b", 2.0), confirm=True)
        journaled.wait(lambda counters: counters["in_flight"] == 1)  # it started
        with pytest.raises(zqsync.CallTimeout):
            client.result(job_id, timeout=0.5)
        requests: list[str] = []
        send = client._call_at
        monkeypatch.setattr(client, "_call_at", lambda name, *rest, **kw: requests.append(name) or send(name, *rest, **kw))
        started = time.monotonic()
        assert client.result(job_id, timeout=slack(20)) == "b"
        waited = time.monotonic() - started
    assert 0.5 < waited < slack(10)
    assert requests == ["zqsync.job", "zqsync.result"], "one look-up, then one long-poll answered at the finish"


@pytest.mark.timeout(60)
def test_an_unknown_id_and_a_plain_job_not_kept_are_unknown(journaled, tmp_path):
    with zqsync.Client(journaled.endpoint) as client:
        plain = client.enqueue("stamp", str(tmp_path / "out"), "p")
        journaled.join(1)  # it ran
        for job_id in (plain, "never-sent"):
            status = client.job(job_id)
            assert (status.state, status.worker, status.unanswered, status.finished) == ("unknown", None, (), False)
        started = time.monotonic()
        with pytest.raises(zqsync.JobNotFound, match="never-sent"):
            client.result("never-sent", timeout=30)
        assert time.monotonic() - started < 15, "it waited for the timeout instead of answering at once"


@pytest.mark.timeout(60)
def test_a_job_handle_is_waited_for_while_its_plain_job_is_on_its_way(journaled, tmp_path):
    """An id this client returned may not have reached a worker yet: ``result`` waits for it (and a
    plain job whose status is not kept is waited for until the timeout)."""
    with zqsync.Client(journaled.endpoint) as client:
        kept = client.enqueue_with_options("add", args=(2, 3), store_result=True)
        assert isinstance(kept, Job) and client.result(kept, timeout=slack(20)) == 5
        for handle in (Job("sent-by-this-client", client), client.enqueue("stamp", str(tmp_path / "out"), "q")):
            with pytest.raises(zqsync.CallTimeout):
                client.result(handle, timeout=1.0)


@pytest.mark.timeout(90)
def test_a_job_held_by_a_worker_other_than_the_preferred_one_is_found_there(zq_worker, tmp_path):
    preferred, other = zq_worker(TASKS), zq_worker(TASKS)
    endpoints = [preferred.endpoint, other.endpoint]
    rpc = {split_endpoint(endpoint)[1]: endpoint for endpoint in endpoints}
    ids = [job_id for job_id in (f"kept-{index}" for index in range(40))
           if rpc[rank(job_id, list(rpc))[0]] == preferred.endpoint][:5]
    assert len(ids) == 5
    with zqsync.Client(other.endpoint) as sender:  # only the other worker gets them
        for index, job_id in enumerate(ids):  # the task has store_result=True
            sender.enqueue_with_options("whoami", args=(index,), job_id=job_id)
        asked = sender.enqueue_with_options("add", args=(2, 3), store_result=True)
    with zqsync.Client(endpoints) as client:
        # Plain ids from another client: result() says JobNotFound for one not read by its worker yet.
        wait_for(lambda: all(client.job(job_id).state != "unknown" for job_id in ids), what="the jobs to arrive")
        results = [client.result(job_id, timeout=slack(20)) for job_id in ids]
        assert client.result(asked, timeout=slack(20)) == 5
        statuses = [client.job(job_id) for job_id in ids]
    assert results == [[index, other.pid] for index in range(len(ids))]
    assert {(status.state, status.worker, status.pid) for status in statuses} == {("done", other.endpoint, other.pid)}


@pytest.mark.timeout(90)
def test_the_cli_enqueues_a_delayed_job_and_waits_for_its_result(journaled, tmp_path):
    def zqsync_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zqsync", *args], capture_output=True, text=True, timeout=60)

    sent = zqsync_cli("enqueue", journaled.endpoint, "add", "2", "5", "--delay", "0.5")
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip()
    waited = zqsync_cli("job", journaled.endpoint, job_id, "--wait", str(slack(20)))
    assert (waited.returncode, waited.stdout.strip()) == (0, "7"), waited.stderr
    shown = zqsync_cli("job", journaled.endpoint, job_id)
    status = json.loads(shown.stdout)
    assert (status["state"], status["result"], status["attempts"], status["worker"]) == ("done", 7, 1, journaled.endpoint)
    assert zqsync_cli("job", journaled.endpoint, "never-sent").returncode == 1


@pytest.mark.timeout(90)
def test_a_waiting_long_poll_does_not_hold_up_a_worker_stop(zq_worker, tmp_path, monkeypatch):
    out = tmp_path / "out"
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(tmp_path / "state"), "--graceful-timeout", "1"])
    outcome: list = []
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("slow", args=(str(out), "w", 60.0), confirm=True)
        wait_for(lambda: out.exists(), what="the job to start")
        waiter = _long_poll(client, monkeypatch, lambda: outcome.append(_raised(client.result, job_id,
                                                                                timeout=slack(8))))
        started = time.monotonic()
        worker.stop(timeout=slack(30))
        stopped_in = time.monotonic() - started
        waiter.join(timeout=slack(60))
    print(f"worker stop with a long-poll waiting: {stopped_in:.2f} s")
    assert stopped_in < slack(4), f"the stop took {stopped_in:.1f} s (1 s of grace for the task)"
    assert outcome and isinstance(outcome[0], zqsync.ZqsyncError), outcome


@pytest.mark.timeout(120)
def test_a_waiting_result_survives_a_worker_restart_and_keeps_to_its_timeout(zq_worker, tmp_path, monkeypatch):
    out, state = tmp_path / "out", str(tmp_path / "state")
    worker = zq_worker(TASKS, extra_args=["--state-dir", state])
    outcome: list = []
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("slow", args=(str(out), "again", 1.0), confirm=True)
        wait_for(lambda: out.exists(), what="the job to start")
        waiter = _long_poll(client, monkeypatch, lambda: outcome.append(client.result(job_id, timeout=slack(40))))
        worker.stop(sig=signal.SIGKILL)
        zq_worker(TASKS, bind=worker.endpoint, extra_args=["--state-dir", state])  # the journal runs it again
        waiter.join(timeout=slack(60))
        assert outcome == ["again"], "the waiter followed the job to the restarted worker"
        other = client.enqueue_with_options("slow", args=(str(out), "never", 60.0), confirm=True)
        started = time.monotonic()
        with pytest.raises(zqsync.CallTimeout):
            client.result(other, timeout=2.0)
        took = time.monotonic() - started
    assert 2.0 <= took < 2.0 + slack(1.0), f"result(timeout=2.0) took {took:.2f} s"


def _long_poll(client: zqsync.Client, monkeypatch, wait) -> threading.Thread:
    """Start ``wait`` (a ``client.result``) in a thread; return it once its long-poll was sent."""
    sent: list[str] = []
    send = client._call_at
    monkeypatch.setattr(client, "_call_at", lambda name, *rest, **kw: sent.append(name) or send(name, *rest, **kw))
    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: "zqsync.result" in sent, what="the long-poll to be sent")
    return waiter


def _raised(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the test looks at what was raised
        return exc
    return None


def test_an_admin_call_refused_by_a_worker_without_a_journal_names_its_error_once(zq_worker):
    worker = zq_worker(TASKS)
    with zqsync.Client(worker.endpoint) as client, pytest.raises(zqsync.NoJournal) as refused:
        client.call("zqsync.jobs", "dead", 0, 10)
    assert str(refused.value).splitlines()[0] == (
        "NoJournal: this worker keeps no journal: start it with --state-dir DIR or --journal URL")


# -- results that cannot go back over the wire ----------------------------------------------------

OVER_THE_LIMIT = 17 * 1024 * 1024  # bytes: past the 16 MiB message limit


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["confirmed", "plain, kept"])
def test_a_result_that_cannot_be_encoded_fails_the_job_with_an_error_naming_its_type(journaled, how):
    with zqsync.Client(journaled.endpoint) as client:
        options = {"confirm": True} if how == "confirmed" else {"store_result": True}
        job_id = client.enqueue_with_options("huge_int", **options)
        with pytest.raises(zqsync.RemoteError) as raised:
            client.result(job_id, timeout=slack(20))
        status = client.job(job_id)
    assert raised.value.remote_type == "TypeError"
    assert "'huge_int' returned a value that cannot be sent back" in raised.value.remote_message
    assert "int" in raised.value.remote_message and "64-bit" in raised.value.remote_message
    assert (status.state, status.error.remote_type) == ("failed", "TypeError")
    counters = journaled.join(1)
    assert (counters["jobs_failed"], counters["jobs_succeeded"]) == (1, 0)


@pytest.mark.timeout(90)
def test_a_result_over_the_message_limit_fails_the_job_and_its_id_still_answers(journaled):
    with zqsync.Client(journaled.endpoint) as client:
        job_id = client.enqueue_with_options("blob", args=(OVER_THE_LIMIT,), confirm=True)
        with pytest.raises(zqsync.RemoteError) as raised:
            client.result(job_id, timeout=slack(30))
        assert "over the" in raised.value.remote_message and "byte limit" in raised.value.remote_message
        assert client.job(job_id).state == "failed"
        assert client.cancel(job_id).state == "failed"  # too late to cancel: it answers with the state
        with pytest.raises(zqsync.RemoteError) as called:
            client.call("blob", OVER_THE_LIMIT)
        assert "byte limit" in called.value.remote_message
        assert client.call("blob", 3) == b"xxx"
