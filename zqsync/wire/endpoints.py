"""Worker endpoints: ``tcp://HOST:PORT``, with jobs (PULL) on PORT and calls (ROUTER) on PORT+1."""

from __future__ import annotations

import ipaddress
import re

from ..errors import ConfigurationError

_ENDPOINT = re.compile(r"^tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):(?P<port>\d{1,5})$")


def parse_endpoint(endpoint: str, *, allow_zero: bool = False) -> tuple[str, int]:
    """Split ``"tcp://HOST:PORT"`` into ``("tcp://HOST", PORT)``.

    :param allow_zero: accept PORT 0 ("pick a free port", for binding).
    :raises ConfigurationError: not ``tcp://HOST:PORT`` with PORT in 1..65534 (or 0 if allowed).
    """
    match = _ENDPOINT.match(endpoint.strip()) if isinstance(endpoint, str) else None
    port = int(match["port"]) if match else -1
    if match is None or not (1 <= port <= 65534 or (allow_zero and port == 0)):
        raise ConfigurationError(
            f"worker endpoint must look like tcp://HOST:PORT (jobs on PORT, rpc on PORT+1), got {endpoint!r}",
            setting="endpoint",
        )
    return f"tcp://{match['host']}", port


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """Map a worker's base endpoint to its ``(jobs, rpc)`` endpoints.

    ``"tcp://127.0.0.1:5555"`` gives ``("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556")``.

    :raises ConfigurationError: not a ``tcp://HOST:PORT`` endpoint with 1 <= PORT <= 65534.
    """
    host, port = parse_endpoint(endpoint)
    return f"{host}:{port}", f"{host}:{port + 1}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (from ``tcp://HOST:PORT``) is a loopback address or ``localhost``."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
