"""Tasks that fork inside a worker (scenario S02), served by the fork tests.

Run as ``zq_worker("tests.fork.forking_tasks:registry")``; the worker runs
with cwd = repository root, so this module imports as ``tests.fork.forking_tasks``.

The worker process monkey-patches (``zqsync worker``), so ``os.fork`` here is
gevent's fork and ``os.waitpid`` waits cooperatively.
"""

from __future__ import annotations

import json
import os
import tempfile

import zqsync
from zqsync.worker import Registry

registry = Registry()

#: One client per peer endpoint, built once per worker process and shared by
#: every task (as an app would hold its module-level client).
_clients: dict[str, zqsync.Client] = {}


def _client(endpoint: str) -> zqsync.Client:
    client = _clients.get(endpoint)
    if client is None:
        client = _clients[endpoint] = zqsync.Client(endpoint, call_timeout=20.0, lease_timeout=20.0)
    return client


@registry.task(time_limit=60.0)
def call_peer(endpoint: str, value):
    """Call ``echo(value)`` on the peer from inside the worker process itself."""
    return {"pid": os.getpid(), "result": _client(endpoint).call("echo", value)}


@registry.task(time_limit=60.0)
def call_peer_slowly(endpoint: str, seconds: float, value):
    """Call ``delay(seconds, value)`` on the peer: a lease stays in flight meanwhile."""
    return {"pid": os.getpid(), "result": _client(endpoint).call("delay", seconds, value)}


@registry.task
def ping():
    """Answer at once with this worker's pid."""
    return os.getpid()


@registry.task(time_limit=60.0)
def fork_and_call(endpoint: str, value, calls: int = 3, seconds: float = 0.0):
    """Use the pooled client here, fork, and let the child call ``delay(seconds, ...)`` on the peer ``calls`` times.

    :returns: ``{"worker_pid", "child_pid", "exit_code", "child": {...}}``, where
        ``child`` is what the child wrote: its pid and the results of its calls,
        or the error it hit.
    """
    client = _client(endpoint)
    before = client.call("echo", f"before-fork-{value}")  # the worker holds a pooled socket now
    handle, path = tempfile.mkstemp(prefix="zqsync-task-fork-")
    os.close(handle)
    try:
        pid = os.fork()
        if pid == 0:  # the child: one call per iteration, then exit without running the worker's code
            code = 1
            try:
                try:
                    results = [
                        client.call_with_options("delay", args=(seconds, f"{value}-{n}"), timeout=15.0)
                        for n in range(calls)
                    ]
                    report = {"pid": os.getpid(), "results": results}
                    code = 0
                except BaseException as exc:  # report everything to the parent
                    report = {"pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"}
                with open(path, "w") as handle_out:
                    json.dump(report, handle_out)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        with open(path) as handle_in:
            text = handle_in.read()
    finally:
        os.unlink(path)
    return {
        "worker_pid": os.getpid(),
        "child_pid": pid,
        "exit_code": os.waitstatus_to_exitcode(status),
        "before": before,
        "child": json.loads(text) if text else None,
    }
