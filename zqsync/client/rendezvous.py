"""Which worker a confirmed job goes to: rendezvous (highest random weight) hashing of its id.

With several workers, each has its own journal, so a job id is recognised as a duplicate only by
the worker that journaled it. A confirmed job is therefore sent, and re-sent on every retry, to
one *preferred* worker: the endpoint with the highest ``hash(endpoint, job id)``. Every client
with the same endpoints (in any order) prefers the same worker for the same id, and removing a
worker moves only the jobs that preferred it (Thaler and Ravishankar, "Using name-based mappings
to increase hit rates", 1998).

The client fails over to the next endpoint in rank only when the preferred one has not answered
for ``failover_after`` seconds. That is the one case in which a job can run twice: the preferred
worker journaled it but its acknowledgement did not arrive within the bound (it was stopped,
overloaded, or cut off), and the next worker journals and runs it too.

A worker failed over from is remembered as down (:class:`Down`) for ``failover_after`` seconds:
jobs that prefer it meanwhile start with the next endpoint at once, instead of each waiting out
the bound. That adds no duplicate: such a job is never sent to the worker it skips.
"""

from __future__ import annotations

import hashlib
import time
from typing import Optional, Sequence

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


class Down:
    """Endpoints recently failed over from, each until a ``time.monotonic()`` deadline (one per client)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def mark(self, endpoint: str, seconds: float) -> None:
        """Consider ``endpoint`` down for ``seconds``."""
        self._until[endpoint] = time.monotonic() + seconds

    def __contains__(self, endpoint: object) -> bool:
        return isinstance(endpoint, str) and self._until.get(endpoint, 0.0) > time.monotonic()


class Route:
    """The endpoint each attempt of one confirmed job goes to.

    :param key: the job id.
    :param endpoints: the client's rpc endpoints.
    :param failover_after: seconds without an answer from the current endpoint before moving to
        the next in rank (cycling back to the first after the last).
    :param down: endpoints to start past (the client's memory of recent failovers), updated on failover.
    """

    def __init__(self, key: str, endpoints: Sequence[str], failover_after: float,
                 down: Optional[Down] = None) -> None:
        self.order = rank(key, endpoints)
        self.failover_after = failover_after
        self.down = down if down is not None else Down()
        self._index = next((i for i, endpoint in enumerate(self.order) if endpoint not in self.down), 0)
        self._since = time.monotonic()
        self.failovers = 0

    @property
    def endpoint(self) -> str:
        """Where the next attempt goes."""
        return self.order[self._index]

    def unanswered(self) -> None:
        """An attempt got no answer: fail over if the current endpoint has been silent past the bound."""
        if len(self.order) > 1 and time.monotonic() - self._since >= self.failover_after:
            self.down.mark(self.endpoint, self.failover_after)
            self._index = (self._index + 1) % len(self.order)
            self._since = time.monotonic()
            self.failovers += 1
