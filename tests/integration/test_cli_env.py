"""``ZQSYNC_ENDPOINT`` stands in for a client command's ENDPOINT argument, which still wins when given.

The commands run in this process (``zqsync.cli.main``) against the in-process worker core, over loopback.
"""

from __future__ import annotations

import json

import pytest

from zqsync import cli
from zqsync.demo.tasks import registry as demo_registry

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def worker(zq_inprocess):
    return zq_inprocess(demo_registry)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv, printed", [
    (("call", "add", "1", "2"), "3"),
    (("call", "echo", "plain words"), '"plain words"'),
    (("ping",), "pong from "),
])
def test_client_commands_take_their_endpoint_from_the_environment(worker, monkeypatch, capsys, argv, printed):
    monkeypatch.setenv("ZQSYNC_ENDPOINT", worker.endpoint)
    status, out, err = run(capsys, *argv, "--log-level", "warning")
    assert status == 0, err
    assert out.startswith(printed), out


def test_enqueue_job_and_stats_use_the_environment_endpoint(worker, monkeypatch, capsys):
    monkeypatch.setenv("ZQSYNC_ENDPOINT", worker.endpoint)
    status, out, err = run(capsys, "enqueue", "add", "2", "3", "--store-result", "--log-level", "warning")
    assert status == 0, err
    job_id = out.strip()
    status, out, err = run(capsys, "job", job_id, "--wait", "30", "--log-level", "warning")
    assert (status, out.strip()) == (0, "5"), err
    status, out, err = run(capsys, "stats", "--json", "--log-level", "warning")
    assert status == 0, err
    assert json.loads(out)["jobs_succeeded"] == 1


def test_an_endpoint_argument_wins_over_the_environment(worker, monkeypatch, capsys):
    monkeypatch.setenv("ZQSYNC_ENDPOINT", "tcp://127.0.0.1:9")  # nothing listens: the call would time out
    status, out, err = run(capsys, "call", worker.endpoint, "add", "4", "5", "--timeout", "30", "--log-level", "warning")
    assert (status, out.strip()) == (0, "9"), err


def test_without_endpoint_or_variable_the_error_names_both(monkeypatch, capsys):
    monkeypatch.delenv("ZQSYNC_ENDPOINT", raising=False)
    with pytest.raises(SystemExit) as exited:  # its message is the one line Python prints, with exit status 1
        run(capsys, "call", "add", "1", "2")
    assert exited.value.code == ("zqsync call: no ENDPOINT given and ZQSYNC_ENDPOINT is not set: give a worker endpoint "
                           "such as tcp://127.0.0.1:5555, or set ZQSYNC_ENDPOINT")
