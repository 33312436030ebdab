"""``zqsync worker --reload``: editing a task file restarts the worker, and the new code answers."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
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


def edit(path: Path, value: str) -> None:
    """Rewrite a task file the way a quick edit can: the same size, within the same second.

    Bytecode cached from the old text (``__pycache__``) then passes Python's
    check (source mtime in whole seconds, and size), so a restarted worker
    that read it would still run the old code.
    """
    before = path.stat()
    py_compile.compile(str(path))
    text = TASKS.format(value=value)
    assert len(text) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


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
        edit(package / "tasks.py", "v2")
        endpoint = wait_for(lambda: ready.exists() and ready.read_text().strip(), timeout=60,
                            what="the restarted worker")
        value, second_pid = ask(endpoint)
        assert value == "v2" and second_pid != first_pid
        assert not pid_alive(first_pid), "the old worker was stopped before the new one started"
        assert "reload: " in worker.output() and "tasks.py changed; restarting the worker" in worker.output()
    wait_for(lambda: not pid_alive(second_pid), what="the child to stop with the reloader")


def test_a_reload_dir_that_does_not_exist_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    result = subprocess.run([sys.executable, "-m", "zqsync", "worker", "zqsync.demo.tasks:registry", "--reload",
                             "--reload-dir", str(missing)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"--reload-dir: no such directory: {missing}" in result.stderr
