"""Direct prefork (``Supervisor(direct=True)``): listening sockets the supervisor holds, bound by its children.

The supervisor opens, before any child starts, the TCP listening sockets of a run of ports on the
``--bind`` host: the **public pair** (PORT jobs, PORT+1 rpc), shared by every child, and a **slot pair**
per child slot *i* (PORT+2+2i, PORT+3+2i), bound by that slot's child only. A child's ROUTERs bind them
through ``ZMQ_USE_FD`` (``direct.py``): libzmq then accepts on a socket it did not create. The kernel
balances the public pair's new connections over the children; a client that expands the worker's
announced slots (``client/announce.py``) spreads its messages over every child itself.

libzmq closes the descriptor it was given when its socket unbinds or closes, so each child gets its
own ``os.dup``; the supervisor keeps the originals open for the worker's whole life. So a slot's address
outlives its child: while a SIGKILLed child's replacement boots, the kernel completes new connections
into the listening socket's backlog, and the replacement accepts them; at HUP the old and the new child
both hold the slot until the old one has drained and unbound.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import socket
from typing import Any

import zmq

from ..errors import ConfigurationError
from ..wire.endpoints import parse_endpoint

#: Tries to find a free run of ports for PORT 0.
FREE_RUN_TRIES = 100
#: Ports a free run is picked from (as ``binding.bind_pair``).
FREE_PORTS = (20000, 60000)


@dataclasses.dataclass(frozen=True)
class DirectBackend:
    """What one direct-mode child binds (made by `Listeners`, passed to the forked child).

    :param host: ``tcp://HOST`` of the worker's ``--bind``.
    :param port: the public base port (jobs; rpc on ``port + 1``).
    :param slot: this child's slot; its pair is ``slots[slot]`` and ``slots[slot] + 1``.
    :param slots: every slot's base port, in slot order (what ``zqsync.endpoints`` announces).
    :param fds: the listening descriptors of public jobs, public rpc, slot jobs, slot rpc.
    :param directory: the supervisor's private directory (admin and stolen-work sockets, ``fleet.py``,
        ``steal.py``).
    :param seat: this child's row of ``seats``, the supervisor's shared table (``seats.py``).
    """

    host: str
    port: int
    slot: int
    slots: tuple[int, ...]
    fds: tuple[int, int, int, int]
    directory: str
    seat: int = 0
    seats: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def endpoint(self) -> str:
        """The worker's public base endpoint."""
        return f"{self.host}:{self.port}"

    def bindings(self) -> list[tuple[int, str]]:
        """``(descriptor, endpoint)`` of public jobs, public rpc, slot jobs, slot rpc."""
        ports = (self.port, self.port + 1, self.slots[self.slot], self.slots[self.slot] + 1)
        return [(fd, f"{self.host}:{port}") for fd, port in zip(self.fds, ports)]


class Listeners:
    """The listening sockets of a direct prefork worker of ``processes`` slots on ``bind`` (module docstring).

    :param bind: ``tcp://HOST:PORT``; PORT 0 picks a free run of ``2 + 2 * processes`` ports.
    :raises ConfigurationError: a malformed ``bind``, a port of the run taken (naming it), a host that is
        not this machine's, or no free run found.
    """

    def __init__(self, bind: str, processes: int) -> None:
        self.host, port = parse_endpoint(bind, allow_zero=True)
        self.processes = processes
        count = 2 + 2 * processes
        if port:
            self.sockets = _listen_run(self.host, port, count)
        else:
            self.sockets = _free_run(self.host, count)
        self.port = self.sockets[0].getsockname()[1]

    @property
    def endpoint(self) -> str:
        """The public base endpoint."""
        return f"{self.host}:{self.port}"

    @property
    def slots(self) -> tuple[int, ...]:
        """Every slot's base port."""
        return tuple(self.port + 2 + 2 * slot for slot in range(self.processes))

    def backend(self, slot: int, directory: str, seats: Any = None, seat: int = 0) -> DirectBackend:
        """What the child of ``slot`` binds (and its row ``seat`` of ``seats``, ``seats.py``)."""
        fds = tuple(sock.fileno() for sock in (*self.sockets[:2], *self.sockets[2 + 2 * slot:4 + 2 * slot]))
        return DirectBackend(self.host, self.port, slot, self.slots, fds, directory,  # type: ignore[arg-type]
                             seat, seats)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def bind_inherited(sock: zmq.Socket, fd: int, endpoint: str) -> str:
    """Bind ``sock`` to ``endpoint`` by accepting on a copy of the listening descriptor ``fd``
    (``ZMQ_USE_FD``); returns the bound endpoint (``ZMQ_LAST_ENDPOINT``, for the unbind).

    The descriptor is made non-blocking first (``O_NONBLOCK`` belongs to the listening socket's open file, so
    every copy, in every child, shares it). libzmq leaves a ``ZMQ_USE_FD`` socket as it finds it, and calls
    ``accept4`` whenever epoll says the socket is readable; a connection to the shared public pair wakes every
    child, and a child that lost the race to a sibling would block in ``accept4`` on a blocking socket, its
    whole I/O thread with it, until the next connection to that port (issue 22: its slot's connections waited
    in the kernel's accept queue)."""
    copy = os.dup(fd)
    try:
        os.set_blocking(copy, False)
        sock.setsockopt(zmq.USE_FD, copy)
        sock.bind(endpoint)
    except zmq.ZMQError:
        os.close(copy)
        raise
    finally:
        sock.setsockopt(zmq.USE_FD, -1)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _address(host: str) -> tuple[socket.AddressFamily, str]:
    name = host[len("tcp://"):]
    if name.startswith("["):
        return socket.AF_INET6, name.strip("[]")
    if name == "*":
        return socket.AF_INET, "0.0.0.0"
    return socket.AF_INET, name


def _listen(host: str, port: int) -> socket.socket:
    family, address = _address(host)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def _open_run(host: str, port: int, count: int) -> list[socket.socket]:
    """Listen on ``port`` .. ``port + count - 1``. :raises OSError: one cannot be bound (``filename``: its port)."""
    opened: list[socket.socket] = []
    try:
        for each in range(port, port + count):
            try:
                opened.append(_listen(host, each))
            except OSError as exc:
                exc.filename = each
                raise
    except BaseException:
        for sock in opened:
            sock.close()
        raise
    return opened


def _listen_run(host: str, port: int, count: int) -> list[socket.socket]:
    """`_open_run`, with an operator's mistake as a one-line error. :raises ConfigurationError: as it says."""
    hints = {errno.EADDRINUSE: "another process listens there: stop it, or choose another port",
             errno.EADDRNOTAVAIL: "that is not an address of this machine"}
    try:
        return _open_run(host, port, count)
    except OSError as exc:
        if exc.errno not in hints:
            raise
        raise ConfigurationError(
            f"cannot bind {host}:{exc.filename}: {exc.strerror} ({hints[exc.errno]}; a direct prefork worker "
            f"listens on ports {port}..{port + count - 1})", setting="bind") from None


def _free_run(host: str, count: int) -> list[socket.socket]:
    """Listen on a free run of ``count`` ports. :raises ConfigurationError: none found, or as `_listen_run`."""
    low, high = FREE_PORTS
    for _ in range(FREE_RUN_TRIES):
        port = random.randrange(low, high - count)
        try:
            return _open_run(host, port, count)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return _listen_run(host, port, count)  # fails the same way: its one-line error
    raise ConfigurationError(f"found no {count} free ports in a row on {host}", setting="bind")
