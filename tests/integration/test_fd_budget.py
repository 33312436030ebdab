"""Running out of file descriptors is logged at ERROR with the limit and a hint, and counted in stats,
on the worker (libzmq's accept() fails and retries silently) and on the client (its connect does);
``zqsync worker`` raises its soft RLIMIT_NOFILE to the hard limit at start.

Every worker here is a real process started with a low limit (soft and hard, so that it cannot raise
it), flooded with real TCP connections from this process.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import textwrap
import time

import pytest
import zmq

from tests.helpers import children_of, slack, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE and /proc are Linux's")

#: Limits a worker starts under, and how many clients overrun them: a worker needs about 20 fds of
#: its own; under a supervisor, the supervisor about 35 and each child about 45.
LIMITS = [pytest.param(None, 40, 60, id="single"), pytest.param(2, 64, 100, id="router")]


def _flood(endpoint: str, count: int) -> tuple[zmq.Context, list[zmq.Socket]]:
    context = zmq.Context()
    sockets = []
    for _ in range(count):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sockets.append(sock)
    return context, sockets


def _exhausted(stats: dict) -> int:
    return int(stats.get("fd_exhausted", 0))


def _answers_promptly(worker) -> None:
    """A connection made before the shortage still carries calls at once: watching for the shortage must
    not stall libzmq's I/O thread (a socket monitor of accept failures did, 1-2 s a call)."""
    for _ in range(5):
        started = time.monotonic()
        worker.stats()
        assert time.monotonic() - started < slack(0.5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("processes", "low", "flood"), LIMITS)
def test_a_worker_out_of_fds_logs_an_error_with_the_limit_and_counts_it(zq_worker, processes, low, flood):
    # The router's supervisor holds every client connection (a direct worker's children share them).
    worker = zq_worker(nofile=(low, low), extra_args=["--processes", str(processes), "--router"] if processes else [])
    assert _exhausted(worker.stats()) == 0  # the stats probe's connection is open before the flood
    context, sockets = _flood(worker.endpoint, flood)
    try:
        line = wait_for(lambda: next((line for line in worker.output().splitlines()
                                      if "ERROR" in line and "RLIMIT_NOFILE" in line), None),
                        timeout=20, what="an ERROR line naming RLIMIT_NOFILE")
        assert f"soft {low}, hard {low}" in line and "LimitNOFILE" in line, line
        if not processes:  # a supervisor out of fds cannot write the file its children read its count from
            assert wait_for(lambda: _exhausted(worker.stats()), timeout=20, what="a counted shortage")
        _answers_promptly(worker)
    finally:
        for sock in sockets:
            sock.close()
        context.term()
    assert wait_for(lambda: _exhausted(worker.stats()), timeout=20, what="a counted shortage")
    # Once the clients are gone the worker accepts again, and the CLI shows the count.
    output = wait_for(lambda: _cli_stats(worker.endpoint), timeout=30, what="zqsync stats answering")
    match = re.search(r"fd_exhausted (\d+)", output)
    assert match and int(match.group(1)) >= 1, output
    assert f"nofile soft {low} hard {low}" in output, output


def _cli_stats(endpoint: str):
    done = subprocess.run([sys.executable, "-m", "zqsync", "stats", endpoint, "--timeout", "2"],
                          capture_output=True, text=True, timeout=slack(30))
    return done.stdout if done.returncode == 0 else None


def _nofile(pid: int) -> tuple[int, int]:
    return resource.prlimit(pid, resource.RLIMIT_NOFILE)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("processes", [None, 2], ids=["single", "prefork"])
def test_zqsync_worker_raises_its_soft_limit_to_the_hard_one_and_logs_it(zq_worker, processes):
    hard = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    worker = zq_worker(nofile=(64, hard), extra_args=["--processes", str(processes)] if processes else [])
    pids = [worker.pid, *children_of(worker.pid)]
    assert len(pids) == 1 + (processes or 0), pids
    assert {_nofile(pid) for pid in pids} == {(hard, hard)}
    assert f"RLIMIT_NOFILE raised from 64 to {hard} (the hard limit)" in worker.output()


CLIENT = textwrap.dedent("""
    import errno, json, logging, os, sys, threading
    import zqsync

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    endpoint, spare, timeout, operation = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

    def fill(spare):
        # Take every free fd, then give back `spare` of them.
        taken = []
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE, exc
                break
        for fd in taken[:spare]:
            os.close(fd)

    def run(client):
        try:
            if operation == "call":
                client.call("add", 1, 2)
            else:
                client.enqueue_with_options("add", args=(1, 2), congestion="drop")
        except zqsync.ZqsyncError as exc:
            return type(exc).__name__
        return None

    client = zqsync.Client(endpoint, call_timeout=timeout)
    assert client.call("add", 1, 2) == 3  # both pools' contexts and I/O threads exist
    client.enqueue("add", 1, 2)
    fill(spare)
    errors = []
    # Another thread needs sockets of its own: new ones, in a process out of fds.
    worker = threading.Thread(target=lambda: errors.append(run(client)))
    worker.start()
    worker.join()
    print(json.dumps({"error": errors[0], "stats": client.stats()}), flush=True)
    os._exit(0)
""")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spare", [0, 1], ids=["no-fd-for-the-socket", "no-fd-for-the-connection"])
@pytest.mark.parametrize(("operation", "pool", "errors"), [("call", "dealer", ("PoolError", "CallTimeout")),
                                                           ("drop", "jobs", ("PoolError", None))])
def test_a_client_out_of_fds_logs_an_error_with_the_limit_and_counts_it(zq_worker, tmp_path, spare, operation,
                                                                        pool, errors):
    worker = zq_worker()
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    limits = (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    done = subprocess.run([sys.executable, str(script), worker.endpoint, str(spare), str(slack(1.0)), operation],
                          capture_output=True, text=True, timeout=slack(60),
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limits),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["error"] in errors, result
    assert result["stats"][pool]["fd_exhausted"] >= 1, result
    lines = [line for line in done.stderr.splitlines() if "ERROR" in line and "RLIMIT_NOFILE" in line]
    assert lines and "soft 256" in lines[0], done.stderr
