"""Discovery: worker endpoints named by DNS, expanded to one endpoint per address and re-resolved.

libzmq connects a ``tcp://NAME:PORT`` endpoint to the first address ``getaddrinfo`` returns (libzmq
#2297) and never looks again. A `Client` whose endpoints name hosts therefore resolves them
itself, here, and dials every address:

* ``tcp://NAME:PORT``: one endpoint ``tcp://ADDRESS:PORT`` per address of NAME, in the order the
  resolver gave them: its A addresses, or when it has none its AAAA ones (``tcp://[ADDRESS]:PORT``).
  A dual-stack host has one of each, and a worker that binds ``*`` or ``0.0.0.0`` listens on IPv4
  only: dialling both would count each such worker twice, once unreachable (``localhost`` is
  ``127.0.0.1`` and ``::1`` on most systems), and confirmed jobs preferring the IPv6 twin would wait
  out the failover bound. IPv4 is also what libzmq picked for a name. A worker reached over IPv6
  binds an IPv6 address, and its name then has only AAAA records.
* ``srv://NAME``: the SRV records of ``_zqsync._tcp.NAME``: one endpoint per address of each
  target, on the record's port (the worker's base port). Priority and weight are ignored: every
  target is a worker, and the client spreads over all of them.
* a literal address (``tcp://10.0.0.5:5555``, ``tcp://[::1]:5555``): itself. A client whose
  endpoints are all literal builds no `Discovery` at all, and pays nothing for it, unless it
  sets ``expand_prefork``: then every endpoint found is also asked for the slots a direct prefork
  worker announces, and stands for them (``announce.py``).

Names go to the system's resolver (``getaddrinfo``: ``/etc/hosts``, search domains, nsswitch), as
libzmq did, unless the ``resolver`` setting names a nameserver (``HOST`` or ``HOST:PORT``, for
Consul's DNS on port 8600, say), which is then asked directly with dnspython. SRV look-ups always
use dnspython (``pip install zqsync[dns]``), with the system's ``resolv.conf`` unless ``resolver``
is set.

A name is looked up again every ``resolve_interval`` seconds, or sooner when a nameserver's answer
carries a shorter TTL (never more often than every `MIN_TTL` seconds); ``getaddrinfo``
reports no TTL, so the interval applies. The look-up is made by the first request that finds it
due, in that request, while every other request goes on with the endpoints known so far: no lock,
so no greenlet can wait on another's look-up. Until a look-up has found an address there are none to
go on with, so every request makes its own (a confirmed job sent meanwhile raised ``IndexError``).
A look-up that fails, or finds no address, keeps that name's previous endpoints (logged at
WARNING); only the very first one raises. The state is per process: a forked child starts from its
parent's endpoints and re-resolves on its own schedule.

The client then connects to new endpoints and drains vanished ones (``SocketPool.drain``).
Rendezvous hashing (``rendezvous.py``) ranks the expanded endpoints, so an address that appears or
vanishes moves only the confirmed job ids that prefer it.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import socket
import time
from typing import Any, Optional, Sequence

from ..errors import ConfigurationError, PoolError
from ..wire.endpoints import check_distinct, nameserver, parse_endpoint
from .announce import Announce, Expansion

log = logging.getLogger(__name__)

#: The SRV service label: ``srv://NAME`` looks up ``_zqsync._tcp.NAME``.
SRV_PREFIX = "_zqsync._tcp."
#: Shortest re-resolve interval a record's TTL can impose, seconds (Consul answers with TTL 0).
MIN_TTL = 1.0
#: Seconds one look-up (all its retries) may take at a nameserver given by ``resolver``.
LOOKUP_LIFETIME = 2.0


def discovery_for(names: Sequence[str], settings: Any, announce: Optional[Announce] = None) -> Optional["Discovery"]:
    """A `Discovery` for a client's configured base endpoints, or ``None`` when all are addresses
    and the client does not expand announced slots.

    :param settings: the client's `ClientSettings` (``resolver``, ``resolve_interval``,
        ``expand_prefork``).
    :param announce: with ``expand_prefork``, how to ask an endpoint for its slots (``announce.py``).
    :raises ConfigurationError: a malformed endpoint, one listed twice or overlapping another's port pair,
        or ``srv://``/``resolver`` without dnspython.
    """
    addressed = [name for name in names if not name.startswith("srv://")]
    pairs = [parse_endpoint(name) for name in addressed]
    check_distinct(pairs, addressed)
    for name in names:
        if name.startswith("srv://"):
            _check_srv(name)
    expansion = Expansion(announce) if announce is not None and settings.expand_prefork else None
    if expansion is None and len(pairs) == len(names) and all(_is_literal(host[len("tcp://"):]) for host, _ in pairs):
        return None
    return Discovery(names, settings.resolver, settings.resolve_interval, expansion)


def members(address: Any) -> tuple[str, ...]:
    """The endpoints of a pool address (one endpoint, or a tuple of them)."""
    return (address,) if isinstance(address, str) else tuple(address)


def _check_srv(name: str) -> None:
    """Refuse a malformed ``srv://NAME``. :raises ConfigurationError: naming it."""
    host = name[len("srv://"):]
    try:
        parse_endpoint(f"tcp://{host}:1")
    except ConfigurationError:
        raise ConfigurationError(f"SRV endpoint must look like srv://NAME (no port), got {name!r}",
                                 setting="endpoint") from None
    if _is_literal(host):
        raise ConfigurationError(f"SRV endpoint {name!r} names an address, not a DNS name", setting="endpoint")


