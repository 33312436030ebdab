"""Tasks written the way real applications write them: ones that never yield to gevent, and ones that exit."""

from __future__ import annotations

import os
import re
import sys
import time

from zqsync import SoftTimeLimitExceeded
from zqsync.worker import Registry

registry = Registry()


def spin(seconds: float) -> int:
    """Burn CPU in pure Python for ``seconds``, never yielding."""
    end, turns = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        turns += 1
    return turns


@registry.task(time_limit=0.5)
def cpu(seconds):
    spin(float(seconds))
    return "finished"


@registry.task(time_limit=0.5)
def cpu_then_write(path, seconds):
    """The side effect comes after the overrun: it must never happen."""
    spin(float(seconds))
    with open(path, "a") as handle:
        handle.write("side effect\n")
    return "wrote"


@registry.task(time_limit=0.3)
def catastrophic_regex():
    """A C call that holds the GIL for minutes: no signal handler runs until it returns."""
    return bool(re.match(r"(a+)+$", "a" * 40 + "b"))


@registry.task
def exits(code=0):
    sys.exit(code)


@registry.task
def interrupts():
    raise KeyboardInterrupt


@registry.task
def add(a, b):
    return a + b


@registry.task(soft_time_limit=0.3, time_limit=float(os.environ.get("ZQSYNC_TEST_SLACK", "1")) * 10.0)
def cpu_tidy(path, seconds):
    """Never yields, before its soft limit nor while it cleans up."""
    try:
        spin(float(seconds))
    except SoftTimeLimitExceeded:
        spin(0.05)
        _note(path, "cleaned up")
        return "cleaned up"
    return "finished"


@registry.task(soft_time_limit=0.3, time_limit=0.8)
def cpu_stubborn(path, seconds):
    """Cleans up (never yielding) past its hard limit."""
    try:
        spin(float(seconds))
    except SoftTimeLimitExceeded:
        _note(path, "soft limit seen")
        spin(float(seconds))
        _note(path, "never")


def _note(path: str, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text + "\n")
