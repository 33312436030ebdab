"""The zqsync command, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.processes_only


def zqsync_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zqsync", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [[], ["worker"], ["call"], ["enqueue"], ["demo"]])
def test_help_explains_every_option(command):
    result = zqsync_cli(*command, "--help")
    assert result.returncode == 0
    options = [word for word in result.stdout.split() if word.startswith("--") and word != "--help"]
    for option in options:
        assert result.stdout.count(option) >= 1
    if command == ["worker"]:
        for option in ("--bind", "--concurrency", "--graceful-timeout", "--ready-file", "--log-level"):
            assert option in result.stdout


def test_call_parses_json_arguments_and_prints_json(zq_worker):
    worker = zq_worker()
    result = zqsync_cli("call", worker.endpoint, "echo", '{"a": [1, 2]}')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"a": [1, 2]}
    result = zqsync_cli("call", worker.endpoint, "add", "1", "2")
    assert json.loads(result.stdout) == 3


def test_arguments_that_are_not_json_are_passed_as_strings(zq_worker):
    worker = zq_worker()
    result = zqsync_cli("call", worker.endpoint, "echo", "hello world")
    assert json.loads(result.stdout) == "hello world"


def test_enqueue_prints_a_job_id_and_the_job_runs(zq_worker, tmp_path):
    worker = zq_worker()
    target = tmp_path / "line.txt"
    result = zqsync_cli("enqueue", worker.endpoint, "record", str(target), "from-cli")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == 32
    wait_for(lambda: target.exists() and target.read_text() == "from-cli\n", what="the job's line")


def test_remote_error_exits_non_zero_with_the_remote_type(zq_worker):
    worker = zq_worker()
    result = zqsync_cli("call", worker.endpoint, "fail", "nope")
    assert result.returncode == 1
    assert "RuntimeError: nope" in result.stderr


def test_call_to_an_absent_worker_times_out_with_a_clear_message():
    result = zqsync_cli("call", "tcp://127.0.0.1:9", "add", "1", "2", "--timeout", "0.3")
    assert result.returncode == 1
    assert "CallTimeout" in result.stderr


def test_worker_with_an_unimportable_module_says_so():
    result = zqsync_cli("worker", "no_such_module_here:registry", "--bind", "tcp://127.0.0.1:0")
    assert result.returncode != 0
    assert "cannot import 'no_such_module_here'" in result.stderr


def test_worker_with_a_non_registry_attribute_says_so():
    result = zqsync_cli("worker", "zqsync.demo.tasks:add", "--bind", "tcp://127.0.0.1:0")
    assert result.returncode != 0
    assert "not a zqsync.worker.Registry" in result.stderr


def test_bad_endpoint_is_a_clear_error_not_a_traceback():
    result = zqsync_cli("call", "localhost:5555", "add")
    assert result.returncode == 1
    assert "tcp://HOST:PORT" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["worker", "m:r"], ["call", "tcp://h:1", "t"], ["stats", "tcp://h:1"], ["bench"]])
def test_every_command_logs_at_info_unless_told_otherwise(command):
    """Regression: a subcommand's own default once leaked into every subcommand through the shared option."""
    from zqsync.cli import build_parser

    assert build_parser().parse_args(command).log_level == "info"