class Discovery:
    """The base endpoints a set of configured ones expands to now, re-resolved when due (one per client).

    :param names: the configured base endpoints (``tcp://HOST:PORT`` or ``srv://NAME``).
    :param resolver: ``""`` for the system's resolver, or a nameserver ``HOST[:PORT]``.
    :param interval: seconds between look-ups of a name (a shorter TTL wins, down to `MIN_TTL`).
    :param expansion: expands the endpoints found into the slots they announce (``announce.py``).
    :raises ConfigurationError: ``srv://`` or a ``resolver`` without dnspython installed, or a malformed
        ``resolver``.
    """

    def __init__(self, names: Sequence[str], resolver: str, interval: float,
                 expansion: Optional[Expansion] = None) -> None:
        self.names = tuple(names)
        self._expansion = expansion
        self.interval = interval
        self._lookup = _Lookup(resolver, srv=any(name.startswith("srv://") for name in names))
        self._known: dict[str, tuple[str, ...]] = {}
        self._due = 0.0
        self.endpoints: tuple[str, ...] = ()

    def current(self) -> tuple[str, ...]:
        """The base endpoints now, after a look-up if one is due (made by this caller).

        Blocks for the look-up only when one is due, or no address is known yet: up to the resolver's
        timeouts (``getaddrinfo``'s, or `LOOKUP_LIFETIME` seconds per name at a ``resolver``),
        and with an expansion up to twice ``probe_timeout`` per endpoint asked; cooperatively under
        gevent's monkey-patching.

        :raises PoolError: no name resolved to any address yet (the message gives each one's error).
        """
        now = time.monotonic()
        if now < self._due and self.endpoints:
            return self.endpoints
        self._due = now + self.interval  # every other caller goes on with the endpoints known so far, if any
        ttl, problems = self.interval, []
        for name in self.names:
            try:
                found, name_ttl = self._expand(name)
            except Exception as exc:  # any failure of the system's or dnspython's resolver
                problems.append(f"{name}: {exc or type(exc).__name__}")
                continue
            if not found:
                problems.append(f"{name}: no address")
                continue
            if self._expansion is not None:
                found = self._expansion.expand(found)
            self._known[name] = found
            ttl = min(ttl, max(MIN_TTL, name_ttl))
        self._due = time.monotonic() + ttl
        self.endpoints = tuple(dict.fromkeys(e for name in self.names for e in self._known.get(name, ())))
        if not self.endpoints:
            self._due = 0.0
            raise PoolError(f"no worker endpoint: {'; '.join(problems)}")
        if problems:
            log.warning("re-resolving worker endpoints: %s; keeping the previous addresses of those",
                        "; ".join(problems))
        return self.endpoints

    def _expand(self, name: str) -> tuple[tuple[str, ...], float]:
        """``name``'s base endpoints and the TTL of the answer (seconds; ``inf`` when none was reported)."""
        if name.startswith("srv://"):
            return self._lookup.srv(SRV_PREFIX + name[len("srv://"):])
        host, port = parse_endpoint(name)
        host = host[len("tcp://"):]
        if _is_literal(host):
            return (name,), math.inf
        addresses, ttl = self._lookup.addresses(host)
        return tuple(_endpoint(address, port) for address in _one_family(addresses)), ttl


class _Lookup:
    """A/AAAA and SRV look-ups at the system's resolver or at one nameserver (``resolver``)."""

    def __init__(self, resolver: str, *, srv: bool) -> None:
        self._dns: Any = None
        if resolver or srv:
            self._dns = _dns_resolver(resolver)

    def addresses(self, host: str) -> tuple[list[str], float]:
        """Every address of ``host`` (IPv4 and IPv6, each once) and the answer's TTL in seconds."""
        if self._dns is None:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            return list(dict.fromkeys(str(info[4][0]) for info in infos)), math.inf
        found: list[str] = []
        ttl = math.inf
        for kind in ("A", "AAAA"):
            answer = self._resolve(host, kind)
            if answer is not None and answer.rrset is not None:
                found.extend(record.address for record in answer.rrset)
                ttl = min(ttl, answer.rrset.ttl)
        return found, ttl

    def srv(self, name: str) -> tuple[tuple[str, ...], float]:
        """The base endpoints of ``name``'s SRV records and the smallest TTL seen."""
        answer = self._resolve(name, "SRV")
        if answer is None or answer.rrset is None:
            return (), math.inf
        endpoints: list[str] = []
        ttl = float(answer.rrset.ttl)
        for record in answer.rrset:
            target = record.target.to_text(omit_final_dot=True)
            addresses, target_ttl = self.addresses(target)
            endpoints.extend(_endpoint(address, record.port) for address in _one_family(addresses))
            ttl = min(ttl, target_ttl)
        return tuple(endpoints), ttl

    def _resolve(self, name: str, kind: str) -> Any:
        """dnspython's answer, or ``None`` for a name that does not exist."""
        import dns.resolver

        try:
            return self._dns.resolve(name, kind, raise_on_no_answer=False, search=True)
        except dns.resolver.NXDOMAIN:
            return None


def _dns_resolver(resolver: str) -> Any:
    """A dnspython resolver: the system's configuration, or the one nameserver ``HOST[:PORT]``."""
    try:
        import dns.resolver
    except ImportError:
        raise ConfigurationError("srv:// endpoints and the resolver setting need dnspython: "
                                 "pip install 'zqsync[dns]'", setting="resolver") from None
    if not resolver:
        return dns.resolver.Resolver()
    host, port = nameserver(resolver)
    result = dns.resolver.Resolver(configure=False)
    result.nameservers = [host]
    result.port = port
    result.lifetime = LOOKUP_LIFETIME
    return result


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _one_family(addresses: list[str]) -> list[str]:
    """The IPv4 addresses of ``addresses``, or all of them (IPv6) when there is none (module docstring)."""
    ipv4 = [address for address in addresses if ":" not in address]
    return ipv4 or addresses


def _endpoint(address: str, port: int) -> str:
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"

