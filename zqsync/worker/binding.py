"""Binding a worker's socket pair: jobs on PORT, rpc on PORT+1."""

from __future__ import annotations

import errno

import zmq

from ..client import parse_endpoint
from ..errors import ConfigurationError


def bind_pair(jobs: zmq.Socket, rpc: zmq.Socket, address: str) -> str:
    """Bind ``jobs`` to PORT and ``rpc`` to PORT+1 of ``address`` (``tcp://HOST:PORT``).

    PORT ``0`` picks a free pair in 20000..60000, retrying while PORT+1 is taken.

    :returns: the bound base endpoint.
    :raises ConfigurationError: malformed address, or no free pair found.
    :raises zmq.ZMQError: a fixed port is in use or the host is unavailable.
    """
    host, port = parse_endpoint(address, allow_zero=True)
    if port:
        jobs.bind(f"{host}:{port}")
        rpc.bind(f"{host}:{port + 1}")
        return f"{host}:{port}"
    for _ in range(100):
        port = jobs.bind_to_random_port(host, min_port=20000, max_port=60000)
        try:
            rpc.bind(f"{host}:{port + 1}")
            return f"{host}:{port}"
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            jobs.unbind(jobs.getsockopt_string(zmq.LAST_ENDPOINT))
    raise ConfigurationError(f"found no free port pair on {host}", setting="bind")
