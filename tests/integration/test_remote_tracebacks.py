"""``--no-remote-tracebacks``: a failed call's RemoteError carries its type and message only."""

from __future__ import annotations

import pytest

import zqsync
from zqsync.settings import WorkerSettings


@pytest.mark.parametrize("flag", [[], ["--no-remote-tracebacks"]], ids=["default", "off"])
def test_remote_error_carries_a_traceback_only_when_allowed(zq_worker, flag):
    worker = zq_worker(extra_args=flag)
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.RemoteError) as raised:
            client.call("fail", "secret /srv/app/config.py")
    error = raised.value
    assert (error.remote_type, error.remote_message) == ("RuntimeError", "secret /srv/app/config.py")
    if flag:
        assert error.remote_traceback == "" and "Remote traceback" not in str(error)
        assert "zqsync/demo/tasks.py" in worker.output(), "the worker logs the traceback itself"
    else:
        assert "zqsync/demo/tasks.py" in error.remote_traceback


def test_worker_setting_is_a_checked_bool():
    with pytest.raises(zqsync.ConfigurationError, match="remote_tracebacks"):
        WorkerSettings(remote_tracebacks="no")
    assert WorkerSettings().replace(remote_tracebacks=False).remote_tracebacks is False  # Worker(..., remote_tracebacks=False)
