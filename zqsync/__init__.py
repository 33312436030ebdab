"""zqsync: pooled ZeroMQ job enqueue and RPC for gevent and synchronous Python.

Public API only; importing zqsync opens nothing and reads no environment.
The layers are drawn in docs/design.md ("Package layout").
"""

from .canvas import CanvasHandle, CanvasStatus, Signature, chain, chord, group
from .client.client import Client, call, close_all, default_client, enqueue
from .client.congestion import CongestionControl
from .client.jobs import JobStatus
from .client.pool import SocketPool
from .errors import (
    CallTimeout,
    ClientClosed,
    ConfigurationError,
    Congested,
    DeadlineExpired,
    DuplicateJob,
    EnqueuedInTransaction,
    JobCancelled,
    JobExpired,
    JobNotFound,
    JournalUnavailable,
    NoJournal,
    PoolError,
    ProtocolError,
    RemoteError,
    RequestRejected,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    Unconfirmed,
    UnknownTask,
    WorkerShutdown,
    WorkerStopping,
    ZqsyncError,
    ZqsyncWarning,
)
from .wire.curve import Curve

__version__ = "0.1.0"

__all__ = [
    "CallTimeout",
    "CanvasHandle",
    "CanvasStatus",
    "Signature",
    "chain",
    "chord",
    "group",
    "Client",
    "ClientClosed",
    "ConfigurationError",
    "Congested",
    "CongestionControl",
    "Curve",
    "DeadlineExpired",
    "NoJournal",
    "DuplicateJob",
    "EnqueuedInTransaction",
    "JobCancelled",
    "JobExpired",
    "JobNotFound",
    "JobStatus",
    "JournalUnavailable",
    "PoolError",
    "ProtocolError",
    "RemoteError",
    "RequestRejected",
    "SocketPool",
    "SoftTimeLimitExceeded",
    "TimeLimitExceeded",
    "Unconfirmed",
    "UnknownTask",
    "WorkerShutdown",
    "WorkerStopping",
    "ZqsyncError",
    "ZqsyncWarning",
    "call",
    "close_all",
    "default_client",
    "enqueue",
]
