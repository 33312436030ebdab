"""The client layer: ``Client`` and the socket pool under it.

``client.py`` sends jobs and calls; ``pool.py`` leases connected sockets per
owner (``owner.py``) under per-owner permits (``permits.py``);
``transport.py`` bounds every send and receive by a deadline;
``congestion.py`` decides what an enqueue does when a worker is slow;
``rendezvous.py`` and ``health.py`` pick a confirmed job's worker and skip dead ones; and
``lifecycle.py`` rebuilds pools after ``fork`` and closes them at exit.
"""

from .client import Client, call, close_all, default_client, enqueue

__all__ = ["Client", "call", "close_all", "default_client", "enqueue"]
