"""Every default zqsync uses, with its unit, in one place (as RQ's ``defaults.py``).

Environment variables are read by `ClientSettings.from_env`, which
constructors call. Nothing is read at import time, so a process can set
``ZQSYNC_*`` after importing zqsync and before building a client.

========================== ======================== ============ ===========
environment variable       field                    unit         default
========================== ======================== ============ ===========
``ZQSYNC_ENDPOINT``        endpoint (default client) URL list    (none)
``ZQSYNC_POOL_SIZE``       pool_size                sockets      4
``ZQSYNC_LEASE_TIMEOUT``   lease_timeout            seconds      5.0
``ZQSYNC_CALL_TIMEOUT``    call_timeout             seconds      10.0
``ZQSYNC_SEND_TIMEOUT``    send_timeout             seconds      1.0
``ZQSYNC_CONFIRM_TIMEOUT`` confirm_timeout          seconds      10.0
``ZQSYNC_CONFIRM_RETRY``   confirm_retry            seconds      1.0
``ZQSYNC_CONGESTION``      congestion               block|drop   block
``ZQSYNC_WAIT_BEFORE_DROP`` wait_before_drop        seconds      0.001
``ZQSYNC_LINGER``          linger                   seconds      1.0
``ZQSYNC_HWM``             hwm                      messages     1000
``ZQSYNC_MAX_SOCKETS``     max_sockets              sockets      4096
``ZQSYNC_HEARTBEAT``       heartbeat (0: off)       seconds      1.0
``ZQSYNC_CONNECT_TIMEOUT`` connect_timeout (0: OS)  seconds      2.0
``ZQSYNC_RESOLVER``        resolver ("": system's)  HOST[:PORT]  ""
``ZQSYNC_RESOLVE_INTERVAL`` resolve_interval        seconds      10.0
``ZQSYNC_PROBE_TIMEOUT``   probe_timeout            seconds      0.5
``ZQSYNC_PROBE_BACKOFF``   probe_backoff            seconds      0.5
``ZQSYNC_PROBE_BACKOFF_MAX`` probe_backoff_max      seconds      5.0
``ZQSYNC_EXPAND_PREFORK``  expand_prefork           0|1          0
========================== ======================== ============ ===========

Durations are finite, at most `MAX_SECONDS`; ``call_timeout`` and
``confirm_timeout`` are more than 0 and ``confirm_retry`` at least
`MIN_CONFIRM_RETRY` (0.1 s). ``heartbeat`` drives ZMTP heartbeats on
call (DEALER) sockets and TCP keepalive on job (send-only DEALER) sockets (``pool.py``).
``resolver`` and ``resolve_interval`` (more than 0) apply to endpoints that name hosts
(``client/discovery.py``): the nameserver asked instead of the system's resolver, and the seconds
between two look-ups of a name (a shorter TTL in the answer wins).
The ``probe_*`` settings find a dead worker among several (``client/health.py``): a confirm
attempt that no connection takes within ``probe_timeout``, or that goes unanswered while a probe
(a ``zqsync.ping`` on a new connection, bounded by ``probe_timeout``) finds no connection, marks
the worker down; it is probed again ``probe_backoff`` seconds later, the wait doubling up to
``probe_backoff_max``, and is up again once a probe is answered. All three are more than 0.
``expand_prefork`` (``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``) makes the client ask each
worker endpoint for the slots a direct prefork worker announces and send to those, one endpoint per child,
asked again every ``resolve_interval`` (``client/announce.py``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable, Mapping, NamedTuple, Optional

from .errors import ConfigurationError
from .wire.endpoints import nameserver, parse_endpoint
from .wire.envelope import MAX_MESSAGE_SIZE

POOL_SIZE = 4
LEASE_TIMEOUT = 5.0
CALL_TIMEOUT = 10.0
SEND_TIMEOUT = 1.0
CONFIRM_TIMEOUT = 10.0
CONFIRM_RETRY = 1.0
CONGESTION = "block"
WAIT_BEFORE_DROP = 0.001
LINGER = 1.0
HWM = 1000
MAX_SOCKETS = 4096
HEARTBEAT = 1.0
CONNECT_TIMEOUT = 2.0
RESOLVER = ""
RESOLVE_INTERVAL = 10.0
PROBE_TIMEOUT = 0.5
PROBE_BACKOFF = 0.5
PROBE_BACKOFF_MAX = 5.0
EXPAND_PREFORK = False

#: Longest duration any setting accepts, seconds (libzmq takes milliseconds as a C int).
MAX_SECONDS = 1_000_000.0
#: Shortest wait for a confirmation before a retry, seconds: a journal commit takes milliseconds,
#: and a shorter wait only floods the worker with duplicates.
MIN_CONFIRM_RETRY = 0.1

#: Worker defaults (`WorkerSettings`).
CONCURRENCY = 100
GRACEFUL_TIMEOUT = 30.0
BIND = "tcp://127.0.0.1:5555"
WORKER_HWM = 1000
JOURNAL_SYNC = "NORMAL"
JOURNAL_BUSY_TIMEOUT = 30.0
#: Seconds a worker's ownership of its PostgreSQL journal rows lasts unless renewed (``journal_pg.py``).
JOURNAL_LEASE = 10.0
KEEP_DONE = 3600.0
KEEP_DEAD = 7 * 86400.0
HARD_GRACE = 5.0
#: TCP keepalive of the sockets clients connect to (``worker/binding.py``), seconds: a connection silent for
#: KEEPALIVE_IDLE is probed every KEEPALIVE_INTERVAL and closed after ``binding.KEEPALIVE_PROBES`` unanswered probes.
KEEPALIVE_IDLE = 60.0
KEEPALIVE_INTERVAL = 10.0
#: Longest keepalive idle time or interval, seconds (Linux's TCP_KEEPIDLE and TCP_KEEPINTVL limit).
MAX_KEEPALIVE = 32767.0


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{name} must be an integer, got {value!r}", setting=name) from exc
    if number < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum}, got {number}", setting=name)
    return number


def check_seconds(name: str, value: Any, minimum: float = 0.0, *, inclusive: bool = True) -> float:
    """``value`` as float seconds, finite, at most `MAX_SECONDS` and at least ``minimum``
    (more than ``minimum`` if not ``inclusive``).

    :raises ConfigurationError: anything else (NaN, infinity, a negative number, a non-number),
        naming ``name``.
    """
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}", setting=name) from exc
    low_ok = number >= minimum if inclusive else number > minimum
    if not (math.isfinite(number) and low_ok and number <= MAX_SECONDS):
        bound = f"{'>=' if inclusive else '>'} {minimum:g}"
        raise ConfigurationError(f"{name} must be {bound} and <= {MAX_SECONDS:g} seconds, got {value!r}", setting=name)
    return number


def _seconds(name: str, value: Any) -> float:
    return check_seconds(name, value)


def _deadline(name: str, value: Any) -> float:
    """A deadline: 0 would fail every request before it is sent."""
    return check_seconds(name, value, 0.0, inclusive=False)


def _keepalive(name: str, value: Any) -> float:
    """Whole seconds (rounded up) from 1 to `MAX_KEEPALIVE`: what a TCP keepalive option takes."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 1.0 <= number <= MAX_KEEPALIVE:  # NaN fails this too
        raise ConfigurationError(f"{name} must be from 1 to {MAX_KEEPALIVE:g} seconds, got {value!r}", setting=name)
    return float(math.ceil(number))


