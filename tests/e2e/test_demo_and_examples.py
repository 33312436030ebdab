"""The README's main job and the shipped examples, run as a newcomer would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes_only


def test_zqsync_demo_exits_zero_and_shows_reuse(root):
    result = subprocess.run(
        [sys.executable, "-m", "zqsync", "demo", "--requests", "300", "--concurrency", "20"],
        cwd=root, capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "300 enqueued, 300 executed" in result.stdout
    assert "300 ok" in result.stdout
    assert result.stdout.count("DEALER identities") >= 1  # one line per gunicorn process that served
    assert "result: OK" in result.stdout
    assert "\r" not in result.stderr, "a progress bar redrew into a log (stderr is not a terminal)"


def test_sync_script_runs_without_importing_gevent(zq_worker, root):
    worker = zq_worker()
    code = (
        "import runpy, sys; sys.argv = ['sync_script.py', sys.argv[1]];"
        "runpy.run_path('examples/sync_script.py', run_name='__main__');"
        "assert 'gevent' not in sys.modules, 'plain sync use imported gevent'"
    )
    result = subprocess.run([sys.executable, "-c", code, worker.endpoint], cwd=root, capture_output=True,
                            text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "ZQSYNC_TEST_MONKEY"})
    assert result.returncode == 0, result.stderr
    assert "add(2, 3) = 5" in result.stdout
    assert "sockets opened: 1 job DEALER, 1 call DEALER for 100 jobs and 3 calls" in result.stdout


def test_fork_safety_example_passes_as_a_user_would_run_it(root):
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/test_fork_safety.py"],
                            cwd=root, capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
