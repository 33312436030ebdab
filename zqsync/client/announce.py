"""A client's view of direct prefork workers (``zqsync worker --processes N``, the default mode): their announced slots.

A direct prefork worker's children share its public pair (PORT, PORT+1: the kernel gives each new
connection to one child) and each binds a slot pair of its own (``worker/listeners.py``). A pooled
socket to the public pair therefore reaches one child for good, and a client sending from one socket
would use one child of N. A client with ``expand_prefork`` asks each worker endpoint
``zqsync.endpoints``; a direct prefork worker answers ``{"slots": [base port, ...]}``, and the client
sends to ``tcp://HOST:SLOT`` for each, HOST being the host it used for the public endpoint, instead of
the public endpoint: one endpoint per child, so libzmq's round robin spreads calls and plain jobs over
the children per message, rendezvous hashing ranks the children for confirmed jobs, and the health view
judges each child on its own.

This rides on discovery (``discovery.py``): the answer is asked again every ``resolve_interval``,
endpoints that appear are dialled and vanished ones drained. An endpoint whose worker does not announce
(a standalone worker, the router's prefork: ``zqsync.endpoints`` is an unknown task there) stands for
itself. One that does not answer within ``probe_timeout`` keeps what it last announced (itself at first).

*Why opt-in* (``expand_prefork`` or ``ZQSYNC_EXPAND_PREFORK=1``, off by default): the question costs a
round trip on a client's first request and every ``resolve_interval``, and a client whose endpoints are
literal addresses otherwise runs no discovery at all; a client that does not expand still works with a
direct worker, over its public pair.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import zmq

from ..errors import CallTimeout, PoolError, ProtocolError
from ..wire.endpoints import parse_endpoint
from .health import ask

#: The worker's call that announces its slots.
ENDPOINTS_CALL = "zqsync.endpoints"

#: ``announce(endpoint)``: the slot endpoints a worker endpoint announces, ``()`` if it announces none,
#: ``None`` if it did not answer.
Announce = Callable[[str], Optional[tuple[str, ...]]]


def slot_endpoints(pool: Any, endpoint: str, timeout: float) -> Optional[tuple[str, ...]]:
    """The slot base endpoints the worker at ``endpoint`` (``tcp://HOST:PORT``) announces, on HOST.

    Asks ``zqsync.endpoints`` on a new socket of the call ``pool`` (``health.ask``); blocks the calling
    greenlet or thread up to twice ``timeout`` seconds (a free socket, then the answer).

    :returns: the endpoints; ``()`` when the worker announces none (it answered with an error, or
        with anything but a list of ports); ``None`` when it did not answer.
    """
    host, port = parse_endpoint(endpoint)
    try:
        reply = ask(pool, f"{host}:{port + 1}", ENDPOINTS_CALL, timeout)
    except (CallTimeout, PoolError, ProtocolError, zmq.ZMQError):
        return None
    slots = reply.result.get("slots") if reply.ok and isinstance(reply.result, dict) else None
    if not isinstance(slots, list) or not all(isinstance(slot, int) and 0 < slot < 65535 for slot in slots):
        return ()
    return tuple(f"{host}:{slot}" for slot in slots)


class Expansion:
    """What each worker endpoint expanded to at its last answer (one per client's discovery).

    :param announce: asks an endpoint for its slots (`Announce`).
    """

    def __init__(self, announce: Announce) -> None:
        self._announce = announce
        self._known: dict[str, tuple[str, ...]] = {}
        self._asking: set[str] = set()  # endpoints asked now, by another greenlet or thread

    def expand(self, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        """Each endpoint's announced slots, or the endpoint itself (module docstring). Blocks for the asking."""
        return tuple(slot for endpoint in endpoints for slot in self._slots(endpoint))

    def _slots(self, endpoint: str) -> tuple[str, ...]:
        """What ``endpoint`` announces; while another caller asks it, what it announced last (or itself):
        a burst of first requests asks once, not once per request."""
        if endpoint not in self._asking:
            self._asking.add(endpoint)
            try:
                answer = self._announce(endpoint)
            finally:
                self._asking.discard(endpoint)
            if answer is not None:
                self._known[endpoint] = answer
        return self._known.get(endpoint) or (endpoint,)
