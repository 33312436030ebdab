"""Loss check: plain jobs accepted by ``enqueue`` against jobs a real worker executed.

Run from the repository root::

    python benchmarks/loss_check.py [--jobs 200000] [--concurrency 4] [--delay 0.0002] [--payload 0]
                                    [--exit close|atexit] [--linger 30] [--runs 1] [--gevent]

A real ``zqsync worker`` (:class:`zqsync.processes.WorkerProcess`) serves
``zqsync.demo.tasks:record`` with a small ``--concurrency``; each job sleeps
``--delay`` seconds and appends its number to a file, so the worker is slower
than the sender and back-pressure builds (the worker's receive HWM fills and
the client's ``enqueue`` waits). A separate plain script (a subprocess, as a
real application) enqueues ``--jobs`` jobs with BLOCK and a long send
deadline, then either calls ``close(linger=...)`` or just exits (``atexit``).
It prints the jobs it got an id for (accepted) and the time ``close`` took.
Once the worker has finished, the file's distinct lines are the jobs
executed. Lost = accepted - executed; the missing job numbers are shown as
ranges, so a lost tail or a lost mid-stream block is visible.

Exit status 1 if any run lost a job. ``tests/integration/test_loss.py`` runs
the same check at CI size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from zqsync.processes import WorkerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The plain script: enqueue N jobs, then close (or not), print one JSON line.
CLIENT_SCRIPT = r'''
import json, sys, time
config = json.loads(sys.argv[1])
if config["gevent"]:
    from gevent import monkey
    monkey.patch_all()
import zqsync

client = zqsync.Client(config["endpoint"], send_timeout=config["send_timeout"])
accepted, refused = 0, 0
padding = "x" * config["payload"]
for number in range(config["jobs"]):
    try:
        client.enqueue("record", config["path"], f"{number} {padding}", config["delay"])
        accepted += 1
    except zqsync.Congested:
        refused += 1
closed_in = None
stats = client.stats()
if config["exit"] == "close":
    started = time.monotonic()
    client.close(linger=config["linger"])
    closed_in = time.monotonic() - started
    stats = client.stats()
print(json.dumps({"accepted": accepted, "refused": refused, "close_seconds": closed_in, "stats": stats}), flush=True)
'''


def ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1-3, 7"`` (at most 8 ranges shown)."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    shown = [f"{a}-{b}" if a != b else str(a) for a, b in spans[:8]]
    return ", ".join(shown) + (f", ... ({len(spans)} ranges)" if len(spans) > 8 else "")


def executed_lines(path: str) -> list[str]:
    try:
        with open(path) as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def run_once(
    *,
    jobs: int,
    concurrency: int = 4,
    delay: float = 0.0002,
    payload: int = 0,
    exit: str = "close",
    linger: float = 30.0,
    send_timeout: float = 60.0,
    gevent: bool = False,
    settle: float = 120.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One run: a worker, a client script, then count. Returns accepted, executed, lost and details.

    :param settle: seconds to wait, after the client exits, for the worker to finish its backlog.
    """
    workdir = tempfile.mkdtemp(prefix="zqsync-loss-")
    path = os.path.join(workdir, "record.txt")
    worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=ROOT, concurrency=concurrency, env=env)
    worker.start()
    try:
        config = {"endpoint": worker.endpoint, "jobs": jobs, "path": path, "delay": delay, "exit": exit,
                  "linger": linger, "payload": payload, "send_timeout": send_timeout, "gevent": gevent}
        started = time.monotonic()
        client = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT, json.dumps(config)], cwd=ROOT,
                                capture_output=True, text=True, timeout=settle + 600, env={**os.environ, **(env or {})})
        if client.returncode != 0:
            raise RuntimeError(f"client script failed:\n{client.stdout[-2000:]}\n{client.stderr[-4000:]}")
        report = json.loads(client.stdout.strip().splitlines()[-1])
        client_seconds = time.monotonic() - started
        done = _wait_until_idle(worker, path, report["accepted"], settle)
    finally:
        worker.stop()
    lines = executed_lines(path)
    executed = {int(line.split()[0]) for line in lines}
    missing = sorted(set(range(report["accepted"])) - executed) if not report["refused"] else []
    return {
        "jobs": jobs, "accepted": report["accepted"], "refused": report["refused"], "executed": len(executed),
        "duplicates": len(lines) - len(executed), "lost": report["accepted"] - len(executed),
        "missing": ranges(missing), "close_seconds": report["close_seconds"], "client_seconds": client_seconds,
        "settled": done, "job_pool": report["stats"]["jobs"], "warnings": [line for line in client.stderr.splitlines()
                                                                       if "WARNING" in line or "unsent" in line],
    }


def _wait_until_idle(worker: WorkerProcess, path: str, accepted: int, settle: float) -> bool:
    """Wait until every accepted job ran, or the worker has been idle for 3 s, or ``settle`` ran out."""
    deadline = time.monotonic() + settle
    last, idle_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(executed_lines(path))
        if count >= accepted:
            return True
        if count != last:
            last, idle_since = count, time.monotonic()
        elif time.monotonic() - idle_since > 3.0 and worker.stats()["in_flight"] == 0:
            return False
        time.sleep(0.2)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.0002, help="seconds each job sleeps")
    parser.add_argument("--payload", type=int, default=0, help="bytes of padding per job (fills buffers sooner)")
    parser.add_argument("--exit", choices=("close", "atexit"), default="close")
    parser.add_argument("--linger", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--gevent", action="store_true", help="monkey-patch the client script")
    args = parser.parse_args(argv)
    lost_any = False
    for run in range(1, args.runs + 1):
        result = run_once(jobs=args.jobs, concurrency=args.concurrency, delay=args.delay, payload=args.payload, exit=args.exit,
                          linger=args.linger, gevent=args.gevent)
        lost_any |= result["lost"] != 0
        close = "-" if result["close_seconds"] is None else f"{result['close_seconds']:.2f} s"
        print(f"run {run}: accepted {result['accepted']} executed {result['executed']} lost {result['lost']} "
              f"refused {result['refused']} duplicates {result['duplicates']} close {close} "
              f"client {result['client_seconds']:.1f} s missing [{result['missing']}] "
              f"unsent_at_close {result['job_pool'].get('unsent_at_close', '-')} {result['warnings']}", flush=True)
    return 1 if lost_any else 0


if __name__ == "__main__":
    sys.exit(main())
