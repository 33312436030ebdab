"""One dead worker among N listed: synchronous clients' throughput and confirmed-job latency, side by side.

N workers (``zqsync worker`` processes with a journal) run on loopback, plus one more that is started
and SIGKILLed, so its ports refuse. Each round starts fresh client processes (``--clients``, each with
``--threads`` synchronous threads, as web processes are) that list N endpoints: all alive, or N - 1
alive and the dead one. Every thread offers ``--rate`` operations per second, in turn a confirmed job,
a call and a plain job (``echo``), for ``--seconds``. Rounds of the two lists alternate; the table
gives each round, then the medians and the ratios dead / alive::

    python benchmarks/bench_dead_worker.py                      # 6 workers, 4 x 4 threads, 3 rounds each
    PYTHONPATH=/work/main python benchmarks/bench_dead_worker.py  # the same against another checkout

Not a test: it prints figures and exits 0. The issue's targets (issue 23): throughput with one of 6
dead at least 0.9 x all alive, confirmed p99 at most 1.5 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time

import zqsync
from zqsync.processes import WorkerProcess


def client_process(endpoints: list[str], threads: int, rate: float, seconds: float, out) -> None:
    """Runs in a forked child: ``threads`` paced loops over one shared client; sends its samples to ``out``."""
    client = zqsync.Client(endpoints, call_timeout=10.0)
    samples: list[tuple[str, float, bool]] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.2

    def loop(index: int) -> None:
        kinds = ("confirm", "call", "plain")
        n = 0
        while True:
            due = start + (n + index / threads) / rate
            if due - start >= seconds:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            kind = kinds[(n + index) % 3]
            began = time.monotonic()
            try:
                if kind == "confirm":
                    client.enqueue_with_options("echo", args=(n,), confirm=True)
                elif kind == "call":
                    client.call("echo", n)
                else:
                    client.enqueue("echo", n)
                ok = True
            except zqsync.ZqsyncError:
                ok = False
            with lock:
                samples.append((kind, time.monotonic() - began, ok))
            # A slot missed while an operation stalled is lost, as a web request waiting for a worker is.
            n = max(n + 1, int((time.monotonic() - start) * rate - index / threads) + 1)

    workers = [threading.Thread(target=loop, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - start
    client.close()
    out.send((samples, elapsed))
    out.close()


def run_round(endpoints: list[str], args: argparse.Namespace) -> dict:
    context = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for _ in range(args.clients):
        receiver, sender = context.Pipe(duplex=False)
        proc = context.Process(target=client_process, args=(endpoints, args.threads, args.rate, args.seconds, sender))
        proc.start()
        pipes.append(receiver)
        procs.append(proc)
    samples, elapsed = [], 0.0
    for receiver, proc in zip(pipes, procs):
        got, seconds = receiver.recv()
        samples.extend(got)
        elapsed = max(elapsed, seconds)
        proc.join(30)
    confirms = sorted(latency for kind, latency, ok in samples if kind == "confirm" and ok)
    return {
        "ops_per_s": sum(ok for _, _, ok in samples) / elapsed,
        "errors": sum(not ok for _, _, ok in samples),
        "confirm_p50": statistics.median(confirms),
        "confirm_p99": confirms[int(0.99 * (len(confirms) - 1))],
        "confirm_max": confirms[-1],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--threads", type=int, default=4, help="synchronous threads per client process")
    parser.add_argument("--rate", type=float, default=10.0, help="operations per second offered per thread")
    parser.add_argument("--seconds", type=float, default=12.0, help="length of a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each list")
    parser.add_argument("--json", help="write the rounds here")
    args = parser.parse_args(argv)
    state = tempfile.mkdtemp(prefix="bench-dead-")
    workers = [WorkerProcess("zqsync.demo.tasks:registry", extra_args=["--state-dir", f"{state}/w{n}"]).start()
               for n in range(args.workers)]
    dead = WorkerProcess("zqsync.demo.tasks:registry").start()
    dead_endpoint = dead.endpoint
    dead.kill()
    alive = [worker.endpoint for worker in workers]
    lists = {"all alive": alive, "one dead": alive[:-1] + [dead_endpoint]}
    results: dict[str, list[dict]] = {name: [] for name in lists}
    print(f"zqsync {zqsync.__file__}; {args.workers} workers listed, {args.clients} client processes x "
          f"{args.threads} threads x {args.rate:g} ops/s offered, {args.seconds:g} s rounds", flush=True)
    print("| round | list | ops/s | errors | confirmed p50 s | p99 s | max s |\n|---|---|---|---|---|---|---|")
    try:
        for round_number in range(args.rounds):
            for name, endpoints in lists.items():
                row = run_round(endpoints, args)
                results[name].append(row)
                print(f"| {round_number + 1} | {name} | {row['ops_per_s']:.1f} | {row['errors']} | "
                      f"{row['confirm_p50']:.4f} | {row['confirm_p99']:.3f} | {row['confirm_max']:.3f} |", flush=True)
    finally:
        for worker in workers:
            worker.kill()
    medians = {name: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
               for name, rows in results.items()}
    for name, row in medians.items():
        print(f"| median | {name} | {row['ops_per_s']:.1f} | {row['errors']:g} | {row['confirm_p50']:.4f} | "
              f"{row['confirm_p99']:.3f} | {row['confirm_max']:.3f} |")
    ratio = medians["one dead"]["ops_per_s"] / medians["all alive"]["ops_per_s"]
    print(f"\nthroughput one dead / all alive: {ratio:.2f}x (target >= 0.9x); confirmed p99 with one dead: "
          f"{medians['one dead']['confirm_p99']:.3f} s (target <= 1.5 s)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rounds": results, "medians": medians}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
