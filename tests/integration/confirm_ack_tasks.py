"""Tasks for ``test_confirm_acks.py``: a counter of the worker's live greenlets, and a job that records itself."""

import gc

import greenlet

from zqsync.worker import Registry

registry = Registry()


@registry.task
def live_greenlets() -> int:
    """How many greenlets are alive in this worker process (the receivers, loops, tasks...)."""
    return sum(1 for thing in gc.get_objects() if isinstance(thing, greenlet.greenlet) and not thing.dead)


@registry.task
def record(path: str, line: str) -> None:
    """Append ``line`` to the file ``path``."""
    with open(path, "a") as handle:
        handle.write(f"{line}\n")
