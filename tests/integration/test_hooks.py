"""Middleware hooks and retry_on/max_delay/jitter, seen through a worker's hook calls.

The worker core runs in-process (``zq_inprocess``), and each test waits on its counters; only the
log lines' context, which needs the worker process's own log handlers, takes a worker process.
"""

import json

import pytest

from tests.helpers import slack, wait_for
from tests.integration import hook_tasks
from zqsync import Client
from zqsync.errors import RemoteError

TASKS = "tests.integration.hook_tasks:registry"
pytestmark = pytest.mark.timeout(90)


def _events(path, job_id=None):
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if job_id is None or row.get("job_id") == job_id]


def _hooks(path, job_id):
    return [(row["hook"], row["attempt"]) for row in _events(path, job_id) if row["hook"] != "reported"]


@pytest.fixture
def hooked(zq_inprocess, tmp_path, monkeypatch):
    log = tmp_path / "hooks.jsonl"
    monkeypatch.setenv("ZQSYNC_HOOK_LOG", str(log))
    worker = zq_inprocess(hook_tasks.registry, state_dir=str(tmp_path / "s"))
    client = Client(worker.endpoint)
    yield worker, client, log
    client.close()


def test_retry_on_covered_error_retries_with_every_hook_in_order(hooked):
    worker, client, log = hooked
    job_id = client.enqueue_with_options("flaky_io", args=["k1"], confirm=True)
    counters = worker.wait(lambda counters: counters["jobs_succeeded"] == 1, timeout=slack(20))
    assert counters["jobs_retried"] == 2
    assert _hooks(log, job_id) == [
        ("before_task", 1), ("on_failure", 1), ("after_task", 1), ("on_retry", 1),
        ("before_task", 2), ("on_failure", 2), ("after_task", 2), ("on_retry", 2),
        ("before_task", 3), ("after_task", 3),
    ]
    rows = _events(log, job_id)
    assert rows[-1]["result"] == 3 and rows[-1]["error"] is None
    assert {row["error"] for row in rows if row["hook"] == "on_failure"} == {"OSError"}
    assert [row["args"] for row in rows if row["hook"] == "before_task"] == [["k1"]] * 3
    reports = [row for row in _events(log) if row["hook"] == "reported" and row["job_id"] == job_id]
    assert [(r["event"], r["attempt"], r["error"]) for r in reports] == [("failure", 1, "OSError"), ("failure", 2, "OSError")]


def test_error_outside_retry_on_is_dead_lettered_at_once(hooked):
    worker, client, log = hooked
    job_id = client.enqueue_with_options("wrong_kind", args=["k2"], confirm=True)
    counters = worker.wait(lambda counters: counters["jobs_failed"] == 1, timeout=slack(20))
    assert _hooks(log, job_id) == [("before_task", 1), ("on_failure", 1), ("after_task", 1), ("on_dead_letter", 1)]
    reports = [(r["event"], r["error"]) for r in _events(log) if r["hook"] == "reported" and r["job_id"] == job_id]
    assert reports == [("failure", "ValueError"), ("dead_letter", "ValueError")]
    assert counters["jobs_retried"] == 0 and counters["jobs_dead"] == 1


def test_max_delay_caps_the_backoff_and_jitter_spreads_it(hooked):
    worker, client, log = hooked
    job_ids = [client.enqueue_with_options("capped", args=[f"c{n}"], confirm=True) for n in range(3)]
    # Uncapped, the backoff would be 30 + 60 + 120 s: the dead letters come within seconds only through max_delay.
    worker.wait(lambda counters: counters["jobs_dead"] == 3, timeout=slack(20))
    assert all(_hooks(log, job_id)[-1] == ("on_dead_letter", 4) for job_id in job_ids)
    delays = [row["delay"] for row in _events(log) if row["hook"] == "on_retry"]
    assert len(delays) == 9
    assert all(0.1 <= delay <= 0.2 for delay in delays), delays
    assert len(set(delays)) > 1, "jitter drew the same delay every time"


def test_call_failure_passes_failure_hooks_but_never_retry_hooks(hooked):
    worker, client, log = hooked
    with pytest.raises(RemoteError, match="boom"):
        client.call("explode")
    rows = [row for row in _events(log) if row.get("task") == "explode"]
    assert [(row["hook"], row.get("kind"), row.get("error")) for row in rows] == [
        ("before_task", "call", None), ("on_failure", None, "KeyError"), ("reported", "call", "KeyError"),
        ("after_task", None, "KeyError"),
    ]


def test_a_raising_hook_is_counted_and_logged_and_the_task_still_runs(hooked, caplog):
    worker, client, log = hooked
    with pytest.raises(RemoteError, match="boom"):  # the task's own error: it ran after the broken hook
        client.call("explode")
    assert client.call("zqsync.stats")["hook_errors"] == 1
    assert "Broken.before_task raised around task 'explode'" in caplog.text  # logged before the reply was sent
    assert "RuntimeError: a broken hook" in caplog.text


def test_logging_context_tags_the_task_s_log_lines(zq_worker, tmp_path):
    """The context in the formatted lines of the worker process's own log handlers."""
    worker = zq_worker(TASKS, env={"ZQSYNC_HOOK_LOG": str(tmp_path / "hooks.jsonl")},
                       extra_args=["--state-dir", str(tmp_path / "s")])
    with Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("flaky_io", args=["k4"], confirm=True)
    for attempt in (1, 2, 3):
        wait_for(lambda attempt=attempt: f"[flaky_io {job_id} #{attempt}]: flaky_io attempt" in worker.output(),
                 what=f"attempt {attempt}'s log line with its context")
