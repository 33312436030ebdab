"""Binding a worker's socket pair: jobs on PORT, rpc on PORT+1."""

from __future__ import annotations

import errno
import logging
from typing import Optional

import zmq

from ..errors import ConfigurationError
from ..wire.curve import server_options
from ..wire.endpoints import is_loopback, parse_endpoint

log = logging.getLogger(__name__)


def bind_pair(jobs: zmq.Socket, rpc: zmq.Socket, address: str, *, curve_secret_key: Optional[str] = None) -> str:
    """Bind ``jobs`` to PORT and ``rpc`` to PORT+1 of ``address`` (``tcp://HOST:PORT``).

    PORT ``0`` picks a free pair in 20000..60000, retrying while PORT+1 is taken.
    HOST may be an IPv4 address, ``*`` (every IPv4 interface), a host name,
    or an IPv6 address in brackets (``tcp://[::1]:5555``; both sockets then
    get ``ZMQ_IPV6``).
    With ``curve_secret_key`` both sockets become CURVE servers (the caller
    runs the ZAP authenticator); without it, a non-loopback address is
    bound with a warning, since anyone who can reach it can run tasks.

    :returns: the bound base endpoint.
    :raises ConfigurationError: malformed address (naming it), or no free pair found.
    :raises zmq.ZMQError: a fixed port is in use or the host is unavailable.
    """
    host, port = parse_endpoint(address, allow_zero=True)
    if host.startswith("tcp://["):
        jobs.setsockopt(zmq.IPV6, 1)
        rpc.setsockopt(zmq.IPV6, 1)
    if curve_secret_key:
        for option, value in server_options(curve_secret_key).items():
            jobs.setsockopt(option, value)
            rpc.setsockopt(option, value)
    elif not is_loopback(host.split("//", 1)[1]):
        log.warning(
            "binding %s without CURVE: anyone who can reach it can run tasks; start the worker with "
            "--curve-secret-key FILE --allow-client-keys DIR (see zqsync keygen)", address,
        )
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
