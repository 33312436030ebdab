"""Canvas on confirmed jobs: signatures, chains, groups and chords (``docs/guides/canvas.md``).

``task.s(*args, **kwargs)`` is a `Signature`. `chain` runs signatures one after the other,
each result the first argument of the next; `group` runs them side by side; `chord` runs a
group, then a callback once with the list of the group's results. Each ``enqueue`` sends confirmed jobs
whose ids are all chosen here, so the `CanvasHandle` it returns knows every job of the workflow
before most of them exist, and any client can follow them by id.

Where the state lives: every step is a row in the workers' journal, and the successor of a step (a
chain's next step, a chord's callback) travels inside that step's journaled request
(``zqsync/worker/canvas.py``). The worker that finishes a step journals its successor in the same
transaction as the step's outcome, so a kill between the two cannot lose the successor or run it twice,
and a chord's callback is journaled once however its members' outcomes race (``journal_api.py``). The
client keeps nothing: a handle is only ids.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .client.jobs import Job, JobStatus
from .errors import ConfigurationError, JobCancelled, JobExpired, RemoteError
from .worker.canvas import ERRORS

if TYPE_CHECKING:
    from .client.client import Client


@dataclasses.dataclass(frozen=True)
class Signature:
    """A task with its arguments, to run later in a canvas (``task.s(*args, **kwargs)``).

    :ivar task: the registered task name. :ivar args: positional arguments (a chain's later step gets the
        previous result before them). :ivar kwargs: keyword arguments. :ivar client: the client to send
        through when ``enqueue`` is given none (a `TaskHandle`'s own).
    """

    task: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    client: Optional["Client"] = None

    def step(self, job_id: str) -> list[Any]:
        """This signature as a canvas step on the wire: ``[id, task, args, kwargs]``."""
        return [job_id, self.task, list(self.args), dict(self.kwargs)]


def _new_id() -> str:
    return os.urandom(16).hex()


def _client(client: Optional["Client"], signatures: Sequence[Signature]) -> "Client":
    if client is not None:
        return client
    for signature in signatures:
        if signature.client is not None:
            return signature.client
    from .client.client import default_client

    return default_client()


def _send(client: "Client", signature: Signature, job_id: str, canvas: Optional[dict[str, Any]]) -> None:
    from .client.client import job_request

    frame, _, _, _ = job_request(signature.task, signature.args, signature.kwargs, confirm=True, job_id=job_id,
                                 delay=None, eta=None, store_result=False, deadline=None, send_timeout=None,
                                 canvas=canvas)
    client.route(signature.task).send_confirmed(frame, job_id, signature.task)


def _signatures(signatures: Sequence[Any], what: str) -> tuple[Signature, ...]:
    if not signatures or not all(isinstance(signature, Signature) for signature in signatures):
        raise ConfigurationError(f"{what} takes one or more signatures (task.s(...)), got {signatures!r}",
                                 setting=what)
    return tuple(signatures)


class Chain:
    """Signatures run one after the other; each result is the first argument of the next (`chain`)."""

    def __init__(self, *signatures: Signature) -> None:
        self.signatures = _signatures(signatures, "chain")

    def enqueue(self, client: Optional["Client"] = None) -> "CanvasHandle":
        """Send the first step, confirmed, carrying the rest; blocks until a worker journaled it.

        :param client: the client to send through (default: the first signature's, else the default client).
        :returns: the `CanvasHandle` of the chain (``result()`` is the last step's result).
        :raises Unconfirmed: no worker acknowledged the first step: nothing runs.
        :raises RemoteError: a worker refused it (``UnknownTask``, ``NoJournal``, ``JournalUnavailable``).
        :raises ProtocolError: a step's arguments break the wire's limits; nothing is sent.
        """
        client = _client(client, self.signatures)
        ids = [_new_id() for _ in self.signatures]
        rest = [signature.step(job_id) for signature, job_id in zip(self.signatures[1:], ids[1:])]
        _send(client, self.signatures[0], ids[0], {"rest": rest} if rest else None)
        return CanvasHandle(client, "chain", tuple(ids))


class Group:
    """Signatures run side by side (`group`); its result is the list of theirs, in order."""

    def __init__(self, *signatures: Signature) -> None:
        self.signatures = _signatures(signatures, "group")

    def enqueue(self, client: Optional["Client"] = None) -> "CanvasHandle":
        """Send every member, confirmed, one after the other; blocks until each is journaled.

        :raises Unconfirmed: a member was not acknowledged; those sent before it run.
        :raises RemoteError: a worker refused a member (as `Chain.enqueue`); those sent before it run.
        :raises ProtocolError: a member's arguments break the wire's limits.
        """
        client = _client(client, self.signatures)
        ids = tuple(_new_id() for _ in self.signatures)
        for signature, job_id in zip(self.signatures, ids):
            _send(client, signature, job_id, None)
        return CanvasHandle(client, "group", ids)


class Chord:
    """A group, then ``callback`` once with the list of the group's results (`chord`)."""

    def __init__(self, header: Group, callback: Signature, *, errors: str = "stop") -> None:
        if not isinstance(header, Group) or not isinstance(callback, Signature):
            raise ConfigurationError("chord takes a group and a signature", setting="chord")
        if errors not in ERRORS:
            raise ConfigurationError(f"chord errors must be one of {ERRORS}, got {errors!r}", setting="errors")
        self.header, self.callback, self.errors = header, callback, errors

    def enqueue(self, client: Optional["Client"] = None) -> "CanvasHandle":
        """Send every member, confirmed, each carrying the callback; blocks until each is journaled.

        :raises Unconfirmed: a member was not acknowledged: those sent before it run, and the callback
            never does (it waits for every member).
        :raises RemoteError: a worker refused a member (as `Chain.enqueue`), with the same effect.
        :raises ProtocolError: a member's arguments break the wire's limits.
        """
        client = _client(client, (*self.header.signatures, self.callback))
        members = [_new_id() for _ in self.header.signatures]
        callback = _new_id()
        canvas = {"rest": [self.callback.step(callback)], "after": members, "errors": self.errors}
        for signature, job_id in zip(self.header.signatures, members):
            _send(client, signature, job_id, canvas)
        return CanvasHandle(client, "chord", (*members, callback), self.errors)


def chain(*signatures: Signature) -> Chain:
    """``chain(a.s(1), b.s(), c.s(2))`` runs ``c(b(a(1)), 2)``, each step a confirmed job. A failed step
    stops the chain: no later step runs, and the handle's ``result()`` raises that step's error."""
    return Chain(*signatures)


def group(*signatures: Signature) -> Group:
    """``group(a.s(1), a.s(2))`` runs its members side by side; the handle's ``result()`` is their list."""
    return Group(*signatures)


def chord(header: Group, callback: Signature, *, errors: str = "stop") -> Chord:
    """``chord(group(...), total.s())`` runs ``total([results of the group, in order])`` once.

    :param errors: ``"stop"`` (default): a failed member means the callback never runs, and the handle's
        ``result()`` raises the first failed member's error. ``"pass"``: the callback runs anyway, with
        ``{"error": {"type": str, "message": str}}`` in each failed member's place. Either way a cancelled
        member means the callback never runs.
    """
    return Chord(header, callback, errors=errors)


@dataclasses.dataclass(frozen=True)
class CanvasStatus:
    """Where a canvas stands: ``state`` is ``pending``, ``running``, ``done``, ``failed`` or ``cancelled``;
    ``jobs`` the status of each of its jobs in order (a chain's later steps, and a chord's callback, are
    ``unknown`` until their predecessors finish)."""

    state: str
    jobs: tuple[JobStatus, ...]


class CanvasHandle:
    """A sent chain, group or chord: its jobs' ids, and the client to follow them through.

    :ivar kind: ``"chain"``, ``"group"`` or ``"chord"``. :ivar ids: the job ids in order (a chord's
        members, then its callback).
    """

    def __init__(self, client: "Client", kind: str, ids: tuple[str, ...], errors: str = "stop") -> None:
        self.client, self.kind, self.ids, self.errors = client, kind, ids, errors

    def _job(self, job_id: str) -> Job[Any]:
        return Job(job_id, self.client)

    def result(self, *, timeout: Optional[float] = None) -> Any:
        """Block until the canvas finishes; return a chain's last result, a group's list of results, or a
        chord's callback result.

        :param timeout: seconds in all (default the client's ``call_timeout``).
        :raises RemoteError: a step or member failed (its task's error; `JobCancelled`
            if cancelled), or the chord's callback did.
        :raises CallTimeout: not finished within ``timeout``.
        """
        deadline = time.monotonic() + (self.client.settings.call_timeout if timeout is None else timeout)

        def wait(job_id: str) -> Any:
            return self._job(job_id).result(timeout=max(deadline - time.monotonic(), 0.001))

        if self.kind == "chain":
            return [wait(job_id) for job_id in self.ids][-1]
        if self.kind == "group":
            return [wait(job_id) for job_id in self.ids]
        for job_id in self.ids[:-1]:
            try:
                wait(job_id)
            except RemoteError as exc:
                if self.errors == "stop" or (isinstance(exc, JobCancelled) and not isinstance(exc, JobExpired)):
                    raise
        return wait(self.ids[-1])

    def status(self, *, timeout: Optional[float] = None) -> CanvasStatus:
        """The status of every job (``Client.job``, each within ``timeout``), and of the whole."""
        return self._summary(tuple(self._job(job_id).status(timeout=timeout) for job_id in self.ids))

    def cancel(self, *, timeout: Optional[float] = None) -> CanvasStatus:
        """Cancel what has not finished: pending jobs never start, running ones are interrupted where they
        next yield (``Client.cancel``), and no successor of a cancelled job is ever journaled. A chain is
        cancelled step by step until one is not done; a chord's members, then its callback if it exists."""
        found: list[JobStatus] = []
        for job_id in self.ids:
            status = self._job(job_id).cancel(timeout=timeout)
            found.append(status)
            if self.kind == "chain" and status.state != "done":
                break
        found += [JobStatus(job_id, "unknown") for job_id in self.ids[len(found):]]
        return self._summary(tuple(found))

    def _summary(self, jobs: tuple[JobStatus, ...]) -> CanvasStatus:
        states = [job.state for job in jobs]
        last = jobs[-1] if self.kind != "group" else None
        failed = {"failed", "dead", "expired"}
        if "cancelled" in states:
            state = "cancelled"
        elif (last is not None and last.state in failed) or (
                failed.intersection(states) and not (self.kind == "chord" and self.errors == "pass")):
            state = "failed"
        elif all(state == "done" for state in (states if last is None else [last.state])):
            state = "done"
        elif any(state not in ("pending", "scheduled", "unknown") for state in states):
            state = "running"
        else:
            state = "pending"
        return CanvasStatus(state, jobs)

    def __repr__(self) -> str:
        return f"<CanvasHandle {self.kind} of {len(self.ids)} job(s), first {self.ids[0]}>"


__all__ = ["CanvasHandle", "CanvasStatus", "Chain", "Chord", "Group", "Signature", "chain", "chord", "group"]
