"""Tasks for the confirmed-job tests: retries, dead letters, and a pending retry across restarts."""

import os

from zqsync.worker import Registry

registry = Registry()
ATTEMPTS: dict = {}


def _append(path: str, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(f"{line}\n")


@registry.task(retries=2, backoff=0.05)
def flaky(path, key):
    """Fails twice in a process, then succeeds: three attempts in all."""
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    _append(path, f"{key} attempt {ATTEMPTS[key]}")
    if ATTEMPTS[key] < 3:
        raise RuntimeError(f"attempt {ATTEMPTS[key]} fails")


@registry.task(retries=1, backoff=0.05)
def doomed(path):
    """Always fails: one attempt plus one retry, then dead-lettered."""
    _append(path, "doomed")
    raise ValueError("never works")


@registry.task(retries=3, backoff=2.0)
def fail_first(path, key):
    """Fails on its first attempt ever (a marker file remembers it across processes), then succeeds."""
    marker = f"{path}.{key}.tried"
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first attempt fails")
    _append(path, key)
