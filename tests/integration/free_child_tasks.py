"""Tasks for the prefork dispatch tests: one that blocks its child's hub, quick ones that say which child ran them."""

from __future__ import annotations

import os
import time

from tests.integration.blocking_tasks import spin
from zqsync.worker import Registry

registry = Registry()


@registry.task
def block(seconds, started):
    """Write this child's pid to the file ``started``, then burn CPU for ``seconds`` without yielding (no
    time limit), so this child's hub is blocked; returns its pid."""
    with open(started, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    spin(float(seconds))
    return os.getpid()


@registry.task
def whoami():
    return os.getpid()


@registry.task
def record(path):
    with open(path, "a") as handle:
        handle.write(f"{os.getpid()}\n")


@registry.task
def echo(value):
    """``[value, this child's pid]``: which client a reply reached, and which child ran the call."""
    return [value, os.getpid()]


@registry.task
def nap(seconds, started):
    """Append this child's pid to ``started``, then sleep ``seconds`` cooperatively: a busy task slot, a free hub."""
    with open(started, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    time.sleep(float(seconds))
