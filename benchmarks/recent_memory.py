"""Bytes one remembered outcome costs in a worker's recent-jobs rings (``zqsync/worker/recent.py``).

``python benchmarks/recent_memory.py``: fills ``PER_TASK`` outcomes of each of 20 tasks, with every
text at its 200-character cap and with short texts, and prints what ``tracemalloc`` saw allocated.
"""

from __future__ import annotations

import time
import tracemalloc
import uuid

from zqsync.worker import recent

TASKS = 20


def cost(text: int) -> tuple[int, float]:
    """Bytes for ``PER_TASK`` x :data:`TASKS` outcomes whose texts are ``text`` characters; and per outcome."""
    ring = recent.Recent()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for task in (f"task_{n:02d}" for n in range(TASKS)):
        for _ in range(recent.PER_TASK):
            now = time.time()
            stamp = str(now)  # distinct strings, as real arguments and results are
            ring.add(recent.Outcome(uuid.uuid4().hex, task, "failed", "a" * text + stamp, "r" * text + stamp,
                                    "E: " + "e" * text + stamp, 1, now, now + 0.001, False))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used, used / (recent.PER_TASK * TASKS)


def main() -> None:
    for label, text in (("every text at the 200-character cap", recent.TEXT - 17), ("short texts (~20 characters)", 3)):
        total, each = cost(text)
        print(f"{label}: {recent.PER_TASK} per task x {TASKS} tasks = {total / 1e6:.2f} MB, {each:.0f} B per outcome")


if __name__ == "__main__":
    main()
