"""`zqsync beat` on the command line: listed in the help, and clear about what it cannot run."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes_only


def zqsync(*args):
    return subprocess.run([sys.executable, "-m", "zqsync", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_beat_and_beat_help_names_its_arguments():
    assert "beat" in zqsync("--help").stdout
    usage = " ".join(zqsync("beat", "--help").stdout.split())  # help wraps at the terminal width
    assert "MODULE[:ATTR]" in usage and "ENDPOINT" in usage and "same endpoints" in usage


def test_a_registry_without_periodic_tasks_or_a_missing_module_fails_clearly():
    result = zqsync("beat", "zqsync.demo.tasks", "tcp://127.0.0.1:5555")
    assert result.returncode == 1 and "zqsync beat: ConfigurationError: no periodic tasks" in result.stderr
    result = zqsync("beat", "no_such_module_here", "tcp://127.0.0.1:5555")
    assert result.returncode == 1 and "zqsync beat: cannot import 'no_such_module_here'" in result.stderr
