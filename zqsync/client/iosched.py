"""The job pools' libzmq I/O thread runs under ``SCHED_BATCH``: it batches jobs instead of preempting the caller.

Each enqueue hands one frame to libzmq. When its I/O thread has drained the
pipe, that frame wakes it (an ``eventfd`` write), and under the default
policy the kernel lets the woken thread preempt the caller at once if they
share a CPU. A busy web process (``gunicorn -k gevent``, one CPU per
worker process) then pays a context switch, an ``epoll`` round and one TCP
``send`` per job: measured in situ, about 20 us of I/O-thread CPU per job
plus the switches on the main thread, as much as the rest of the enqueue.

Under ``SCHED_BATCH`` (Linux, ``sched(7)``) a woken thread does not preempt
the running one: it runs when the caller blocks (a gevent hub waiting for
I/O, a thread waiting for a reply) or at the next scheduler tick, and then
sends every frame queued meanwhile in one write. Its CPU share is unchanged
(same nice value); only the wake-up preemption goes. Measured in situ:
I/O-thread CPU per job from about 20 us to 2-3 us, and the worker reads
batches too. The cost: when the process keeps its CPU busy, a job may leave
up to one scheduler slice (milliseconds) later; with a free CPU the thread
is woken there as before. Call sockets, whose round trip waits for the
thread, keep the default policy (their pools have contexts of their own).

libzmq applies the policy inside the new thread and aborts the process if
the kernel refuses it, so it is requested only when it cannot fail: the
creating thread (whose policy and priority the I/O thread inherits) runs
under ``SCHED_OTHER`` or ``SCHED_BATCH``, and a probe shows that this
thread may switch to ``SCHED_BATCH`` (a seccomp filter or a sandbox may
forbid it). Elsewhere (not Linux, a real-time caller, a refused probe) the
context keeps libzmq's default.
"""

from __future__ import annotations

import os

import zmq

#: Policies whose static priority is 0, the only one ``SCHED_BATCH`` accepts (``sched(7)``).
_ZERO_PRIORITY = frozenset(getattr(os, name) for name in ("SCHED_OTHER", "SCHED_BATCH") if hasattr(os, name))


def batch_allowed() -> bool:
    """Whether a thread started now by the calling thread may run under ``SCHED_BATCH``.

    Switches the calling thread to ``SCHED_BATCH`` and back (two system calls).
    Never raises.
    """
    if not hasattr(os, "SCHED_BATCH") or not hasattr(zmq, "THREAD_SCHED_POLICY"):
        return False
    try:
        policy = os.sched_getscheduler(0)
        if policy not in _ZERO_PRIORITY:
            return False
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def batch_io_threads(context: zmq.Context) -> bool:
    """Ask libzmq to start ``context``'s threads under ``SCHED_BATCH`` when `batch_allowed`.

    Call it from the thread that will open the context's first socket, before
    that socket: libzmq starts its threads then, and they inherit that thread's policy.

    :returns: whether the option was set.
    """
    if not batch_allowed():
        return False
    context.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
    return True
