"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")

#: A prefork worker's mode flags (with ``--processes N``): direct is the default, the router opt-in.
PREFORK_MODES = {"direct": [], "router": ["--router"]}
#: Runs a test in each prefork mode, its ``mode`` argument being the mode's flags.
over_prefork_modes = pytest.mark.parametrize("mode", list(PREFORK_MODES.values()), ids=list(PREFORK_MODES))

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


class JobStream(threading.Thread):
    """Enqueues plain ``record`` jobs (one line each, the job's index) from a thread; ``accepted`` counts them.

    :param endpoints: the client's endpoint or endpoints.
    :param target: the file each job appends its index to.
    :param jobs: stop after this many (``None``: until :meth:`stop`).
    :param delay: seconds each ``record`` task sleeps before writing.
    :param burst: pause 10 ms after every ``burst`` jobs (``None``: no pause).
    :param send_timeout: the client's enqueue deadline, seconds.

    An exception in the thread is kept in ``error`` for the test to report.
    """

    def __init__(self, endpoints, target, *, jobs=None, delay=0.0, burst=None, send_timeout=30.0) -> None:
        super().__init__(daemon=True)
        self.endpoints, self.target, self.jobs = endpoints, target, jobs
        self.delay, self.burst, self.send_timeout = delay, burst, send_timeout
        self.accepted = 0
        self.stats: dict = {}
        self.done = threading.Event()
        self.error = None

    def stop(self) -> None:
        """Send no more jobs; returns once the thread ended."""
        self.done.set()
        self.join(timeout=slack(60.0))

    def run(self) -> None:
        import zqsync

        try:
            with zqsync.Client(self.endpoints, send_timeout=self.send_timeout) as client:
                while not self.done.is_set() and (self.jobs is None or self.accepted < self.jobs):
                    client.enqueue("record", str(self.target), str(self.accepted), self.delay)
                    self.accepted += 1
                    if self.burst and self.accepted % self.burst == 0:
                        time.sleep(0.01)
            self.stats = client.stats()  # after close: it counts what the linger left unsent
        except BaseException as exc:  # reported by the test
            self.error = exc


def tcp_peer_ports() -> set[int]:
    """The remote ports of this process's open TCP connections (ESTABLISHED or CLOSE_WAIT), read from
    ``/proc``: what libzmq's I/O thread still holds, seen from the kernel's side."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] in ("01", "08") and fields[9] in inodes:
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports
