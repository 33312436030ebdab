"""The seats of a direct prefork worker: one row of shared memory per live child (``steal.py``).

The supervisor maps an anonymous shared region before it forks any child (`Seats`), and gives each child
a seat for its life: a replacement gets a free one, so at HUP the old and the new child of a slot never
share a row. A child writes only its own row:

* its hub stamps ``tick`` (``time.monotonic()``, the system-wide ``CLOCK_MONOTONIC``) and ``free`` (free
  task slots, 0 once it stops) every `STAMP_EVERY` seconds: a sibling whose hub is blocked forwards work
  only to a child whose stamp is fresh and that has free slots;
* plain-job counters, each written by one thread: ``taken`` (jobs its hub read into the process) and
  ``ended`` (jobs through one attempt, or put aside for a retry or a turn) by the hub, ``stolen`` (jobs
  its relay thread read) and ``handed`` (of those, sent to a sibling) by the relay;
* ``accounted``, set once its stop sequence has counted and logged what it discarded.

When the supervisor reaps a child that did not account, ``taken + stolen - ended - handed`` is what it
held: plain jobs read into the process that did not run (``Seats.release``).
"""

from __future__ import annotations

import mmap
import time
from typing import Optional

#: Seconds between two stamps of a child's hub (a sibling's relay needs one within ``steal.STEAL_AFTER``).
STAMP_EVERY = 0.02
#: Fields of a row, in order (8 bytes each; ``tick`` is a double, the rest signed integers).
FIELDS = ("pid", "tick", "free", "taken", "ended", "stolen", "handed", "accounted")
PID, TICK, FREE, TAKEN, ENDED, STOLEN, HANDED, ACCOUNTED = range(len(FIELDS))
WIDTH = len(FIELDS)


class Seats:
    """``count`` rows in an anonymous shared mapping (inherited by every child forked after it is made).

    ``ints`` and ``floats`` view the same bytes; row *r*'s field *f* is at ``r * WIDTH + f``.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._map = mmap.mmap(-1, count * WIDTH * 8)  # MAP_SHARED | MAP_ANONYMOUS
        self.ints = memoryview(self._map).cast("q")
        self.floats = memoryview(self._map).cast("d")

    def claim(self) -> int:
        """A free row, cleared and marked taken (the supervisor, before it forks the child that gets it).

        :raises RuntimeError: every row is in use."""
        for seat in range(self.count):
            if self.ints[seat * WIDTH + PID] == 0:
                self.ints[seat * WIDTH:(seat + 1) * WIDTH] = memoryview(bytes(WIDTH * 8)).cast("q")
                self.ints[seat * WIDTH + PID] = -1
                return seat
        raise RuntimeError("no free seat")

    def held(self, seat: int) -> Optional[int]:
        """Plain jobs the child of ``seat`` read into its process and did not run; ``None`` if it accounted
        for them itself (its stop sequence ran to the end)."""
        row = seat * WIDTH
        if self.ints[row + ACCOUNTED]:
            return None
        ints = self.ints
        return max(0, ints[row + TAKEN] + ints[row + STOLEN] - ints[row + ENDED] - ints[row + HANDED])

    def release(self, seat: int) -> Optional[int]:
        """The child of ``seat`` was reaped: `held`, and the row is free again."""
        held = self.held(seat)
        self.ints[seat * WIDTH + PID] = 0
        return held

    def fresh(self, seat: int, now: float, within: float) -> bool:
        """Whether the hub of ``seat``'s child stamped its row in the last ``within`` seconds."""
        return now - self.floats[seat * WIDTH + TICK] <= within

    def close(self) -> None:
        self.ints.release()
        self.floats.release()
        self._map.close()


def now() -> float:
    """The clock of every stamp (``CLOCK_MONOTONIC``: the same in every process of the machine)."""
    return time.monotonic()
