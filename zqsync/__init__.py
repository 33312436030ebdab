"""zqsync: pooled ZeroMQ job enqueue and RPC for gevent and synchronous Python.

Public API only; importing zqsync opens nothing and reads no environment.
"""

from .auth import Curve
from .client import Client, call, close_all, default_client, enqueue
from .congestion import CongestionControl
from .errors import (
    CallTimeout,
    ConfigurationError,
    Congested,
    DuplicateJob,
    JournalUnavailable,
    PoolError,
    ProtocolError,
    RemoteError,
    Unconfirmed,
    UnknownTask,
    ZqsyncError,
)
from .pool import SocketPool, ZqsyncWarning

__version__ = "0.1.0"

__all__ = [
    "CallTimeout",
    "Client",
    "ConfigurationError",
    "Curve",
    "Congested",
    "CongestionControl",
    "DuplicateJob",
    "JournalUnavailable",
    "PoolError",
    "ProtocolError",
    "RemoteError",
    "SocketPool",
    "Unconfirmed",
    "UnknownTask",
    "ZqsyncError",
    "ZqsyncWarning",
    "call",
    "close_all",
    "default_client",
    "enqueue",
]
