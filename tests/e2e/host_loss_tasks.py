"""The task of ``tests/e2e/test_host_loss.py``'s workers: each run appends ``ID HOST EPOCH-SECONDS`` to a file.

``HOST`` is the worker's ``ZQSYNC_TEST_HOST``; one ``write`` on an ``O_APPEND`` descriptor, so lines
from concurrent runs on several hosts never interleave.
"""

import os
import time

from zqsync.worker import Registry

registry = Registry()


@registry.task
def ran(path, job_id):
    """Append ``job_id``, this worker's host label and the time to the file at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{job_id} {os.environ['ZQSYNC_TEST_HOST']} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)
