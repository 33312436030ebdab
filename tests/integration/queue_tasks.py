"""Tasks for the named-queue test."""

import time

from zqsync.worker import Registry

registry = Registry()


@registry.task
def slow():
    """A low-priority job: 0.1 s of cooperative work."""
    time.sleep(0.1)


@registry.task
def urgent(sent_at, path):
    """Records how long after its sending it started, in seconds."""
    started = time.time()
    with open(path, "a") as handle:
        handle.write(f"{started - sent_at:.6f}\n")


@registry.task
def counted(path):
    """0.1 s of cooperative work, then a line in ``path``."""
    time.sleep(0.1)
    with open(path, "a") as handle:
        handle.write("ran\n")
