"""The descriptor and connection budget (docs/operations.md, "File descriptors and connections").

Run from the repository root::

    python benchmarks/fd_budget.py [--connections 2000] [--rounds 3] [--workers 3] [--pool-size 4]
    python benchmarks/fd_budget.py --shortage

1. **Memory and descriptors per idle connection on a worker.** A fresh ``zqsync worker`` per round
   (standalone, and ``--processes 2 --router``, whose supervisor holds the connections) gets ``--connections`` idle TCP
   connections from DEALER sockets of this process (each completes the ZMTP handshake: the worker counts it accepted).
   The worker's RSS (``VmRSS``) and open descriptors are read before and after, in ``--rounds``
   rounds with the two modes interleaved; the figure is the median of (after - before) / connections.
2. **Sockets and connections of one client process.** A gevent client process listing ``--workers``
   workers, with ``ZQSYNC_POOL_SIZE=--pool-size``, runs 50 concurrent greenlets of calls, plain jobs and
   confirmed jobs, so every pool fills; then it reports its own open descriptors and each worker reports
   the connections it accepted, against the formula of docs/operations.md.
3. **A shortage** (``--shortage``, instead of 1 and 2: issue 23's fault). A worker started under
   ``RLIMIT_NOFILE`` 64 (soft and hard) and 200 clients, one per thread, each sending a plain job
   (BLOCK, 2 s) and a call (2 s): what the clients got, the worker's ERROR lines and ``fd_exhausted``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import zmq

import zqsync
from zqsync.processes import WorkerProcess


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def accepted(worker: WorkerProcess) -> int:
    stats = worker.stats()
    if "supervisor" in stats:  # the supervisor's connections are not in the children's counters
        return fds(worker.pid)
    return int(stats["connections_jobs"])


def idle_round(worker: WorkerProcess, count: int) -> tuple[float, float]:
    """Open ``count`` idle connections; returns (KB of RSS, descriptors) per connection on the worker's side."""
    baseline = accepted(worker)  # first: its stats probe's own connection is then open
    time.sleep(0.5)
    before_rss, before_fds = rss_kb(worker.pid), fds(worker.pid)
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, count + 100)
    sockets = []
    for _ in range(count):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(worker.endpoint)
        sockets.append(sock)
    deadline = time.monotonic() + 60
    while accepted(worker) < baseline + count and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the handshakes' buffers settle
    after_rss, after_fds = rss_kb(worker.pid), fds(worker.pid)
    for sock in sockets:
        sock.close()
    context.term()
    return (after_rss - before_rss) / count, (after_fds - before_fds) / count


MODES = {"standalone": [], "prefork (--processes 2 --router), on the supervisor": ["--processes", "2", "--router"]}


def idle_connections(count: int, rounds: int) -> None:
    """A fresh worker per round and mode (a process keeps the memory it freed), the modes interleaved."""
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in MODES}
    for _ in range(rounds):
        for label, extra in MODES.items():
            worker = WorkerProcess(extra_args=extra).start()
            try:
                results[label].append(idle_round(worker, count))
            finally:
                worker.kill()
    for label, pairs in results.items():
        kb = [round(pair[0], 2) for pair in pairs]
        per_fd = [round(pair[1], 3) for pair in pairs]
        print(f"{label}: {count} idle connections, {rounds} rounds: RSS KB per connection {kb} "
              f"(median {statistics.median(kb):.1f}), descriptors per connection {per_fd}")


CLIENT = textwrap.dedent("""
    from gevent import monkey; monkey.patch_all()
    import json, os, sys
    import gevent, zqsync

    client = zqsync.Client(sys.argv[1:], call_timeout=10.0)

    def work(index):
        for round in range(20):
            client.call("add", index, round)
            client.enqueue("add", index, round)
            client.enqueue_with_options("add", args=(index, round), confirm=True)

    gevent.joinall([gevent.spawn(work, index) for index in range(50)], raise_error=True)
    stats = client.stats()
    print(json.dumps({"fds": len(os.listdir("/proc/self/fd")),
                      "push_open": stats["jobs"]["open"], "dealer_open": stats["dealer"]["open"]}))
""")


def client_sockets(workers: int, pool_size: int) -> None:
    state = tempfile.mkdtemp(prefix="fd-budget-")
    started = [WorkerProcess(extra_args=["--state-dir", os.path.join(state, str(index))]).start()
               for index in range(workers)]
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
            script.write(CLIENT)
        # The baseline: the same interpreter and imports, no client.
        bare = subprocess.run([sys.executable, "-c", "from gevent import monkey; monkey.patch_all(); "
                               "import os, gevent, zqsync; print(len(os.listdir('/proc/self/fd')))"],
                              capture_output=True, text=True, check=True)
        done = subprocess.run([sys.executable, script.name, *(worker.endpoint for worker in started)],
                              capture_output=True, text=True, env={**os.environ, "ZQSYNC_POOL_SIZE": str(pool_size)})
        if done.returncode:
            raise SystemExit(f"the client failed:\n{done.stderr}")
        os.unlink(script.name)
        result = json.loads(done.stdout)
        # Less the rpc connection of the stats probe itself (WorkerProcess.stats).
        per_worker = [(stats["connections_jobs"], stats["connections_rpc"] - 1)
                      for stats in (worker.stats() for worker in started)]
    finally:
        for worker in started:
            worker.kill()
        shutil.rmtree(state, ignore_errors=True)
    expected_fds = pool_size * (4 * workers + 2)
    print(f"one gevent client process, {workers} workers, pool size {pool_size}: sockets open push "
          f"{result['push_open']} dealer {result['dealer_open']}; descriptors {result['fds']} "
          f"({result['fds'] - int(bare.stdout)} above the bare interpreter's {bare.stdout.strip()}; "
          f"the formula's most for sockets and connections: {expected_fds}, plus about 12 of the contexts and hub)")
    print(f"  connections accepted per worker (jobs, rpc): {per_worker}; the formula's most: "
          f"({pool_size}, {2 * pool_size})")


def shortage(clients: int = 200) -> None:
    worker = WorkerProcess(nofile=(64, 64)).start()
    outcomes: dict[str, int] = {"ok": 0, "Congested": 0, "CallTimeout": 0}
    lock = threading.Lock()
    opened: list[zqsync.Client] = []

    def one(index: int) -> None:
        client = zqsync.Client(worker.endpoint, call_timeout=2.0, send_timeout=2.0)
        opened.append(client)
        for operation in (lambda: client.enqueue("add", 1, index), lambda: client.call("add", 1, index)):
            try:
                operation()
                outcome = "ok"
            except zqsync.ZqsyncError as exc:
                outcome = type(exc).__name__
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

    try:
        threads = [threading.Thread(target=one, args=(index,)) for index in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for client in opened:
            client.close(linger=0)
        stats = worker.stats()
        errors = [line for line in worker.output().splitlines() if " ERROR " in line]
    finally:
        worker.kill()
    print(f"{clients} clients, a job and a call each, worker under RLIMIT_NOFILE 64: {outcomes}; "
          f"the worker's ERROR lines: {len(errors)}, fd_exhausted {stats.get('fd_exhausted')}")
    if errors:
        print(f"  {errors[0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--shortage", action="store_true", help="run only the shortage (3)")
    args = parser.parse_args()
    if args.shortage:
        shortage()
        return 0
    idle_connections(args.connections, args.rounds)
    client_sockets(args.workers, args.pool_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
