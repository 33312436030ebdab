"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")

#: The suite's one timing knob (gevent's testing/timing.py has one too): every
#: deadline in the tests is multiplied by it. Raise ZQSYNC_TEST_SLACK on a slow machine.
SLACK = float(os.environ.get("ZQSYNC_TEST_SLACK", "1"))


def slack(seconds: float) -> float:
    """``seconds`` stretched by :data:`SLACK`: use it for every deadline a test waits on."""
    return seconds * SLACK


def wait_for(probe: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``probe`` until it returns a truthy value; fail the test after ``timeout`` seconds.

    Generous by default: this machine has 2 cores and is noisy.
    """
    timeout = slack(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value {value!r}")
        time.sleep(interval)


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    import os

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return sorted(found)


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
