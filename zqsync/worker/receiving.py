"""The worker's receive loops: jobs and calls read, started in a task slot, answered.

Both receivers read at C level and drain their socket before waiting on
it, and run a job or call inline, in the receiving greenlet, when a slot
is free (no greenlet spawn when it finishes without yielding); a task that
yields hands receiving over to a new greenlet (``inline.py``). A call that
finds every slot taken waits for one in a greenlet of its own, as below.

The worker's own ``zqsync.*`` calls (ping, stats) never wait for a task
slot: they run in a greenlet of their own as soon as they are read. Calls
that wait for a slot wait in greenlets too (at most `WAITING_CALLS`),
so the rpc socket keeps being read, and a ping answers while the pool is full.
Confirmed jobs past `ADMISSIONS` in flight are held unacknowledged
(``admission.py``), so a full confirm backlog does not stop the reading either.

A mixin of `Worker`, which holds the state; the intake
(``intake.py``) reads the jobs and counts the credits, so nothing here depends on the mode.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Optional

import gevent
import zmq

from ..errors import ProtocolError, WorkerShutdown, WorkerStopping
from ..wire.envelope import encode_error
from .core import Core, log
from .dispatch import ADMIN, SLOT, kind_of
from .inline import run_inline
from .queues import yield_to_higher
from .steal import CALL, JOB

#: Distinct client identities remembered for ``zqsync.stats``.
MAX_IDENTITIES = 10_000


class Receiving(Core):
    """The receive loops of `Worker`."""

    def _receive_jobs(self) -> None:
        """Read jobs while a slot is free (C-level, draining before waiting: ``inline.py``), each run
        inline in this greenlet unless another took the slot meanwhile."""
        current, reader = gevent.getcurrent(), self._readers[0]
        while self._receivers[0] is current and not self._stopping:
            self._slots.wait_available()
            yield_to_higher(self.queues)  # the named queues rank above the --bind jobs socket
            frame = self.intake.read_job(reader)
            if frame is None:
                continue
            if self._stopping:  # read while a stop's kill was on its way: the stop runs or counts it
                self._backlog.append(frame)
                return
            if not self._slots.free_count():  # a call took the slot meanwhile
                self._wait_for_slot(frame)
            elif not self._inline(0, self._run_plain, frame):
                return
            self.intake.took(SLOT)

    def _wait_for_slot(self, frame: bytes) -> None:
        """Run a job once a slot is free; a stop that kills the wait keeps the job in the backlog."""
        try:
            self._slots.spawn(self._run_plain, frame)
        except gevent.GreenletExit:
            self._backlog.append(frame)
            raise

    def _receive_calls(self) -> None:
        # A call needs a task slot: with one free (and no call waiting), it runs
        # inline in this greenlet (inline.py); else it waits for one in a greenlet
        # of its own (up to WAITING_CALLS of them; past that, receiving stops). The
        # worker's own calls need no slot and run at once. A confirmed job needs only
        # to be journaled, so it is admitted without a task slot and without a
        # greenlet: handed to the journal's writer thread, and acknowledged from the
        # hub right after its group commit (confirming.py), up to ADMISSIONS at once
        # and a backlog bound; the journal, not the task pool, buffers it. Past
        # ADMISSIONS it is held unacknowledged (admission.py): receiving goes on.
        # The worker's own zqsync.* calls take no slot either: a long-poll
        # (zqsync.result) or a cancel must not wait behind the tasks it is about.
        current, reader = gevent.getcurrent(), self._readers[1]
        while self._receivers[1] is current:
            frames = reader.recv_multipart()
            envelope = frames[: self.intake.envelope]
            self._note_identity(envelope[-1])
            decoded = self._decode(frames)
            self.intake.took(self._receive_call(envelope, decoded))

    def _receive_stolen(self) -> None:
        """Run the work a blocked sibling's relay forwards (``steal.py``): a plain job as this worker's own, in
        a slot; an rpc message as if read on the rpc socket, answered on the stolen-work socket (its relay
        sends the answer to the client). Stolen work never runs inline: the jobs and rpc receivers keep
        their roles, and a job waits for its slot in a queue that `_start_stolen` feeds from (a stop moves
        what is left to the backlog), so this one keeps reading."""
        reader = self._readers[2]
        while True:
            frames = reader.recv_multipart()
            if len(frames) == 3 and frames[1] == JOB:
                self.intake.took_stolen()
                if self._stopping:
                    self._backlog.append(frames[2])
                else:
                    self._stolen.append(frames[2])
                    self._stolen_ready.set()
            elif len(frames) >= 3 and frames[1] == CALL:
                envelope = [frames[0], frames[2]]
                self._note_identity(frames[2])
                self._receive_call(envelope, self._decode(frames[2:]), inline=False)
            else:
                self.runner.counters["malformed"] += 1

    def _start_stolen(self) -> None:
        """Start the stolen plain jobs, oldest first, as slots free up (a greenlet; a stop kills it: a job it
        took waits for its slot in the backlog, `_wait_for_slot`)."""
        while True:
            while not self._stolen:
                self._stolen_ready.clear()
                self._stolen_ready.wait()
            self._slots.wait_available()
            self._wait_for_slot(self._stolen.popleft())

    def _inline(self, index: int, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` in receiver ``index`` (0: jobs, 1: rpc), which holds a free slot. If it
        yields, a new receiver takes over (and, under a supervisor, the slot credit counts as used);
        returns whether the caller is still the receiver."""
        current = self._receivers[index]

        def hand_off() -> None:
            if index:
                self._calls.add(current)  # an in-flight call: the rpc socket closes after it answers
            elif self._stopping:  # the stop left this task to finish: it takes no more jobs
                return
            self._receivers[index] = gevent.spawn(self._receive_calls if index else self._receive_jobs)
            self.intake.took(SLOT)

        return run_inline(self._slots, hand_off, fn, *args)

    def _receive_call(self, envelope: list[bytes], decoded: Any, inline: bool = True) -> Optional[bytes]:
        """Start or answer one rpc message. Returns the kind of credit it used (``dispatch.py``; a standalone
        intake ignores it) if its start is already under way, ``None`` if none (the worker's own calls) or
        if `_start_call` or a hand-off reports the start itself. ``inline``: a call may run in the calling
        greenlet, the rpc receiver."""
        kind = SLOT if isinstance(decoded, bytes) else kind_of(decoded[0].kind, decoded[0].task)
        if isinstance(decoded, bytes):
            self._reply(envelope, decoded)
        elif self._stopping:
            self._refuse(envelope, decoded[0])
        elif decoded[0].kind == "confirm":
            self._admit(envelope, *decoded)
        elif kind == ADMIN or self.runner.is_builtin(decoded[1]):
            pool = self._long_polls if decoded[0].task == "zqsync.result" else self._admin
            pool.spawn(self._answer, self.runner.answer_call, envelope, *decoded)
        elif inline and self._slots.free_count() and not len(self._waiting):
            if not self._inline(1, self._answer, self.runner.answer_call, envelope, *decoded):
                return None  # handed off: the credit was counted then
        else:
            self._waiting.spawn(self._start_call, envelope, *decoded)
            return None
        return None if kind == ADMIN else kind

    def _admit(self, envelope: list[bytes], request: Any, task: Any) -> None:
        """Journal a confirmed job now if an admission place is free and none is held before it; else hold
        it, unacknowledged, for `_admit_held` (``admission.py``), so the rpc socket keeps being read.
        Past the hold's bound it is left unacknowledged: its client sends it again."""
        if not self._held and self._admissions.free_count():
            self._journal(envelope, request, task)
        elif not self._held.hold(request.id, (envelope, request, task)):
            self.runner.counters["confirms_shed"] += 1
            self._shed_log.warning("shed", "left a confirmed job unacknowledged: %d are held waiting for the "
                                   "journal and the backlog; its client sends it again", len(self._held))

    def _admit_held(self) -> None:
        """Journal the held confirmed jobs, oldest first, as admission places free up (a greenlet)."""
        while True:
            self._held.wait()
            self._admissions.wait_available()
            self._journal(*self._held.pop())

    def _journal(self, envelope: list[bytes], request: Any, task: Any) -> None:
        """Take an admission place (one is free) and hand a confirmed job to the journal; answered later."""
        self._admissions.acquire()
        self.runner.answer_confirm(request, task, partial(self._acknowledge, envelope))

    def _start_call(self, envelope: list[bytes], request: Any, task: Any) -> None:
        """Wait for a task slot and run the call in it; a stop that kills the wait refuses the call."""
        try:
            self._calls.add(self._slots.spawn(self._answer, self.runner.answer_call, envelope, request, task))
        except gevent.GreenletExit:
            self._refuse(envelope, request)
        finally:
            self.intake.took(SLOT)

    def _refuse(self, envelope: list[bytes], request: Any) -> None:
        """While stopping: refuse a call at once (not run); leave a confirmed job unacknowledged,
        so that its client sends it again, to a peer or to this worker's next start."""
        if request.kind == "confirm":
            self.runner.counters["confirms_ignored_on_stop"] += 1
            return
        self.runner.counters["calls_refused_on_stop"] += 1
        self._reply(envelope, encode_error(request.id, WorkerStopping.__name__,
                                           "the worker is stopping and did not run this call; retry it"))

    def _decode(self, frames: list[bytes]) -> Any:
        if len(frames) != self.intake.envelope + 1:
            self.runner.counters["malformed"] += 1
            body_frames = len(frames) - self.intake.envelope
            return encode_error("", ProtocolError.__name__, f"expected one body frame, got {body_frames}")
        return self.runner.decode_rpc(frames[-1])

    def _note_identity(self, identity: bytes) -> None:
        if len(self.identities) < MAX_IDENTITIES or identity in self.identities:
            self.identities[identity] += 1

    def _answer(self, answer: Any, envelope: list[bytes], request: Any, task: Any) -> None:
        try:
            reply = answer(request, task)
        except gevent.GreenletExit:
            stopped = encode_error(request.id, WorkerShutdown.__name__, "the worker stopped before the task finished")
            self._reply(envelope, stopped)
            raise
        self._reply(envelope, reply)

    def _acknowledge(self, envelope: list[bytes], reply: bytes) -> None:
        """Answer a confirmed job (in the hub, or in the receiver for an answer given at once); a reply
        that cannot be sent leaves the job unacknowledged, and its client sends it again."""
        self._admissions.release()
        try:
            self._reply(envelope, reply)
        except zmq.ZMQError as exc:
            log.warning("could not answer a confirmed job of client %r: %s", envelope[-1], exc)

    def _reply(self, envelope: list[bytes], reply: bytes) -> None:
        """Answer on the rpc socket, or for stolen work (a longer envelope: the relay's routing id first) on
        the stolen-work socket."""
        self._replied_at = time.monotonic()
        try:
            self._readers[1 if len(envelope) == self.intake.envelope else 2].reply(envelope, reply)
        except zmq.Again:
            log.warning("dropped a reply: client %r is not reading", envelope[-1])
