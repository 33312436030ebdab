"""``ZQSYNC_TEST_LOAD=N``: N CPU-burning processes for the whole test run, to prove the suite on a busy machine.

Each burner is a plain Python busy loop (no system dependency) that exits by
itself once the process that started it is gone, so a test run killed with
SIGKILL leaves none behind; a normal end or Ctrl-C kills them by pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

VARIABLE = "ZQSYNC_TEST_LOAD"

#: Spins until its parent (the pytest process that started it) is gone.
BURN = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(200000):
        pass
"""


def wanted() -> int:
    """How many burners ``ZQSYNC_TEST_LOAD`` asks for (0 when unset or empty).

    :raises ValueError: the variable is not a whole number >= 0.
    """
    value = os.environ.get(VARIABLE, "").strip() or "0"
    if not value.isdigit():
        raise ValueError(f"{VARIABLE}={value}: expected a whole number of processes >= 0")
    return int(value)


def start(count: int) -> list[subprocess.Popen]:
    """Start ``count`` burners at normal priority; returns them for :func:`stop`."""
    return [subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.DEVNULL) for _ in range(count)]


def stop(burners: list[subprocess.Popen]) -> None:
    """Kill each burner by its pid and reap it."""
    for burner in burners:
        try:
            os.kill(burner.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for burner in burners:
        burner.wait()
