"""Tasks for the dead-worker tests: each worker records what it ran in its own file and says who it is.

A worker's environment names both: ``ZQSYNC_TEST_OUT`` (the file) and ``ZQSYNC_TEST_NAME``.
"""

import os

from zqsync.worker import Registry

registry = Registry()


@registry.task
def mark(line):
    """Appends ``line`` to this worker's ``ZQSYNC_TEST_OUT`` file."""
    fd = os.open(os.environ["ZQSYNC_TEST_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@registry.task
def whoami():
    """This worker's ``ZQSYNC_TEST_NAME``."""
    return os.environ["ZQSYNC_TEST_NAME"]
