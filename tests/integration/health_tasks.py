"""Tasks for ``test_health_calls.py``: a confirmed job that holds its task slot until a gate file exists."""

import os

import gevent

from zqsync.worker import Registry

registry = Registry()


@registry.task
def gated(gate: str, path: str, job_id: str) -> None:
    """Wait (yielding) until the file ``gate`` exists, then append ``job_id`` to the file ``path``."""
    while not os.path.exists(gate):
        gevent.sleep(0.02)
    with open(path, "a") as handle:
        handle.write(f"{job_id}\n")
