"""Finding a job and waiting for it, for `AsyncClient` (``client/lookups.py``'s rules).

A job is asked for on its preferred worker first, then on the others in rendezvous rank;
``result`` long-polls the worker holding it in rounds of at most ``LONG_POLL`` seconds, and a
worker that dies, restarts or stops meanwhile only makes it look for the job again, until the
caller's timeout. The waits are awaits: the event loop runs meanwhile.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..client.jobs import JobStatus
from ..client.lookups import base_of, next_poll, remote_error_of
from ..client.rendezvous import rank
from ..errors import CallTimeout, PoolError, WorkerStopping

if TYPE_CHECKING:
    from .client import AsyncClient


async def result(client: "AsyncClient", job_id: str, total: float) -> Any:
    """Wait up to ``total`` seconds for ``job_id`` to finish: its result, or its error raised."""
    deadline = time.monotonic() + total
    status = await locate(client, job_id, total)
    while not status.finished:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CallTimeout("zqsync.result", total, status.worker or list(client.endpoints))
        rpc, wait, bound = next_poll(status, job_id, client._rpc_endpoints, remaining)
        try:
            status = await admin(client, "zqsync.result", (job_id, wait), rpc, bound)
        except (CallTimeout, PoolError, WorkerStopping):
            status = JobStatus(job_id, "unknown")
        if status.state == "unknown" and deadline > time.monotonic():
            status = await locate(client, job_id, min(deadline - time.monotonic(), client.settings.call_timeout))
    return status.value()


async def locate(client: "AsyncClient", job_id: str, timeout: float, *, admin_call: str = "zqsync.job") -> JobStatus:
    """``job_id``'s status from the first worker in rank that holds it (``unknown`` if none does),
    asking each for up to ``timeout`` seconds."""
    unanswered: list[str] = []
    for rpc in rank(job_id, client._rpc_endpoints):
        try:
            status = await admin(client, admin_call, (job_id,), rpc, timeout)
        except (CallTimeout, PoolError):
            unanswered.append(base_of(rpc))
            continue
        if status.state != "unknown":
            return status
    return JobStatus(job_id, "unknown", unanswered=tuple(unanswered))


async def admin(client: "AsyncClient", name: str, args: tuple, rpc: str, timeout: float) -> JobStatus:
    """Call a worker's job admin ``name`` at its ``rpc`` endpoint: its answer as a `JobStatus`."""
    reply = await client.call_at(name, args, {}, timeout, address=rpc)
    if not reply.ok:
        raise remote_error_of(reply)
    return JobStatus.from_reply(reply.result, base_of(rpc))
