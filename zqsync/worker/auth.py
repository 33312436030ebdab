"""ZAP authentication for a worker's CURVE sockets (ZeroMQ RFC 27).

ZAP requests are answered by pyzmq's ``zmq.auth.Authenticator`` logic. pyzmq
ships thread and asyncio drivers but none for gevent; `GeventAuthenticator`
serves the ZAP socket from a greenlet with a ``zmq.green`` socket, so a
monkey-patched worker never blocks its hub on authentication. The prefork
supervisor, which has no gevent, uses pyzmq's ``ThreadAuthenticator``.
"""

from __future__ import annotations

import logging
from typing import Any, Coroutine

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from ..errors import ConfigurationError
from ..logs import RateLimitedLog
from ..wire.curve import check_allow_dir

log = logging.getLogger(__name__)
#: Seconds between two WARNING lines about refused CURVE clients (the rest are counted in the next line).
REFUSAL_LOG_INTERVAL = 10.0


def _drive(coroutine: Coroutine[Any, Any, Any]) -> None:
    # pyzmq's handle_zap_message is a coroutine only so that credential
    # callbacks may await; with keys loaded from a directory it never suspends.
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise ConfigurationError("ZAP handler suspended; asynchronous credential providers are not supported",
                             setting="allow_client_keys")


class _LoggedRefusals(zmq.auth.Authenticator):
    """Logs refused CURVE clients at WARNING, at most once every ``REFUSAL_LOG_INTERVAL`` seconds,
    and counts them in ``refused``."""

    allow_dir = ""
    refused = 0
    _refusals = RateLimitedLog(log, REFUSAL_LOG_INTERVAL)

    async def _authenticate_curve(self, domain: str, client_key: bytes) -> tuple[bool, bytes]:
        allowed, reason = await super()._authenticate_curve(domain, client_key)
        if not allowed:
            self.refused += 1
            self._refusals.warning("curve", "refused a CURVE client: public key %s is not in %s (%s)",
                                   z85.encode(client_key).decode(), self.allow_dir, reason.decode())
        return allowed, reason

    def client_keys(self) -> int:
        """How many allowed client public keys are loaded."""
        return len(self.certs.get("*", {}))


class GeventAuthenticator(_LoggedRefusals):
    """pyzmq's ZAP authenticator served from a greenlet (for monkey-patched processes).

    :param context: the context whose sockets use CURVE (a ``zmq.green.Context``).
    :param allow_dir: directory of allowed client public keys (``*.key``).
    """

    def __init__(self, context: zmq.Context, allow_dir: str) -> None:
        super().__init__(context)
        self.allow_dir = allow_dir
        self._greenlet: Any = None

    def start(self) -> None:
        """Bind the ZAP endpoint and start answering in a greenlet."""
        import gevent
        import zmq.green

        check_allow_dir(self.allow_dir)
        self.zap_socket = zmq.green.Socket(self.context, zmq.REP)
        self.zap_socket.linger = 1
        self.zap_socket.bind("inproc://zeromq.zap.01")
        self.configure_curve(domain="*", location=self.allow_dir)
        self._greenlet = gevent.spawn(self._serve)

    def _serve(self) -> None:
        while True:
            _drive(self.handle_zap_message(self.zap_socket.recv_multipart()))

    def stop(self) -> None:
        """Stop answering and close the ZAP socket."""
        if self._greenlet is not None:
            self._greenlet.kill()
        super().stop()


class _LoggedThreadAuthenticator(_LoggedRefusals, ThreadAuthenticator):
    pass


def start_thread_authenticator(context: zmq.Context, allow_dir: str) -> Any:
    """pyzmq's ``ThreadAuthenticator`` for a process without gevent (the prefork supervisor)."""
    check_allow_dir(allow_dir)
    authenticator = _LoggedThreadAuthenticator(context)
    authenticator.allow_dir = allow_dir
    authenticator.start()
    authenticator.configure_curve(domain="*", location=allow_dir)
    return authenticator


def curve_state(authenticator: Any) -> str:
    """``CURVE on, N client keys`` or ``CURVE off``, for a startup line."""
    return f"CURVE on, {authenticator.client_keys()} client keys" if authenticator is not None else "CURVE off"
