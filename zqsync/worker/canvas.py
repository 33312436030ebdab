"""Canvas on the worker: the successor a confirmed job's ``canvas`` option names, built for the journal.

A client's ``zqsync.chain``/``zqsync.chord`` (``zqsync/canvas.py``) sends confirmed jobs whose
request carries ``opts.canvas``::

    {"rest": [[id, task, args, kwargs], ...],   # the steps still to come, the next one first
     "after": [member ids],                     # a chord member: the members the callback waits for
     "errors": "stop" | "pass"}                 # a chord: whether a failed member stops the callback

When such a job finishes (done, failed, dead, cancelled or expired), the scheduler attaches a
`Join` to its outcome (`join_for`); the journal evaluates it in
the transaction that stores the outcome and, once every member is finished, journals the successor
(``journal_api.py``). A chain's successor gets the finished step's result as its first argument; a
chord's callback the list of the members' results, in the group's order (with ``errors="pass"``, a
failed member's entry is ``{"error": {"type": ..., "message": ...}}``). No successor is journaled after
a failed step of a chain, after a failed member of a chord with ``errors="stop"``, nor after a
cancelled one: the client's handle raises that member's error.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Optional

from ..errors import ProtocolError
from ..wire import envelope
from .journal_api import Join, Member, NewJob
from .registry import Registry

log = logging.getLogger(__name__)

#: How a chord treats a failed member: its callback is not run, or gets the error in the member's place.
ERRORS = ("stop", "pass")


def check_spec(spec: Any) -> Optional[str]:
    """What is wrong with a request's ``canvas`` option (the module docstring), or ``None``."""
    rest, after = spec.get("rest"), spec.get("after", [])
    if not isinstance(rest, list) or not rest:
        return "canvas.rest must be a non-empty list of [id, task, args, kwargs] steps"
    for step in rest:
        if not (isinstance(step, list) and len(step) == 4 and isinstance(step[0], str) and 0 < len(step[0])
                <= envelope.MAX_ID and isinstance(step[1], str) and step[1] and isinstance(step[2], list)
                and isinstance(step[3], dict)):
            return f"canvas step {str(step)[:80]} is not [id, task, args, kwargs]"
    if not isinstance(after, list) or not all(isinstance(job_id, str) for job_id in after):
        return "canvas.after must be a list of job ids"
    if spec.get("errors", "stop") not in ERRORS:
        return f"canvas.errors must be one of {ERRORS}"
    return None


def join_for(request: envelope.Request, registry: Registry) -> Optional[Join]:
    """The successor ``request``'s ``canvas`` option names, as a join on its members, or ``None``."""
    spec = request.options.get("canvas")
    if not spec or check_spec(spec):  # checked when the job was confirmed; None for a plain job's option
        return None
    rest, after = spec["rest"], spec.get("after") or []
    task = registry.get(rest[0][1])
    make = functools.partial(_successor, rest, bool(after), spec.get("errors", "stop"), task.retries if task else 0)
    return Join(rest[0][0], tuple(after) or (request.id,), make)


def _successor(rest: list[Any], chord: bool, errors: str, retries: int, members: list[Member]) -> Optional[NewJob]:
    """The next step of ``rest`` once ``members`` finished, or ``None`` (stopped). In the journal's
    transaction: never raises (a body that cannot be encoded is journaled empty: replay dead-letters it)."""
    failed = [member for member in members if member.state != "done"]
    if any(member.state == "cancelled" for member in failed) or (failed and (not chord or errors == "stop")):
        return None
    job_id, task, args, kwargs = rest[0]
    options = {"canvas": {"rest": rest[1:]}} if rest[1:] else {}
    try:
        values = [_value(member) for member in members]
        body = envelope.encode_request("job", job_id, task, [values if chord else values[0], *args], kwargs,
                                       options=options)
    except ProtocolError as exc:
        log.error("canvas step %s (%s) cannot be journaled with its arguments, so it is dead-lettered: %s",
                  job_id, task, exc)
        body = b""
    return NewJob(job_id, task, body, retries)


def _value(member: Member) -> Any:
    if member.state == "done":
        return envelope.decode_reply(member.result).result if member.result else None
    kind, _, message = (member.error or f"{member.state}: ").partition(": ")
    return {"error": {"type": kind, "message": message}}


__all__ = ["ERRORS", "check_spec", "join_for"]
