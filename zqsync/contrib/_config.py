"""Build a `Client` from a framework's settings (shared by the Flask and Django integrations)."""

from __future__ import annotations

import atexit
import dataclasses
import weakref
from typing import Any, Mapping, Optional, Sequence, Union

from ..client.client import Client
from ..errors import ConfigurationError
from ..settings import ClientSettings
from ..wire.curve import Curve

#: Seconds a client may spend flushing queued jobs when the process exits.
EXIT_LINGER = 1.0
#: Clients built here, held weakly: an app let go takes its client (and its sockets) with it.
_built: "weakref.WeakSet[Client]" = weakref.WeakSet()


def endpoint_list(value: Union[str, Sequence[str], None], *, setting: str) -> list[str]:
    """Endpoints from a comma-separated string or a list of strings.

    :raises ConfigurationError: none given, or not strings.
    """
    parts = value.split(",") if isinstance(value, str) else list(value or [])
    if not all(isinstance(part, str) for part in parts):
        raise ConfigurationError(f"{setting} must be a str or a list of str, got {value!r}", setting=setting)
    endpoints = [part.strip() for part in parts if part.strip()]
    if not endpoints:
        raise ConfigurationError(
            f"{setting} is not set: set it to a worker endpoint such as tcp://127.0.0.1:5555", setting=setting
        )
    return endpoints


def client_options(options: Optional[Mapping[str, Any]], *, setting: str) -> dict[str, Any]:
    """Validate keyword arguments for `Client`.

    ``curve`` may be a `Curve` or a pair of file paths
    ``(worker's NAME.key, this client's NAME.key_secret)``.

    :raises ConfigurationError: an option ``Client`` does not take, or a bad ``curve``.
    """
    options = dict(options or {})
    accepted = {field.name for field in dataclasses.fields(ClientSettings)} | {"curve"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigurationError(
            f"{setting}: unknown client option(s) {', '.join(unknown)}; known: {', '.join(sorted(accepted))}",
            setting=setting,
        )
    curve = options.get("curve")
    if curve is not None and not isinstance(curve, Curve):
        if not (isinstance(curve, (list, tuple)) and len(curve) == 2):
            raise ConfigurationError(
                f"{setting}: curve must be a zqsync.Curve or a pair of key file paths (server NAME.key, "
                f"client NAME.key_secret), got {curve!r}", setting=setting,
            )
        options["curve"] = Curve.from_files(*curve)
    return options


def build_client(endpoints: Union[str, Sequence[str], None], options: Optional[Mapping[str, Any]], *,
                 endpoints_setting: str, options_setting: str) -> Client:
    """A `Client` for these settings, closed at interpreter exit within `EXIT_LINGER` s
    if it is still in use then; one no longer referenced (its app let go) is garbage collected, sockets and all.

    Building a client opens no socket: each process (and each gevent hub or
    thread) opens its own on first use, so building it before gunicorn forks is safe.

    :raises ConfigurationError: missing endpoints, a malformed endpoint or an unknown option.
    """
    client = Client(endpoint_list(endpoints, setting=endpoints_setting),
                    **client_options(options, setting=options_setting))
    if not _built:
        atexit.register(_close_built)  # one hook, holding no client (one per client kept every app's alive)
    _built.add(client)
    return client


def _close_built() -> None:
    for client in list(_built):
        client.close(linger=EXIT_LINGER)
