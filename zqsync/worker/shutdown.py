"""The worker's stop sequence.

Shutdown (gunicorn's arbiter model): signal handlers only record the signal;
the main greenlet acts on it. They are Python-level handlers, not gevent's:
Python runs them between two bytecodes even while a task blocks the hub,
and the watchdog's native thread (``watchdog.py``) then kills that task at
the end of the grace period (at once for a cold stop), so a stop never
waits on a task. TERM/INT is warm, in this order:

1. Take no more jobs. Standalone, the worker sends a stopping notice to
   every client that sent on its jobs (ROUTER) socket and keeps reading;
   those clients flush and close that socket and send to their other
   workers (``stopping.py``, ``client/notices.py``). Once no job has come
   for ``DRAIN_QUIET`` seconds the endpoint is unbound.
   Under a supervisor, the child reads its backend queue up to the router's
   end-of-jobs mark (sent after the last job routed to it), disconnects, and
   writes how many jobs it read for the supervisor's count (``dispatch.py``).
2. Drain: the jobs already in the socket's queue stay readable after the
   unbind (measured: all of a full 1000-message queue, even seconds later,
   whatever the linger) and are read into memory.
3. Run them, and finish in-flight tasks, within ``graceful_timeout``; jobs
   still not started then are counted (``jobs_discarded_on_stop``) and
   logged: ``discarded N queued plain jobs on shutdown``. So are pending
   in-memory retries of plain jobs (the scheduler logs their ids). Tasks
   still running then are killed, and counted (``killed N of M task(s)``:
   those that finished before the kill reached them ran, and are not).
   A receiver that reads a job while the stop is under way keeps it in the
   backlog; one that runs a task inline is left to finish it.
4. Calls: in-flight calls are answered; calls that arrive meanwhile are
   refused at once with a ``WorkerStopping`` error (not run, safe to retry
   elsewhere), and confirmed jobs are not acknowledged (their clients send
   them again). The rpc socket closes once the in-flight calls are answered.

Residual window, honestly: a job sent in the instant of the unbind by a
client that has not looked for the notice yet (it looks every 16 sends) is
lost uncounted. Before the notice, what the client's queue and both kernels'
buffers held was lost (24,409-35,000 jobs behind a busy worker; the
scenario is ``tests/integration/test_stop_notice.py``). Confirmed jobs have no such window.

A second TERM/INT, QUIT, or the end of the grace period is cold: in-flight
tasks are killed (confirmed ones stay pending in the journal and run after
the next start), calls still waiting for a slot are refused (``WorkerStopping``),
and queued plain jobs are discarded with a count. A worker that killed
tasks exits with status `KILLED_EXIT` (1), and counts
them (``tasks_killed_on_stop``).

A mixin of `Worker`, which holds the state; what differs between a
standalone worker and a supervised child (the notice and unbind, or the drain to the end-of-jobs mark)
is the intake's (``intake.py``).
"""

from __future__ import annotations

import os
import time

import gevent
import gevent.pool
import zmq

from .core import Core, log
from .intake import quiesce
from .steal import JOB

#: Seconds a warm shutdown waits after the last task before closing its sockets.
REPLY_DRAIN = 0.25


