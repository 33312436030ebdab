"""Finding a job and waiting for it: the work behind ``Client.job``, ``Client.result`` and ``Client.cancel``.

A job is looked for on its preferred worker first (``rendezvous.py``), then on the
others, then on each route's workers (``docs/design.md``, "Job status and results").
Under gevent the others are asked all at once, as soon as the preferred one has
answered that it does not hold the job or has not answered within `HEDGE`
seconds (a hedged request: Dean and Barroso, "The Tail at Scale", 2013). The first
that holds the job answers for all, so a dead or hung worker delays finding a job
another worker holds by at most ``HEDGE``, not by its whole timeout (an id nobody
holds still waits for every answer, or the timeout). A thread asks them one after
another. ``result`` long-polls the worker holding the job in rounds of at most
`LONG_POLL` seconds; a worker that dies, restarts or stops meanwhile only makes
it look for the job again, until the caller's timeout.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from ..errors import CallTimeout, JobNotFound, PoolError, RemoteError, WorkerStopping, remote_error
from ..wire import envelope
from ..wire.endpoints import split_endpoint
from .jobs import Job, JobStatus
from .owner import current_owner
from .rendezvous import rank

if TYPE_CHECKING:
    from .client import Client

#: Longest single ``zqsync.result`` long-poll, seconds; longer waits call again. Short, because a
#: worker that dies during one never answers it: its waiters find the job again this soon.
LONG_POLL = 5.0
#: Seconds a long-poll's reply may take past its wait before the worker counts as gone for this round.
LONG_POLL_GRACE = 2.0
#: Seconds between look-ups of an id that no worker knows yet (a plain job may not have arrived).
UNKNOWN_RETRY = 1.0
#: Seconds the preferred worker has to answer a look-up before the others are asked too (under gevent).
HEDGE = 0.05


def result(client: "Client", job_id: str, total: float) -> Any:
    """Wait up to ``total`` seconds for ``job_id`` to finish; its result, or its error raised
    (``Client.result`` documents both)."""
    deadline = time.monotonic() + total
    owner, status = locate(client, job_id, total)
    if status.state == "unknown" and not status.unanswered and not isinstance(job_id, Job):
        raise JobNotFound(job_id, known_endpoints(client))
    if owner is not client:
        return owner.result(job_id, timeout=max(0.001, deadline - time.monotonic()))
    while not status.finished:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CallTimeout("zqsync.result", total, status.worker or list(client.endpoints))
        rpc, wait, bound = next_poll(status, job_id, client._rpc_endpoints, remaining)
        try:
            status = admin(client, "zqsync.result", (job_id, wait), rpc, bound)
        except (CallTimeout, PoolError, WorkerStopping):
            # Its worker died, restarts or stops: the job runs again (or goes on) wherever the
            # journal puts it, so look for it again until the deadline.
            status = JobStatus(job_id, "unknown")
        if status.state == "unknown" and deadline > time.monotonic():
            status = locate(client, job_id, min(deadline - time.monotonic(), client.settings.call_timeout))[1]
    return status.value()


def next_poll(status: JobStatus, job_id: str, rpcs: Sequence[str], remaining: float) -> tuple[str, float, float]:
    """The next ``zqsync.result`` long-poll of a wait with ``remaining`` seconds left (shared with the asyncio
    client): the rpc endpoint to ask (the worker holding the job, else its preferred one), the seconds the
    worker may wait (a margin before the caller's deadline: `LONG_POLL`, or `UNKNOWN_RETRY`
    for an id no worker holds yet), and the seconds to wait for its reply."""
    wait = min(LONG_POLL if status.worker else UNKNOWN_RETRY, remaining - min(0.25, remaining / 4))
    rpc = split_endpoint(status.worker)[1] if status.worker else rank(job_id, rpcs)[0]
    return rpc, wait, min(remaining, wait + LONG_POLL_GRACE)


def locate(client: "Client", job_id: str, timeout: float, *,
           admin_call: str = "zqsync.job") -> tuple["Client", JobStatus]:
    """The client whose workers hold ``job_id`` (``client`` first, then each route's) and its status,
    asking each worker for up to ``timeout`` seconds (``admin_call``: ``zqsync.job`` or ``zqsync.cancel``)."""
    unanswered: list[str] = []
    if client._discovery is not None:
        client._rediscover()
    for rpc, status in answers(client, admin_call, job_id, rank(job_id, client._rpc_endpoints), timeout):
        if status is None:
            unanswered.append(base_of(rpc))
        elif status.state != "unknown":
            return client, status
    for routed in client._routed.values():
        owner, status = locate(routed, job_id, timeout, admin_call=admin_call)
        if status.state != "unknown":
            return owner, status
        unanswered.extend(status.unanswered)
    return client, JobStatus(job_id, "unknown", unanswered=tuple(unanswered))


def answers(client: "Client", admin_call: str, job_id: str, rpcs: list[str],
            timeout: float) -> Iterator[tuple[str, Optional[JobStatus]]]:
    """Each worker's answer to ``admin_call`` for ``job_id`` as it comes, ``None`` for one that did not
    answer within ``timeout``: under gevent the first of ``rpcs`` alone, then the rest at once (module
    docstring); else one after another. Closing the iterator stops the asks still in flight."""
    if len(rpcs) < 2 or not current_owner().green:
        for rpc in rpcs:
            yield rpc, ask(client, admin_call, job_id, rpc, timeout)
        return
    import gevent
    from gevent.queue import Empty, Queue

    replies: Queue = Queue()

    def asking(rpc: str) -> None:
        try:
            replies.put((rpc, ask(client, admin_call, job_id, rpc, timeout), None))
        except Exception as exc:  # raised in the caller's greenlet
            replies.put((rpc, None, exc))

    pending = {rpcs[0]: gevent.spawn(asking, rpcs[0])}
    others = rpcs[1:]
    try:
        while pending:
            try:
                rpc, status, error = replies.get(timeout=HEDGE if others else None)
                answered = True
            except Empty:  # the preferred worker is slow: ask the others too
                answered = False
            if answered:
                del pending[rpc]
                if error is not None:
                    raise error
                yield rpc, status
            if others and (not answered or not pending):
                pending.update((other, gevent.spawn(asking, other)) for other in others)
                others = []
    finally:
        gevent.killall(list(pending.values()), block=False)


def ask(client: "Client", admin_call: str, job_id: str, rpc: str, timeout: float) -> Optional[JobStatus]:
    """One worker's answer to ``admin_call`` for ``job_id``, or ``None`` if it gave none within ``timeout``."""
    try:
        return admin(client, admin_call, (job_id,), rpc, timeout)
    except (CallTimeout, PoolError):
        return None


def known_endpoints(client: "Client") -> list[str]:
    """The endpoints of ``client`` and of its routes' clients."""
    return [*client.endpoints, *(endpoint for routed in client._routed.values() for endpoint in known_endpoints(routed))]


def admin(client: "Client", name: str, args: tuple, rpc: str, timeout: float) -> JobStatus:
    """Call a worker's job admin ``name`` at its ``rpc`` endpoint: its answer as a `JobStatus`.
    A long-poll (``zqsync.result``) travels on the caller's long-poll channel, holding no pooled socket."""
    reply = client._call_at(name, args, {}, timeout, address=rpc, multiplexed=name == "zqsync.result")
    if not reply.ok:
        raise remote_error_of(reply)
    return JobStatus.from_reply(reply.result, base_of(rpc))


def base_of(rpc: str) -> str:
    """A worker's base endpoint from its rpc endpoint (PORT+1)."""
    host, _, port = rpc.rpartition(":")
    return f"{host}:{int(port) - 1}"


def remote_error_of(reply: envelope.Reply) -> RemoteError:
    """The error a worker's error ``reply`` stands for, as the matching `RemoteError` subclass."""
    error = reply.error or {}
    return remote_error(error.get("type", "?"), error.get("message", ""), error.get("traceback", ""), request_id=reply.id)