def _confirm_retry(name: str, value: Any) -> float:
    return check_seconds(name, value, MIN_CONFIRM_RETRY)


def _flag(name: str, value: Any) -> bool:
    """A boolean, or its spelling in an environment variable."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ConfigurationError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {value!r}", setting=name)
    return text in ("1", "true", "yes", "on")


def _congestion(name: str, value: Any) -> str:
    text = str(getattr(value, "value", value)).lower()
    if text not in ("block", "drop"):
        raise ConfigurationError(f"{name} must be 'block' or 'drop', got {value!r}", setting=name)
    return text


def _resolver(name: str, value: Any) -> str:
    """``""`` (the system's resolver) or a nameserver ``HOST[:PORT]``."""
    text = str(value).strip()
    if text:
        nameserver(text, name)
    return text


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """Resolved client and pool settings. Durations are seconds as floats."""

    pool_size: int = POOL_SIZE
    lease_timeout: float = LEASE_TIMEOUT
    call_timeout: float = CALL_TIMEOUT
    send_timeout: float = SEND_TIMEOUT
    confirm_timeout: float = CONFIRM_TIMEOUT
    confirm_retry: float = CONFIRM_RETRY
    congestion: str = CONGESTION
    wait_before_drop: float = WAIT_BEFORE_DROP
    linger: float = LINGER
    hwm: int = HWM
    max_sockets: int = MAX_SOCKETS
    heartbeat: float = HEARTBEAT
    connect_timeout: float = CONNECT_TIMEOUT
    resolver: str = RESOLVER
    resolve_interval: float = RESOLVE_INTERVAL
    probe_timeout: float = PROBE_TIMEOUT
    probe_backoff: float = PROBE_BACKOFF
    probe_backoff_max: float = PROBE_BACKOFF_MAX
    expand_prefork: bool = EXPAND_PREFORK

    _ENV = {
        "pool_size": ("ZQSYNC_POOL_SIZE", lambda n, v: _positive_int(n, v, 1)),
        "lease_timeout": ("ZQSYNC_LEASE_TIMEOUT", _seconds),
        "call_timeout": ("ZQSYNC_CALL_TIMEOUT", _deadline),
        "send_timeout": ("ZQSYNC_SEND_TIMEOUT", _seconds),
        "confirm_timeout": ("ZQSYNC_CONFIRM_TIMEOUT", _deadline),
        "confirm_retry": ("ZQSYNC_CONFIRM_RETRY", _confirm_retry),
        "congestion": ("ZQSYNC_CONGESTION", _congestion),
        "wait_before_drop": ("ZQSYNC_WAIT_BEFORE_DROP", _seconds),
        "linger": ("ZQSYNC_LINGER", _seconds),
        "hwm": ("ZQSYNC_HWM", lambda n, v: _positive_int(n, v, 0)),
        "max_sockets": ("ZQSYNC_MAX_SOCKETS", lambda n, v: _positive_int(n, v, 1)),
        "heartbeat": ("ZQSYNC_HEARTBEAT", _seconds),
        "connect_timeout": ("ZQSYNC_CONNECT_TIMEOUT", _seconds),
        "resolver": ("ZQSYNC_RESOLVER", _resolver),
        "resolve_interval": ("ZQSYNC_RESOLVE_INTERVAL", _deadline),
        "probe_timeout": ("ZQSYNC_PROBE_TIMEOUT", _deadline),
        "probe_backoff": ("ZQSYNC_PROBE_BACKOFF", _deadline),
        "probe_backoff_max": ("ZQSYNC_PROBE_BACKOFF_MAX", _deadline),
        "expand_prefork": ("ZQSYNC_EXPAND_PREFORK", _flag),
    }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "ClientSettings":
        """Resolve settings: explicit keyword overrides, then ``ZQSYNC_*`` variables, then defaults.

        :param env: the environment to read (default ``os.environ``), read now.
        :param overrides: field values; ``None`` means "not given".
        :raises ConfigurationError: a value is malformed or out of range; the
            error names the environment variable or argument.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, (var, check) in cls._ENV.items():
            check_fn: Callable[[str, Any], Any] = check  # type: ignore[assignment]
            given = overrides.pop(field, None)
            if given is not None:
                values[field] = check_fn(field, given)
            elif env.get(var, "").strip():
                values[field] = check_fn(var, env[var].strip())
        if overrides:
            raise ConfigurationError(f"unknown settings: {sorted(overrides)}")
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> "ClientSettings":
        """A copy with the given fields replaced (``None`` means "keep"), checked like `from_env`."""
        merged = {**dataclasses.asdict(self), **{key: value for key, value in overrides.items() if value is not None}}
        return ClientSettings.from_env(env={}, **merged)


def _journal_sync(name: str, value: Any) -> str:
    text = str(value).upper()
    if text not in ("NORMAL", "FULL"):
        raise ConfigurationError(f"{name} must be NORMAL or FULL (SQLite's synchronous), got {value!r}", setting=name)
    return text


def _journal(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    from .worker.journal_api import parse_journal_url

    parse_journal_url(value, setting=name)
    return str(value).strip()


def _bind(name: str, value: Any) -> str:
    parse_endpoint(value, allow_zero=True)
    return str(value).strip()


class QueueSpec(NamedTuple):
    """A named job queue of a worker (``--queue NAME[:CONCURRENCY]=ENDPOINT``).

    :ivar name: the queue's name (letters, digits, ``_``, ``-``).
    :ivar concurrency: its own task slots, or ``None`` for the worker's ``concurrency``.
    :ivar endpoint: ``tcp://HOST:PORT`` where its jobs (ROUTER) socket binds; port 0 picks one.
    """

    name: str
    concurrency: Optional[int]
    endpoint: str


_QUEUE = re.compile(r"^([A-Za-z0-9_-]+)(?::(\d+))?=(.+)$")


def _queues(name: str, value: Any) -> tuple[QueueSpec, ...]:
    specs = []
    for item in value or ():
        if isinstance(item, QueueSpec):
            specs.append(item)
            continue
        match = _QUEUE.match(str(item))
        try:
            if match is None:
                raise ConfigurationError("not NAME[:CONCURRENCY]=ENDPOINT")
            concurrency = None if match[2] is None else _positive_int("concurrency", match[2])
            specs.append(QueueSpec(match[1], concurrency, _bind(name, match[3])))
        except ConfigurationError as exc:
            raise ConfigurationError(f"a queue is NAME[:CONCURRENCY]=tcp://HOST:PORT, got {item!r}: {exc}",
                                     setting="queue") from None
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"queue names must differ, got {names}", setting="queue")
    return tuple(specs)


def _optional_path(name: str, value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and value):
        raise ConfigurationError(f"{name} must be a path or None, got {value!r}", setting=name)
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}", setting=name)
    return value


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """Resolved settings of one worker process (``zqsync worker`` builds them once from its flags).

    :ivar bind: base endpoint ``tcp://HOST:PORT``; jobs bind PORT and calls PORT+1; PORT 0 picks a free pair.
    :ivar concurrency: task slots (greenlets), at least 1.
    :ivar graceful_timeout: seconds a warm shutdown waits for in-flight tasks.
    :ivar hwm: receive high-water mark of the jobs and rpc sockets, messages.
    :ivar max_message_size: bytes; larger frames are refused by ZeroMQ (``ZMQ_MAXMSGSIZE``).
    :ivar state_dir: directory of the SQLite journal of confirmed jobs; ``None`` (and no ``journal``)
        refuses confirmed jobs.
    :ivar journal: the journal's URL: ``sqlite:///PATH`` (the same as ``state_dir=PATH``) or
        ``postgresql://USER@HOST:PORT/DB`` (one database shared by a fleet); see `journal_url`.
    :ivar journal_sync: SQLite ``synchronous``, ``"NORMAL"`` or ``"FULL"``.
    :ivar journal_busy_timeout: seconds to wait for another process's journal write lock.
    :ivar journal_lease: seconds a worker process's lease on its PostgreSQL journal rows lasts unless
        renewed (every third of it); once it expires, other workers take its jobs over.
    :ivar keep_done: seconds ``done`` rows stay journaled (duplicate detection, results).
    :ivar keep_dead: seconds dead-lettered rows stay journaled.
    :ivar hard_grace: seconds past a task's time limit before a blocked worker process ends (``watchdog.py``).
    :ivar keepalive_idle: seconds a client connection may be silent before the worker's kernel probes it
        (TCP keepalive; whole seconds, rounded up, 1 to 32767).
    :ivar keepalive_interval: seconds between probes; a connection is closed after three unanswered ones.
    :ivar curve_secret_key: the worker's ``.key_secret`` file; with ``allow_client_keys``, CURVE only.
    :ivar allow_client_keys: directory of allowed client public keys (``*.key``).
    :ivar queues: named job queues, highest priority first (`QueueSpec`,
        or their ``NAME[:CONCURRENCY]=ENDPOINT`` text).
    :ivar remote_tracebacks: send a failed call's formatted traceback to the client; ``False``
        sends only the exception's type and message (untrusted clients, secrets in paths or values).

    Every field is checked when the object is built, by the same validators
    the client's settings use. :raises ConfigurationError: naming the field.
    """

    bind: str = BIND
    concurrency: int = CONCURRENCY
    graceful_timeout: float = GRACEFUL_TIMEOUT
    hwm: int = WORKER_HWM
    max_message_size: int = MAX_MESSAGE_SIZE
    state_dir: Optional[str] = None
    journal: Optional[str] = None
    journal_sync: str = JOURNAL_SYNC
    journal_busy_timeout: float = JOURNAL_BUSY_TIMEOUT
    journal_lease: float = JOURNAL_LEASE
    keep_done: float = KEEP_DONE
    keep_dead: float = KEEP_DEAD
    hard_grace: float = HARD_GRACE
    keepalive_idle: float = KEEPALIVE_IDLE
    keepalive_interval: float = KEEPALIVE_INTERVAL
    curve_secret_key: Optional[str] = None
    allow_client_keys: Optional[str] = None
    queues: tuple[QueueSpec, ...] = ()
    remote_tracebacks: bool = True

    _CHECKS = {
        "bind": _bind,
        "concurrency": _positive_int,
        "graceful_timeout": _seconds,
        "hwm": lambda n, v: _positive_int(n, v, 0),
        "max_message_size": _positive_int,
        "state_dir": _optional_path,
        "journal": _journal,
        "journal_sync": _journal_sync,
        "journal_busy_timeout": _seconds,
        "journal_lease": _deadline,
        "keep_done": _seconds,
        "keep_dead": _seconds,
        "hard_grace": _deadline,
        "keepalive_idle": _keepalive,
        "keepalive_interval": _keepalive,
        "curve_secret_key": _optional_path,
        "allow_client_keys": _optional_path,
        "queues": _queues,
        "remote_tracebacks": _bool,
    }

    def __post_init__(self) -> None:
        for field, check in self._CHECKS.items():
            object.__setattr__(self, field, check(field, getattr(self, field)))  # type: ignore[operator]
        if self.state_dir and self.journal and self.journal_url != f"sqlite:///{self.state_dir}":
            raise ConfigurationError(f"give the journal once: --state-dir {self.state_dir} or --journal {self.journal}",
                                     setting="journal")
        if bool(self.curve_secret_key) != bool(self.allow_client_keys):
            raise ConfigurationError("CURVE needs both a secret key and a directory of allowed client keys",
                                     setting="curve_secret_key")

    @property
    def keepalive(self) -> tuple[float, float]:
        """``(keepalive_idle, keepalive_interval)``, seconds."""
        return self.keepalive_idle, self.keepalive_interval

    @property
    def journal_url(self) -> Optional[str]:
        """The journal's URL (``journal``, or ``sqlite:///STATE_DIR``), or ``None``: no journal."""
        if self.journal:
            return self.journal
        return f"sqlite:///{self.state_dir}" if self.state_dir else None

    def replace(self, **overrides: Any) -> "WorkerSettings":
        """A copy with ``overrides`` (field names; ``None`` keeps a field), checked again.

        :raises ConfigurationError: an unknown field or a bad value.
        """
        unknown = set(overrides) - set(self._CHECKS)
        if unknown:
            raise ConfigurationError(f"unknown worker settings: {sorted(unknown)}", setting=sorted(unknown)[0])
        return dataclasses.replace(self, **{key: value for key, value in overrides.items() if value is not None})


def default_endpoint(env: Mapping[str, str] | None = None) -> list[str]:
    """The endpoints named by ``ZQSYNC_ENDPOINT`` (comma-separated).

    :raises ConfigurationError: the variable is unset or empty.
    """
    env = os.environ if env is None else env
    raw = env.get("ZQSYNC_ENDPOINT", "")
    endpoints = [part.strip() for part in raw.split(",") if part.strip()]
    if not endpoints:
        raise ConfigurationError(
            "ZQSYNC_ENDPOINT is not set: set it to a worker endpoint such as tcp://127.0.0.1:5555, "
            "or build a zqsync.Client(endpoint) yourself",
            setting="ZQSYNC_ENDPOINT",
        )
    return endpoints
