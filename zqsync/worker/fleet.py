"""Whole-worker stats under the prefork supervisor: each child answers for every child.

A ``zqsync.stats`` call reaches one child (whichever the supervisor's proxy
picks). Each supervised child therefore binds a small admin socket, a
ROUTER on ``ipc://DIR/admin-PID`` in the supervisor's private directory
(beside the ``ipc://`` backends), that answers with its own stats without
taking a task slot. The child that got the call asks every sibling's admin
socket at once, waits up to ``GATHER_TIMEOUT`` seconds, and merges the
answers with `merge`; a sibling that does not answer in time (its hub
blocked by a task that never yields, or stopped) is listed as
``unreachable``. The supervisor writes ``DIR/supervisor.json`` (its pid,
start time, configured processes, restarts and plain jobs lost with children) and removes the admin socket
file of every child it reaps, so a gatherer does not wait on a dead child.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import time
from typing import Any, Callable

import msgpack
import zmq

from .durations import percentiles_of

#: Seconds a gathering child waits for its siblings' answers.
GATHER_TIMEOUT = 1.0
#: File the supervisor keeps in its directory for its children to read.
SUPERVISOR_FILE = "supervisor.json"
#: Keys of a child's stats that are not counters summed over the children.
NOT_COUNTERS = frozenset({"pid", "uptime", "state"})


def admin_dir(backend: tuple[str, str]) -> str:
    """The supervisor's private directory, from a child's ``(jobs, rpc)`` ``ipc://`` backend endpoints."""
    return os.path.dirname(backend[0][len("ipc://"):])


def admin_endpoint(directory: str, pid: int) -> str:
    """The admin socket endpoint of the child with process id ``pid``."""
    return f"ipc://{directory}/admin-{pid}"


def remove_admin_socket(directory: str, pid: int) -> None:
    """Remove a reaped child's admin socket file, and its stolen-work socket's (``steal.py``; a SIGKILLed
    child leaves them behind)."""
    for name in (f"admin-{pid}", f"stolen-{pid}"):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def write_supervisor_file(directory: str, info: dict[str, Any]) -> None:
    """Atomically write the supervisor's ``info`` (JSON-serialisable) for its children to read."""
    temporary = os.path.join(directory, SUPERVISOR_FILE + ".tmp")
    with open(temporary, "w") as handle:
        json.dump(info, handle)
    os.replace(temporary, os.path.join(directory, SUPERVISOR_FILE))


def read_supervisor_file(directory: str) -> dict[str, Any]:
    """The supervisor's info with ``uptime`` (seconds) added; ``{}`` if the file is missing."""
    try:
        with open(os.path.join(directory, SUPERVISOR_FILE)) as handle:
            info: dict[str, Any] = json.load(handle)
    except (OSError, ValueError):
        return {}
    info["uptime"] = time.time() - info.get("started", time.time())
    return info


def serve_admin(sock: zmq.Socket, report: Callable[[], dict[str, Any]]) -> None:
    """Answer every request on the (green) ROUTER ``sock`` with ``report()``, msgpack-encoded. Loops forever."""
    while True:
        identity, _ = sock.recv_multipart()
        sock.send_multipart([identity, msgpack.packb(report())])


def gather(context: zmq.Context, directory: str, own: dict[str, Any],
           timeout: float = GATHER_TIMEOUT) -> list[dict[str, Any]]:
    """Ask every sibling's admin socket for its report; blocks the calling greenlet up to ``timeout`` seconds.

    :param context: a ``zmq.green`` context (the worker's).
    :param own: this child's report, listed first.
    :returns: the reports, ``own`` first; a sibling that did not answer in
        time appears as ``{"pid": PID, "state": "unreachable"}``.
    """
    me = own["stats"]["pid"]
    pids = sorted(int(path.rsplit("-", 1)[1]) for path in glob.glob(os.path.join(directory, "admin-*")))
    poller = zmq.Poller()
    asked: dict[zmq.Socket, int] = {}
    for pid in (pid for pid in pids if pid != me):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(admin_endpoint(directory, pid))
        sock.send(b"stats")
        poller.register(sock, zmq.POLLIN)
        asked[sock] = pid
    answers: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(answers) < len(asked) and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(int(left * 1000) + 1):
                answers[asked[sock]] = msgpack.unpackb(sock.recv(), strict_map_key=False)
                poller.unregister(sock)
    finally:
        for sock in asked:
            sock.close()
    return [own] + [answers.get(pid, {"stats": {"pid": pid, "state": "unreachable"}}) for pid in asked.values()]


def merge(reports: list[dict[str, Any]], supervisor: dict[str, Any]) -> dict[str, Any]:
    """The whole worker's stats from its children's reports (see ``Worker.stats`` for the shape).

    :param reports: ``{"stats": a child's own stats, "samples": {task: [seconds, ...]}}``
        per child, the answering child first.
    :param supervisor: what `read_supervisor_file` returned.
    """
    own = reports[0]["stats"]
    totals: collections.Counter[str] = collections.Counter()
    identities_by_pid: collections.Counter[str] = collections.Counter()
    rate_limited: collections.Counter[str] = collections.Counter()
    samples: dict[str, list[float]] = collections.defaultdict(list)
    children, identities, clients = [], [], []
    for report in reports:
        stats = report["stats"]
        counters = {key: value for key, value in stats.items()
                    if isinstance(value, int) and not isinstance(value, bool) and key not in NOT_COUNTERS}
        totals.update(counters)
        identities_by_pid.update(stats.get("identities_by_pid", {}))
        rate_limited.update(stats.get("rate_limited", {}))
        identities += stats.get("identities", [])
        clients += stats.get("clients", [])
        for task, seconds in report.get("samples", {}).items():
            samples[task] += seconds
        children.append({"pid": stats["pid"], "state": stats.get("state", "up"), "uptime": stats.get("uptime"),
                         "in_flight": stats.get("in_flight"), "counters": counters,
                         "durations": stats.get("durations", {})})
    return {
        **totals,
        # The supervisor holds the public sockets and every client connection (supervisor.py).
        "fd_exhausted": totals["fd_exhausted"] + supervisor.get("fd_exhausted", 0), "nofile": supervisor.get("nofile"),
        "pid": own["pid"], "uptime": own["uptime"], "tasks": own["tasks"], "state": own.get("state", "up"),
        "identities_by_pid": dict(identities_by_pid), "identities": identities, "clients": clients,
        "durations": percentiles_of(samples), "rate_limited": dict(sorted(rate_limited.items())),
        "supervisor": supervisor,
        "children": sorted(children, key=lambda child: child["pid"]),
        "unreachable": sum(child["state"] == "unreachable" for child in children),
    }

