"""Which worker a confirmed job goes to: rendezvous (highest random weight) hashing of its id.

With several workers, each has its own journal, so a job id is recognised as a duplicate only by
the worker that journaled it. A confirmed job is therefore sent, and re-sent on every retry, to
one *preferred* worker: the endpoint with the highest ``hash(endpoint, job id)``. Every client
with the same endpoints (in any order) prefers the same worker for the same id, and removing a
worker moves only the jobs that preferred it (Thaler and Ravishankar, "Using name-based mappings
to increase hit rates", 1998).

A job moves to the next endpoint in rank only when the current one did not confirm it: its attempt
found no connection to hand itself to (nothing was sent), or it went unanswered and a probe then
found no connection either (``health.py``: a dead process or host, found within about
``confirm_retry + probe_timeout``), or the endpoint stayed silent for ``failover_after`` seconds
(connected but not answering: a blocked or overloaded worker, which may yet confirm, so the bound
is long). The last two are the cases in which a job can run twice: the worker journaled it but its
acknowledgement did not arrive (it was killed, stopped, overloaded or cut off), and the next worker
journals and runs it too. A job is never sent to a second worker while the first may still confirm
within the bound, unless the first cannot be reached at all.

An endpoint a job moved from is held down by the client's `Health`
until a probe is answered: jobs that prefer it meanwhile start with the next endpoint at once,
instead of each finding it dead again. That adds no duplicate: such a job is never sent to the
worker it skips.
"""

from __future__ import annotations

import hashlib
import time
from typing import Sequence

from .health import Health

#: Confirm attempts (``confirm_retry`` seconds each) without an answer before failing over.
FAILOVER_ATTEMPTS = 5


def rank(key: str, endpoints: Sequence[str]) -> list[str]:
    """``endpoints`` ordered by preference for ``key``: highest ``blake2b(endpoint, key)`` weight first.

    Deterministic across processes and hosts (no per-process hash seed), independent of the order
    of ``endpoints``.
    """
    def weight(endpoint: str) -> bytes:
        return hashlib.blake2b(f"{endpoint}\0{key}".encode(), digest_size=8).digest()

    return sorted(endpoints, key=weight, reverse=True)


class Route:
    """The endpoint each attempt of one confirmed job goes to.

    :param key: the job id.
    :param endpoints: the client's rpc endpoints.
    :param failover_after: seconds without an answer from the current endpoint before moving to
        the next in rank (cycling back to the first after the last).
    :param health: the client's view of which endpoints are down: the route starts past them, and
        moves past them (when every one is down, it tries them in rank all the same).
    """

    def __init__(self, key: str, endpoints: Sequence[str], failover_after: float, health: Health) -> None:
        self.order = rank(key, endpoints)
        self.failover_after = failover_after
        self.health = health
        self._index = -1
        self._since = 0.0
        self._checked = False
        self.failovers = -1
        self._advance()

    @property
    def endpoint(self) -> str:
        """Where the next attempt goes."""
        return self.order[self._index]

    def unanswered(self, *, sent: bool = True) -> None:
        """An attempt got no answer (``sent=False``: no connection took it). Move on if the current
        endpoint did not take it, is down, or has been silent past the bound; the first time it
        is silent, probe it (``Health.check``: blocks up to ``2 * probe_timeout``)."""
        if len(self.order) < 2:
            return
        endpoint = self.endpoint
        if sent and not self.health.down(endpoint) and time.monotonic() - self._since < self.failover_after:
            if self._checked:
                return
            self._checked = True
            if not self.health.check(endpoint):
                return
        self.health.mark_down(endpoint)
        self._advance()

    def _advance(self) -> None:
        """To the next endpoint in rank that is not down (or simply the next, if every one is)."""
        count = len(self.order)
        steps = [(self._index + step) % count for step in range(1, count + 1)]
        self._index = next((i for i in steps if not self.health.down(self.order[i])), steps[0])
        self._since = time.monotonic()
        self._checked = False
        self.failovers += 1
