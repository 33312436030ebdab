"""``zqsync worker --reload``: editing a task file restarts the worker, and the new code answers."""

from __future__ import annotations

from pathlib import Path

import pytest

import zqsync
from tests.helpers import wait_for
from zqsync._common import pid_alive
from zqsync.processes import WorkerProcess

TASKS = """\
from zqsync.worker import Registry

registry = Registry()


@registry.task
def answer():
    return {value!r}
"""


def ask(endpoint: str) -> tuple[str, int]:
    with zqsync.Client(endpoint, call_timeout=30.0) as client:
        return client.call("answer"), client.call("zqsync.stats")["pid"]


@pytest.mark.timeout(120)
def test_editing_a_task_file_restarts_the_worker_with_the_new_code(tmp_path):
    package = tmp_path / "reloadapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(TASKS.format(value="v1"))
    with WorkerProcess("reloadapp.tasks", cwd=str(tmp_path), extra_args=["--reload"]) as worker:
        ready = Path(worker._dir) / "ready"
        value, first_pid = ask(worker.endpoint)
        assert value == "v1" and first_pid != worker.pid, "the reloader serves from a child"
        ready.unlink()
        (package / "tasks.py").write_text(TASKS.format(value="v2"))
        endpoint = wait_for(lambda: ready.exists() and ready.read_text().strip(), timeout=60,
                            what="the restarted worker")
        value, second_pid = ask(endpoint)
        assert value == "v2" and second_pid != first_pid
        assert not pid_alive(first_pid), "the old worker was stopped before the new one started"
        assert "reload: " in worker.output() and "tasks.py changed; restarting the worker" in worker.output()
    wait_for(lambda: not pid_alive(second_pid), what="the child to stop with the reloader")
