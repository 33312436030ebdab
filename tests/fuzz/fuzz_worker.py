"""The long fuzz run against a live worker (the test, tests/fuzz/test_worker_fuzz.py, sends 22,000).

Run from the repository root::

    python tests/fuzz/fuzz_worker.py [--frames 500000] [--seed 62] [--batch 5000] [--send-decoder-bugs]

It starts a ``zqsync.demo.tasks`` worker with :class:`zqsync.processes.WorkerProcess`,
then sends ``--frames`` fuzz messages from ``tests/fuzz/fuzzframes.py`` in
batches (jobs over PUSH, rpc over DEALERs and a ROUTER), draining replies
without waiting for each. After every batch it waits for every reply and
checks that the process is alive; a worker that died or stopped answering
counts as a crash, its last batch is saved for reproduction, and a new
worker takes over. At the end: raw TCP garbage below ZeroMQ, frames at and
over ZMQ_MAXMSGSIZE, a valid call, and the ``malformed`` and ``jobs_received``
counts against what local decoding predicts.

Frames that make the local ``decode_request`` raise something other than
ProtocolError are a decoder bug; they are counted and reported, and withheld
unless ``--send-decoder-bugs`` (each one may then cost a crash and a restart).

Prints the inputs tried, crashes (must be 0), RSS before and after, the
malformed count and the elapsed time. Exits 1 on a crash, a miscount or a
decoder bug.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: make ``tests`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import argparse
import collections
import random
import shutil
import tempfile
import time
from typing import Optional

import msgpack

import zqsync
from tests.fuzz.fuzzframes import FuzzDriver, Stalled, frame_of_size, raw_tcp_garbage, rss_bytes, send_oversized
from zqsync.processes import WorkerProcess
from zqsync.wire import envelope

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MB = 1024 * 1024


def start_worker() -> WorkerProcess:
    return WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT).start()


def stop_worker(worker: WorkerProcess) -> None:
    worker.stop(timeout=10.0)
    shutil.rmtree(os.path.dirname(worker.log_path), ignore_errors=True)


def healthy(worker: WorkerProcess, driver: FuzzDriver) -> Optional[str]:
    """``None``, or why the worker counts as crashed."""
    if worker.proc is not None and worker.proc.poll() is not None:
        return f"process exited with status {worker.proc.returncode}"
    if not driver.settle(timeout=5.0):
        return f"{driver.counts['expected_replies'] - driver.counts['replies']} replies missing"
    try:
        with zqsync.Client(worker.endpoint) as client:
            client.call_with_options("zqsync.ping", timeout=5.0)
    except zqsync.ZqsyncError as exc:
        return f"no answer to a ping: {exc}"
    return None


def wait_for_counts(worker: WorkerProcess, base: dict, expected: dict, timeout: float = 30.0) -> dict:
    """The worker's stats once its counters reached ``base`` + ``expected`` (or after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = worker.stats()
        if all(stats[key] - base[key] >= value for key, value in expected.items()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def save_batch(driver: FuzzDriver, seed: int, crash: int) -> str:
    handle, path = tempfile.mkstemp(prefix=f"zqsync-fuzz-crash-{seed}-{crash}-", suffix=".msgpack")
    with os.fdopen(handle, "wb") as out:
        out.write(msgpack.packb([[target, parts] for target, parts in driver.sent], use_bin_type=True))
    return path


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=500_000, help="fuzz messages to send (default: 500000)")
    parser.add_argument("--seed", type=int, default=62, help="random seed (default: 62)")
    parser.add_argument("--batch", type=int, default=5000, help="messages between two health checks (default: 5000)")
    parser.add_argument("--raw-tcp", type=int, default=200, help="raw TCP garbage connections at the end (default: 200)")
    parser.add_argument("--send-decoder-bugs", action="store_true", help="send frames that crash the local decoder too")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    started = time.monotonic()
    totals: collections.Counter = collections.Counter()
    labels: collections.Counter = collections.Counter()
    bugs: list = []
    crashes: list = []
    rss = {"max": 0}
    worker = start_worker()
    driver: Optional[FuzzDriver] = None
    try:
        base = worker.stats()
        driver = FuzzDriver(worker.endpoint, rng, withhold_bugs=not args.send_decoder_bugs)
        tried = 0
        while tried < args.frames:
            size = min(args.batch, args.frames - tried)
            before = driver.counts["messages"] + driver.counts["withheld"]
            try:
                driver.run(size)
                problem = healthy(worker, driver)
            except Stalled as exc:
                problem = str(exc)
            tried += driver.counts["messages"] + driver.counts["withheld"] - before
            if problem is None:
                rss["max"] = max(rss["max"], rss_bytes(worker.pid))
                rss.setdefault("before", rss_bytes(worker.pid))  # after the first batch: the warm-up
            else:
                path = save_batch(driver, args.seed, len(crashes))
                crashes.append(f"after {tried} messages: {problem}; last batch in {path}")
                print(f"CRASH {crashes[-1]}", file=sys.stderr)
                totals.update(driver.counts)
                labels.update(driver.labels)
                bugs += driver.decoder_bugs
                driver.close()
                stop_worker(worker)
                worker = start_worker()
                base = worker.stats()
                driver = FuzzDriver(worker.endpoint, rng, withhold_bugs=not args.send_decoder_bugs)
            if tried // 50_000 != (tried - size) // 50_000:
                print(f"  {tried} messages, {time.monotonic() - started:.0f} s, worker RSS {rss_bytes(worker.pid) / MB:.1f} MiB",
                      file=sys.stderr)

        limit = envelope.MAX_MESSAGE_SIZE
        big = {"jobs, at the limit": send_oversized(worker.endpoint, "jobs", frame_of_size(limit)),
               "rpc, at the limit": send_oversized(worker.endpoint, "rpc", frame_of_size(limit, "call", "no_such_task")),
               "jobs, limit + 1": send_oversized(worker.endpoint, "jobs", frame_of_size(limit + 1)),
               "rpc, limit + 1": send_oversized(worker.endpoint, "rpc", frame_of_size(limit + 1, "call", "no_such_task"))}
        problem = healthy(worker, driver)
        if problem:
            crashes.append(f"at the end: {problem}")
        expected = {"malformed": driver.counts["expected_malformed"],
                    "jobs_received": driver.counts["expected_jobs"] + (big["jobs, at the limit"] == "sent")}
        stats = None if problem else wait_for_counts(worker, base, expected)
        # Last, as it cannot be predicted: libzmq reads bytes without a 0xFF greeting as ZMTP 1.0 frames.
        raw_tcp_garbage(rng, worker.endpoint, args.raw_tcp)
        problem = healthy(worker, driver)
        if problem:
            crashes.append(f"after raw TCP garbage: {problem}")
        raw_malformed = worker.stats()["malformed"] - stats["malformed"] if stats and not problem else "n/a"
        rss_after = rss_bytes(worker.pid)
    finally:
        if driver is not None:
            driver.close()
        stop_worker(worker)
    elapsed = time.monotonic() - started

    totals.update(driver.counts)
    labels.update(driver.labels)
    bugs += driver.decoder_bugs
    counted = {key: stats[key] - base[key] for key in expected} if stats else None
    print(f"inputs tried:      {tried} messages ({totals['frames']} frames sent, {totals['withheld']} messages withheld), "
          f"seed {args.seed}, + {args.raw_tcp} raw TCP connections + 4 frames at/over {limit} bytes")
    print(f"  by kind:         {dict(labels.most_common())}")
    print(f"worker crashes:    {len(crashes)}" + "".join(f"\n  {crash}" for crash in crashes[:10]))
    print(f"decoder bugs:      {len(bugs)} frames make decode_request raise something other than ProtocolError"
          + (f"; first: {bugs[0][0]}; frame {bugs[0][1][:60].hex()}... ({len(bugs[0][1])} bytes)" if bugs else ""))
    print(f"worker RSS:        {rss.get('before', 0) / MB:.1f} MiB after warm-up, {rss_after / MB:.1f} MiB at the end, "
          f"{rss['max'] / MB:.1f} MiB max between batches")
    print(f"malformed counted: {counted['malformed'] if counted else 'n/a'} by the last worker, expected {expected['malformed']}"
          f" (jobs_received {counted['jobs_received'] if counted else 'n/a'}, expected {expected['jobs_received']})")
    print(f"raw TCP:           {raw_malformed} malformed frames got through (libzmq reads bytes without a greeting as ZMTP 1.0)")
    print(f"replies:           {totals['replies']} of {totals['expected_replies']}, {len(driver.bad_replies)} undecodable")
    print(f"big frames:        {big}")
    print(f"elapsed:           {elapsed:.1f} s ({tried / elapsed:.0f} messages/s)")
    return 1 if crashes or bugs or counted != expected or driver.bad_replies else 0


if __name__ == "__main__":
    sys.exit(main())
