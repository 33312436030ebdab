"""Task handles: ``@registry.task`` returns a callable, typed handle that enqueues and calls itself."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import textwrap

import pytest

import zqsync
from tests.helpers import slack
from tests.integration import job_tasks
from zqsync.client import client as client_module
from zqsync.client.jobs import Job
from zqsync.worker.handles import TaskHandle

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def worker(zq_inprocess, tmp_path):
    return zq_inprocess(job_tasks.registry, state_dir=str(tmp_path / "state"))


def test_a_handle_runs_here_when_called_and_on_the_worker_when_sent(worker):
    add = job_tasks.add
    assert isinstance(add, TaskHandle) and add.name == "add" and add.task is job_tasks.registry.get("add")
    assert add(2, 3) == 5 and add.__name__ == "add"  # still the function
    with zqsync.Client(worker.endpoint) as client:
        remote = add.using(client)
        assert remote.call(20, 22) == 42
        job = remote.enqueue_with_options(args=(1, 2), confirm=True)
        assert isinstance(job, Job) and isinstance(job, str) and len(job) == 32
        assert job.result(timeout=slack(20)) == 3
        assert job.status().state == "done" and job.cancel().state == "done"
        plain = remote.enqueue(5, 5)
        assert plain.client is client
        assert remote.call_with_options(args=(1, 1), timeout=slack(10)) == 2
    counters = worker.join(2)
    assert counters["jobs_succeeded"] == 2 and counters["calls_succeeded"] == 2


def test_a_handle_sends_through_the_default_client(worker, monkeypatch):
    monkeypatch.setenv("ZQSYNC_ENDPOINT", worker.endpoint)
    monkeypatch.setattr(client_module, "_default", None)
    try:
        assert job_tasks.add.call(1, 2) == 3
        assert job_tasks.whoami.enqueue("me").result(timeout=slack(20))[0] == "me"
    finally:
        client_module.default_client().close()


def test_handles_and_job_ids_pickle_as_what_they_stand_for():
    assert pickle.loads(pickle.dumps(job_tasks.add)) is job_tasks.add
    job = Job("ab" * 16, zqsync.Client("tcp://127.0.0.1:9"))
    assert type(pickle.loads(pickle.dumps(job))) is str and pickle.loads(pickle.dumps(job)) == job
    job.client.close()


def test_a_type_checker_checks_a_handles_arguments_and_result(tmp_path):
    pytest.importorskip("mypy")
    module = tmp_path / "user_tasks.py"
    module.write_text(textwrap.dedent("""
        from zqsync.worker import Registry

        registry = Registry()

        @registry.task(retries=2)
        def add(a: int, b: int) -> int:
            return a + b

        reveal_type(add.call(1, 2))
        reveal_type(add.enqueue(1, 2).result())
        add.enqueue("one", 2)
        add.call(1)
    """))
    # --follow-imports=silent: as for an installed zqsync, only the user module's own errors are reported.
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                             "--follow-imports=silent", str(module)],
                            capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert all(re.search(r'Revealed type is "(builtins\.)?int"', line) for line in lines[:2]), lines
    assert any('Argument 1 to "enqueue" of "TaskHandle" has incompatible type "str"' in line for line in lines), lines
    assert any('Missing positional argument "b" in call to "call" of "TaskHandle"' in line for line in lines), lines
    assert "Found 2 errors" in lines[-1], lines
