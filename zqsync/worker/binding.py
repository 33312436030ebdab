"""Binding a worker's socket pair (jobs on PORT, rpc on PORT+1), and the options of every socket clients connect to.

`serve_clients` is applied to each ROUTER a client connects to: a standalone worker's pair,
a named queue's socket and a prefork supervisor's public pair (``docs/design.md``, "Delivery semantics"):

* ``ZMQ_ROUTER_HANDOVER``: a client that reconnects after a cut keeps its routing id, and the worker
  may still hold the old connection (no FIN crossed the cut). Without the option libzmq ignores the
  new connection for good and everything sent on it is lost unread; with it the new connection takes
  the id over. libzmq then drops what the worker had not yet read from the old connection.
* TCP keepalive (``keepalive_idle``, ``keepalive_interval``, `KEEPALIVE_PROBES`): the worker's
  kernel probes a silent connection and closes it when the client's host no longer answers, so a
  stale connection does not hold an fd and its buffers for ever. The client's kernel answers the
  probes however busy either process is, so it never drops a connection to a live client; ZMTP
  heartbeats would not do (the design says why).
"""

from __future__ import annotations

import errno
import logging
import math
from typing import Optional

import zmq

from .. import settings
from ..errors import ConfigurationError
from ..wire.curve import server_options
from ..wire.endpoints import is_loopback, parse_endpoint

log = logging.getLogger(__name__)

#: Unanswered TCP keepalive probes before the worker's kernel closes a client connection.
KEEPALIVE_PROBES = 3
#: ``(idle, interval)`` seconds of the worker's TCP keepalive by default.
KEEPALIVE = (settings.KEEPALIVE_IDLE, settings.KEEPALIVE_INTERVAL)


def serve_clients(sock: zmq.Socket, keepalive: tuple[float, float] = KEEPALIVE) -> None:
    """Set the options of a ROUTER that clients connect to (module docstring), before it binds.

    :param keepalive: ``(idle, interval)`` seconds of TCP keepalive, rounded up to whole seconds.
    """
    idle, interval = (max(1, math.ceil(seconds)) for seconds in keepalive)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, idle)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, interval)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)


def bind_pair(jobs: zmq.Socket, rpc: zmq.Socket, address: str, *, curve_secret_key: Optional[str] = None,
              keepalive: tuple[float, float] = KEEPALIVE) -> str:
    """Bind ``jobs`` to PORT and ``rpc`` to PORT+1 of ``address`` (``tcp://HOST:PORT``), both set up
    by `serve_clients` with ``keepalive``.

    PORT ``0`` picks a free pair in 20000..60000, retrying while PORT+1 is taken.
    HOST may be an IPv4 address, ``*`` (every IPv4 interface), a host name,
    or an IPv6 address in brackets (``tcp://[::1]:5555``; both sockets then
    get ``ZMQ_IPV6``).
    With ``curve_secret_key`` both sockets become CURVE servers (the caller
    runs the ZAP authenticator); without it, a non-loopback address is
    bound with a warning, since anyone who can reach it can run tasks.

    :returns: the bound base endpoint.
    :raises ConfigurationError: malformed address (naming it), a fixed port in use, a host that is not
        this machine's, or no free pair found.
    """
    host, port = parse_endpoint(address, allow_zero=True)
    configure_pair(jobs, rpc, address, curve_secret_key=curve_secret_key, keepalive=keepalive)
    if port:
        bind(jobs, f"{host}:{port}")
        bind(rpc, f"{host}:{port + 1}")
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


def configure_pair(jobs: zmq.Socket, rpc: zmq.Socket, address: str, *, curve_secret_key: Optional[str] = None,
                   keepalive: tuple[float, float] = KEEPALIVE) -> None:
    """Set the options `bind_pair` sets before it binds ``address`` (``tcp://HOST:PORT``): those of
    `serve_clients`, ``ZMQ_IPV6`` for a bracketed host, CURVE, or the warning for a non-loopback host
    without it."""
    host, _ = parse_endpoint(address, allow_zero=True)
    serve_clients(jobs, keepalive)
    serve_clients(rpc, keepalive)
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


def bind(sock: zmq.Socket, endpoint: str) -> None:
    """``sock.bind(endpoint)``, with an operator's mistake as a one-line error.

    :raises ConfigurationError: the address is in use, or it is not an address of this machine.
    :raises zmq.ZMQError: any other failure.
    """
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        hints = {errno.EADDRINUSE: "another process listens there: stop it, or choose another port",
                 errno.EADDRNOTAVAIL: "that is not an address of this machine",
                 errno.ENODEV: "there is no such network interface here"}
        if exc.errno not in hints:
            raise
        raise ConfigurationError(f"cannot bind {endpoint}: {zmq.strerror(exc.errno)} ({hints[exc.errno]})",
                                 setting="bind") from None
