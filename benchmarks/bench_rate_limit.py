"""Rate limits (issue 26's target row): ``rate_limit="20/s"``, 100 plain jobs to a real worker process.

Enqueues the jobs at once, then asks the worker's stats until it has run them all; reports the
seconds that took and how many the worker received, ran and dropped (target: >= 4.5 s, none dropped).

    python -m benchmarks.bench_rate_limit --rounds 3 [--processes 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import zqsync
from zqsync.processes import WorkerProcess
from zqsync.worker import Registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
registry = Registry()


@registry.task(rate_limit="20/s")
def paced(n: int) -> int:
    return n


def one_round(jobs: int, processes: int) -> dict[str, float]:
    extra = ["--processes", str(processes)] if processes > 1 else []
    with WorkerProcess("benchmarks.bench_rate_limit:registry", cwd=ROOT, concurrency=10, extra_args=extra) as worker:
        with zqsync.Client(worker.endpoint) as client:
            started = time.monotonic()
            for n in range(jobs):
                client.enqueue("paced", n)
            while True:
                stats = client.call("zqsync.stats")
                if stats["jobs_succeeded"] + stats["jobs_failed"] >= jobs:
                    break
                time.sleep(0.02)
            elapsed = time.monotonic() - started
    return {"seconds": elapsed, "received": stats["jobs_received"], "succeeded": stats["jobs_succeeded"],
            "dropped": jobs - stats["jobs_succeeded"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    results = [one_round(args.jobs, args.processes) for _ in range(args.rounds)]
    for result in results:
        print(" ".join(f"{key}={value:.3f}" if key == "seconds" else f"{key}={value}" for key, value in result.items()))
    print(f"median seconds {statistics.median(r['seconds'] for r in results):.3f}, "
          f"dropped {sum(r['dropped'] for r in results)} (rate_limit=20/s, {args.jobs} jobs, --processes {args.processes})")


if __name__ == "__main__":
    main()
