"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``probe`` until it returns a truthy value; fail the test after ``timeout`` seconds.

    Generous by default: this machine has 2 cores and is noisy.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value {value!r}")
        time.sleep(interval)
