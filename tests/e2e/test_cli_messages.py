"""The messages a newcomer meets on the command line, run as real subprocesses against a real worker."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest

import zqsync
from tests.helpers import wait_for

pytestmark = pytest.mark.processes_only


def zqsync_cli(*args: str, cwd: str | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zqsync", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_version(flag):
    result = zqsync_cli(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"zqsync {zqsync.__version__}\n"


def test_unknown_task_error_names_its_type_once(zq_worker):
    worker = zq_worker()
    result = zqsync_cli("call", worker.endpoint, "nosuch")
    assert result.returncode == 1
    assert result.stderr.startswith("zqsync call: UnknownTask: no task named 'nosuch' is registered"), result.stderr
    assert result.stderr.count("UnknownTask") == 1, result.stderr


def test_a_task_error_keeps_both_the_local_and_the_remote_type(zq_worker):
    worker = zq_worker()
    result = zqsync_cli("call", worker.endpoint, "fail", "nope")
    assert result.returncode == 1
    assert result.stderr.startswith("zqsync call: RemoteError: RuntimeError: nope"), result.stderr


def test_worker_with_a_missing_attribute_says_the_module_has_no_such_attribute(tmp_path):
    (tmp_path / "mytasks.py").write_text("from zqsync.worker import Registry\nregistry = Registry()\n")
    result = zqsync_cli("worker", "mytasks:nosuch", "--bind", "tcp://127.0.0.1:0", cwd=str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == "zqsync worker: module 'mytasks' has no attribute 'nosuch'"


def test_enqueue_confirm_fails_for_an_unknown_task_and_succeeds_for_a_known_one(zq_worker, tmp_path):
    worker = zq_worker(extra_args=["--state-dir", str(tmp_path / "state")])
    unknown = zqsync_cli("enqueue", worker.endpoint, "nosuch", "--confirm")
    assert unknown.returncode == 1
    assert unknown.stdout == ""
    assert unknown.stderr.startswith("zqsync enqueue: UnknownTask: no task named 'nosuch'"), unknown.stderr

    target = tmp_path / "line.txt"
    known = zqsync_cli("enqueue", worker.endpoint, "record", str(target), "confirmed", "--confirm")
    assert known.returncode == 0, known.stderr
    assert len(known.stdout.strip()) == 32
    assert worker.stats()["confirmed_received"] == 1
    wait_for(lambda: target.exists() and target.read_text() == "confirmed\n", what="the confirmed job's line")


def test_plain_enqueue_of_an_unknown_task_exits_0_and_the_worker_counts_the_drop(zq_worker):
    worker = zq_worker()
    result = zqsync_cli("enqueue", worker.endpoint, "nosuch")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: worker.stats()["unknown_task"] == 1, what="the worker's unknown_task count")
    help_text = " ".join(zqsync_cli("enqueue", "--help").stdout.split())
    assert "a worker that has no task of that name drops the job" in help_text


def test_call_and_enqueue_have_their_own_timeout_help():
    call_help = " ".join(zqsync_cli("call", "--help").stdout.split())
    enqueue_help = " ".join(zqsync_cli("enqueue", "--help").stdout.split())
    assert "--timeout TIMEOUT seconds to wait for the task's result (default: ZQSYNC_CALL_TIMEOUT, 10)" in call_help
    assert "--timeout TIMEOUT seconds to wait for the worker to take the job (default: ZQSYNC_SEND_TIMEOUT, 1)" \
        in enqueue_help
    assert "--confirm" in enqueue_help and "--confirm" not in call_help


@pytest.mark.parametrize("how", ["standalone", "prefork", "router", "named queue"])
def test_a_worker_on_a_port_in_use_says_so_in_one_line(how):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        free = "tcp://127.0.0.1:0"
        args = {"standalone": ["--bind", busy], "prefork": ["--bind", busy, "--processes", "2"],
                "router": ["--bind", busy, "--processes", "2", "--router"],
                "named queue": ["--bind", free, "--queue", f"mail={busy}"]}[how]
        result = zqsync_cli("worker", "zqsync.demo.tasks:registry", *args)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"zqsync worker: ConfigurationError: cannot bind {busy}: Address already in use" in result.stderr


@pytest.mark.parametrize("command", ["worker", "worker --processes 2", "jobs"])
def test_a_state_dir_that_cannot_be_made_or_written_is_one_line_and_exit_1(tmp_path, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a file where the state directory's parent should be: makedirs fails, even as root
    state = str(blocker / "state")
    args = ["--state-dir", state] if command == "jobs" else ["zqsync.demo.tasks", "--bind", "tcp://127.0.0.1:0",
                                                              "--state-dir", state]
    result = zqsync_cli(*command.split(), *args, timeout=90)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    expected = f"no journal in '{state}'" if command == "jobs" else f"cannot open the journal in {state}"
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_journal_file_that_is_not_a_database_is_one_line_with_the_recover_command(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.sqlite3").write_bytes(b"not a database " * 100)
    result = zqsync_cli("worker", "zqsync.demo.tasks", "--bind", "tcp://127.0.0.1:0", "--state-dir", str(state))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"run `zqsync jobs recover --state-dir {state}`" in result.stderr, result.stderr


def test_the_bash_completion_script_completes_commands_and_their_options(tmp_path):
    pytest.importorskip("shtab", reason="shtab is not installed (the test extra has it)")
    if not shutil.which("bash"):
        pytest.skip("no bash")
    result = zqsync_cli("--print-completion", "bash")
    assert result.returncode == 0, result.stderr
    (tmp_path / "zqsync.bash").write_text(result.stdout)
    script = (f"source {tmp_path / 'zqsync.bash'}\n"
              "COMP_WORDS=(zqsync wor); COMP_CWORD=1; _shtab_zqsync; echo \"${COMPREPLY[*]}\"\n"
              "COMP_WORDS=(zqsync worker --proc); COMP_CWORD=2; _shtab_zqsync; echo \"${COMPREPLY[*]}\"\n")
    completed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert completed.stdout.split("\n")[:2] == ["worker", "--processes"], completed.stdout + completed.stderr


@pytest.mark.parametrize("how", ["worker metrics", "prefork metrics", "dashboard"])
def test_a_metrics_or_dashboard_port_in_use_is_one_line_and_exit_1(how):
    pytest.importorskip("prometheus_client" if "metrics" in how else "flask")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = ["worker", "zqsync.demo.tasks", "--bind", "tcp://127.0.0.1:0", "--metrics-port", str(port)]
        argv = {"worker metrics": worker, "prefork metrics": [*worker, "--processes", "2"],
                "dashboard": ["dashboard", "tcp://127.0.0.1:9", "--bind", f"127.0.0.1:{port}"]}[how]
        result = zqsync_cli(*argv)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr  # the INFO line on descriptors, and this


def test_a_malformed_bind_is_named_as_the_bind_option():
    result = zqsync_cli("worker", "zqsync.demo.tasks", "--bind", "tcp://nonsense")
    assert result.returncode == 1
    assert result.stderr.startswith("zqsync worker: --bind: worker endpoint must look like tcp://HOST:PORT"), \
        result.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--router"], "zqsync worker: --router goes with --processes N"),
    (["--direct"], "zqsync worker: --direct goes with --processes N"),
    (["--processes", "2", "--direct", "--router"], "zqsync worker: --direct and --router are two prefork modes"),
], ids=["router alone", "direct alone", "both"])
def test_prefork_mode_flags_that_do_not_fit_are_one_line_and_exit_1(flags, message):
    result = zqsync_cli("worker", "zqsync.demo.tasks", "--bind", "tcp://127.0.0.1:0", *flags)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("mode", [[], ["--direct"], ["--router"]], ids=["default", "deprecated --direct", "router"])
def test_processes_starts_a_direct_prefork_worker_unless_told_router(zq_worker, mode):
    """Direct is the default (``--direct`` is a no-op kept for old command lines): the supervisor's startup
    line says so, and the worker announces its children's slots; the router's announces none."""
    worker = zq_worker(extra_args=["--processes", "2", *mode])
    startup = wait_for(lambda: next((line for line in worker.output().splitlines()
                                     if "zqsync supervisor pid" in line), None), what="the supervisor's startup line")
    port = int(worker.endpoint.rpartition(":")[2])
    with zqsync.Client(worker.endpoint) as client:
        if mode == ["--router"]:
            assert "direct" not in startup, startup
            with pytest.raises(zqsync.UnknownTask):
                client.call("zqsync.endpoints")
        else:
            assert "direct (each child binds" in startup, startup
            assert client.call("zqsync.endpoints") == {"slots": [port + 2, port + 4]}