class Shutdown(Core):
    """The stop sequence of `Worker`."""

    def _ignore_held(self) -> None:
        """On stop: the held confirmed jobs stay unacknowledged (never journaled here); their clients send
        them again, to a peer or to this worker's next start."""
        if self._admitter is not None:
            self._admitter.kill()
        self.runner.counters["confirms_ignored_on_stop"] += self._held.clear()

    def shutdown(self, *, warm: bool = True) -> None:
        """Stop taking jobs, drain the jobs queue, run (warm) or discard (cold) what is queued, finish
        or kill in-flight tasks, and close the sockets. See the module docstring for the order.

        A warm shutdown waits up to ``graceful_timeout`` seconds, and turns
        cold if another stop signal arrives meanwhile. Blocks the calling greenlet.
        """
        self._stopping = True
        self._ignore_held()
        self.scheduler.book.close()
        self._stop_receiving()
        self.scheduler.discard_plain_pending()
        self.scheduler.pause()
        self._stop_taking_jobs()
        rpc = gevent.spawn(self._retire_rpc)
        if warm and self._busy():
            self._finish_in_flight()
        self._discard_backlog("not started within the grace period" if warm else "cold shutdown")
        self._waiting.kill(timeout=1.0)  # calls still waiting for a slot are refused, not run
        self._admissions.join(timeout=5.0)
        if self.watchdog.killed:
            log.warning("stop: killed %d task(s) that blocked the worker past the grace period", self.watchdog.killed)
            self.runner.counters["tasks_killed_on_stop"] += self.watchdog.killed
        if self._running():
            self._kill_running()
        rpc.join(timeout=5.0 + REPLY_DRAIN)
        if not self.rpc.closed:
            rpc.kill()
            self.intake.unwatch(self.rpc)
            self.rpc.close(linger=0)
        self._discard_stolen()
        self.scheduler.stop()
        gevent.killall(self._greenlets)
        self.watchdog.stop()
        self.intake.close()
        self.jobs.close(linger=0)  # unbound or disconnected, and read to the end
        for queue in self.queues:
            if queue.sock is not None:
                queue.sock.close(linger=0)
        if self._context is not None:
            self._context.term()
        log.info("zqsync worker pid %d stopped", os.getpid())

    def _stop_receiving(self) -> None:
        """Kill the job receivers and the credit offers (``_stopping`` is set). A jobs receiver that runs a
        task inline (it yielded, and has not handed off yet) is a task in flight: it is left to finish, and
        receives no more. A receiver that reads a job while the kill is on its way keeps it in the backlog
        (`_receive_jobs`)."""
        jobs = [receiver for receiver in self._receivers[:1] if receiver not in self._slots]
        gevent.killall([*jobs, *self._queue_receivers, *self._stolen_starter])
        self._backlog.extend(self._stolen)  # stolen jobs that waited for a slot (receiving.py)
        self._stolen.clear()
        self.intake.stop_offering()

    def _stop_taking_jobs(self) -> None:
        """Unbind (standalone) or disconnect (supervised) the jobs socket, reading into memory every
        job already in its queue; then the named queues' sockets."""
        where = self.intake.stop_taking_jobs(self._backlog.append)
        for queue in self.queues:  # their queued jobs join the backlog, run in the default pool
            if queue.peers is not None:
                quiesce(queue.peers, self._backlog.append)
        log.info("stopped taking jobs from %s; %d queued plain job(s) to run", where, len(self._backlog))

    def _discard_stolen(self) -> None:
        """Count as discarded the plain jobs that siblings' relays sent while this worker stopped and that were
        not run: those its stolen-work receiver put in the backlog after the grace period's run, and those
        still queued on the socket (``steal.py``; a stopping worker stamps no free slot, so they are the few
        in flight at that moment)."""
        if len(self._readers) < 3:
            return
        raw = self._readers[2].raw
        while True:
            try:
                frames = raw.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:  # EAGAIN: read to the end
                break
            if len(frames) == 3 and frames[1] == JOB:
                self._backlog.append(frames[2])
        self._discard_backlog("sent by a sibling while this worker stopped")

    def _discard_backlog(self, reason: str) -> None:
        if self._backlog:
            count = len(self._backlog)
            self._backlog.clear()
            self.runner.counters["jobs_discarded_on_stop"] += count
            log.warning("discarded %d queued plain jobs on shutdown (%s)", count, reason)

    def _kill_running(self) -> None:
        """Kill the tasks still running, and count (``tasks_killed_on_stop``) and log those the kill ended:
        a task that finished before the kill reached it (a timer that fired first) ran, and is not counted."""
        running = [greenlet for pool in self._pools() for greenlet in list(pool)]
        for pool in self._pools():
            pool.kill(timeout=1.0)
        killed = sum(1 for greenlet in running if isinstance(greenlet.value, gevent.GreenletExit))
        log.warning("cold shutdown: killed %d of %d task(s) still running", killed, len(running))
        self.runner.counters["tasks_killed_on_stop"] += killed

    def _retire_rpc(self) -> None:
        """Close the rpc socket once the in-flight calls are answered (refusing new ones meanwhile)."""
        while len(self._calls) or len(self._waiting) or len(self._admin) or len(self._long_polls):
            self._calls.join(timeout=0.05)
        self._admissions.join(timeout=5.0)
        # Closing a TCP socket with unread input (a client's heartbeat, say)
        # makes the kernel send RST, and a client that had not yet read our
        # last reply loses it with the connection. Give the last replies (results,
        # or WorkerShutdown errors) a moment to be read first.
        gevent.sleep(max(0.0, self._replied_at + REPLY_DRAIN - time.monotonic()))
        gevent.killall(self._receivers[1:])
        self.intake.unwatch(self.rpc)
        self.rpc.close(linger=1000)
        log.info("stopped taking calls")

    def _busy(self) -> bool:
        """Tasks running (any queue), jobs queued in memory, or calls waiting for a slot."""
        return bool(self._running() or self._backlog or len(self._waiting))

    def _finish_in_flight(self) -> None:
        log.info("warm shutdown: waiting up to %.1f s for %d task(s) and %d queued job(s)",
                 self.graceful_timeout, self._running(), len(self._backlog))
        deadline = self._stop_deadline or time.monotonic() + self.graceful_timeout
        signals_before = len(self._signals)
        while self._busy() and len(self._signals) == signals_before:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not self._backlog:  # wait for the tasks, or for the calls waiting to take a free slot
                if self._running():
                    for pool in self._pools():
                        pool.join(timeout=min(0.1, remaining))
                else:
                    self._waiting.join(timeout=min(0.1, remaining))
            elif self._slots.free_count():
                self._slots.spawn(self._run_plain, self._backlog.popleft())
            else:
                self._slots.wait_available(timeout=min(0.1, remaining))
