"""Worker endpoints: ``tcp://HOST:PORT``, with jobs (ROUTER) on PORT and calls (ROUTER) on PORT+1."""

from __future__ import annotations

import ipaddress
import re

from ..errors import ConfigurationError

_ENDPOINT = re.compile(r"^tcp://(?P<host>\[[^\]]+\]|[^:/\s\[\]]+):(?P<port>\d{1,5})$")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def parse_endpoint(endpoint: str, *, allow_zero: bool = False) -> tuple[str, int]:
    """Split ``"tcp://HOST:PORT"`` into ``("tcp://HOST", PORT)``.

    HOST is an IPv4 address, an IPv6 address in brackets (``tcp://[::1]:5555``),
    or an ASCII host name (the client resolves it to every address it has,
    ``client/discovery.py``; encode an international name with IDNA, ``xn--...``).

    :param allow_zero: for binding: also accept PORT 0 ("pick a free port")
        and HOST ``*`` (every interface).
    :raises ConfigurationError: anything else, naming the endpoint: not
        ``tcp://HOST:PORT``, PORT outside 1..65534 (0 if allowed), a ``*``
        host to connect to, a malformed address, a non-ASCII name.
    """
    match = _ENDPOINT.match(endpoint.strip()) if isinstance(endpoint, str) else None
    port = int(match["port"]) if match else -1
    if match is None or not (1 <= port <= 65534 or (allow_zero and port == 0)):
        raise ConfigurationError(
            f"worker endpoint must look like tcp://HOST:PORT (jobs on PORT, rpc on PORT+1), got {endpoint!r}",
            setting="endpoint",
        )
    problem = _host_problem(match["host"], allow_zero)
    if problem:
        raise ConfigurationError(f"worker endpoint {endpoint!r}: {problem}", setting="endpoint")
    return f"tcp://{match['host']}", port


def _host_problem(host: str, binding: bool) -> str:
    """Why ``host`` cannot work, or ``""``."""
    if host == "*":
        return "" if binding else "'*' binds every interface; a client must name the worker's host or address"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address"
        return ""
    if not host.isascii():
        return f"host {host!r} is not ASCII: encode an international name with IDNA (xn--...)"
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address"
        return ""
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in host.split(".")):
        return f"{host!r} is not a valid host name"
    return ""


def check_distinct(pairs: list[tuple[str, int]], names: list[str]) -> None:
    """Refuse an endpoint listed twice, or one whose port pair overlaps another's."""
    seen: dict[tuple[str, int], str] = {}
    for (host, port), name in zip(pairs, names):
        key = (host.lower(), port)
        for other_port in (port - 1, port, port + 1):
            other = seen.get((key[0], other_port))
            if other is not None:
                what = "is listed twice" if other_port == port else "overlaps (a worker uses PORT and PORT+1)"
                raise ConfigurationError(f"worker endpoint {name!r} {what}: {other!r}", setting="endpoints")
        seen[key] = name


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


def nameserver(resolver: str, setting: str = "resolver") -> tuple[str, int]:
    """A nameserver ``"HOST[:PORT]"`` (``"[V6]:PORT"`` for IPv6 with a port) as ``(address, port)``;
    port 53 by default.

    :raises ConfigurationError: not an IP address with an optional port 1..65535 (naming ``setting``).
    """
    text = resolver.strip()
    host, port = text, "53"
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("" if rest else "53")
    elif text.count(":") == 1:
        host, port = text.split(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        port = ""
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigurationError(f"{setting} must be a nameserver's IP address with an optional port "
                                 f"(127.0.0.1:8600, [::1]:53), got {resolver!r}", setting=setting)
    return host, int(port)
