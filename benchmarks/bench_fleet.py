"""A fleet found by DNS under faults: jobs/s and latencies before, during and after each, and the counts.

Worker hosts ``w1``..``w3`` and client hosts (``--clients``) in network namespaces
(``tests/e2e/fleet.py``, as ``tests/e2e/test_fleet.py`` builds them: a nameserver on each client host's
loopback answering ``workers.test``, clients re-resolving every second). Each client process runs
``--loopers`` paced loopers per kind (plain jobs, confirmed jobs, calls) at ``--rate`` operations per
second each, through these phases of ``--phase`` seconds::

    before      w1, w2, w3 in the name
    w1 cut      w1's cable cut (``--cut`` seconds)
    w1 healed   the cable back
    w2 deleted  w2's cable cut, its worker SIGKILLed, its address out of the name
    w4 added    w4 (on w2's journal directory) started and put in the name

It prints, per phase, the operations the clients were given an id or answer for, per second, the
p50/p99 latency of calls and confirmed jobs (a call that timed out counts its ``call_timeout``, 2 s)
and the operations that failed, then the arithmetic at
the workers: plain accepted = ran + lost with the deleted host, confirmed never run and run twice::

    sudo -E python benchmarks/bench_fleet.py                 # about 40 s
    sudo -E python benchmarks/bench_fleet.py --gevent --json fleet.json

Needs root and iproute2 (network namespaces): elsewhere it says why and exits 0. Not a test: it
prints figures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.e2e.fleet import Fleet, arithmetic, left_the_name, tally  # noqa: E402
from tests.e2e.netns import Lab, remove_stale_namespaces, unavailable_reason  # noqa: E402
from tests.helpers import wait_for  # noqa: E402

KINDS = {"p": "plain", "c": "confirmed", "k": "call"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2, help="client hosts, one client process each")
    parser.add_argument("--loopers", type=int, default=2, help="loopers of each kind per client process")
    parser.add_argument("--rate", type=float, nargs=3, default=(100.0, 25.0, 25.0), metavar=("PLAIN", "CONFIRM", "CALL"),
                        help="operations per second each looper offers, per kind")
    parser.add_argument("--phase", type=float, default=5.0, help="seconds of each phase")
    parser.add_argument("--cut", type=float, default=3.0, help="seconds w1's cable stays cut")
    parser.add_argument("--gevent", action="store_true", help="monkey-patched client processes (greenlet loopers)")
    parser.add_argument("--json", help="write the phases and counts here")
    return parser.parse_args(argv)


def run(fleet: Fleet, args: argparse.Namespace) -> dict:
    """The phases, timed; returns the seconds until the clients dropped w2 and sent w4 work."""
    for label in ("w1", "w2", "w3"):
        fleet.add(label)
    fleet.wait_listening("w1", "w2", "w3")
    fleet.publish("w1", "w2", "w3")
    fleet.start_clients(args.clients)
    everyone = {(f"c{n}", kind) for n in range(1, args.clients + 1) for kind in KINDS}
    wait_for(lambda: all(fleet.senders(label) >= everyone for label in ("w1", "w2", "w3")), timeout=60,
             interval=0.2, what="every kind of work from every client at every worker")
    fleet.mark("before")
    time.sleep(args.phase)
    fleet.cut("w1")
    time.sleep(args.cut)
    fleet.heal("w1")
    time.sleep(args.phase)
    w2 = fleet.workers["w2"].endpoint
    fleet.delete("w2", keep=("w1", "w3"))
    changed = fleet.marks[-1][1]
    fleet.add("w4", state_of="w2")
    time.sleep(max(0.0, changed + args.phase - time.monotonic()))
    fleet.wait_listening("w4")
    fleet.publish("w1", "w3", "w4")
    added = fleet.marks[-1][1]
    reached = wait_for(lambda: {kind for _, kind in fleet.senders("w4")} >= {"p", "k"} and time.monotonic(),
                       timeout=30, interval=0.02, what="w4 to get work")
    time.sleep(max(0.0, added + args.phase - time.monotonic()))
    fleet.stop_clients()
    drops = [left_the_name(fleet.events(client), w2) for client in fleet.clients]
    return {"w2_dropped_s": max(drops) - changed, "w4_work_s": reached - added}


def phases(fleet: Fleet) -> list[tuple[str, float, float]]:
    marks = dict(fleet.marks)
    edges = [("before", marks["before"]), ("w1 cut", marks["cut w1"]), ("w1 healed", marks["heal w1"]),
             ("w2 deleted", marks["delete w2"]), ("w4 added", marks["dns w1 w3 w4"]), ("", marks["stop"])]
    return [(name, start, end) for (name, start), (_, end) in zip(edges, edges[1:])]


def figures(events: list[dict], start: float, end: float) -> dict:
    """Per kind, of the operations that ended in [start, end): those that succeeded per second, those that
    failed, and the p50/p99 latency of all of them (ms: a call that timed out counts its timeout)."""
    row = {}
    for kind, name in KINDS.items():
        done = [event for event in events if event["k"] == kind and start <= event["e"] < end]
        times = sorted(1000 * (event["e"] - event["s"]) for event in done)
        ok = sum(1 for event in done if event["ok"])
        row[name] = {"per_s": ok / (end - start), "failed": len(done) - ok,
                     "p50_ms": statistics.median(times) if times else None,
                     "p99_ms": times[int(0.99 * (len(times) - 1))] if times else None}
    return row


def report(rows: dict, timing: dict, count: dict, args: argparse.Namespace) -> None:
    def ms(value):
        return "-" if value is None else f"{value:.1f}"

    print(f"{args.clients} client hosts x {args.loopers} loopers per kind at {args.rate} ops/s "
          f"({'gevent' if args.gevent else 'threads'}), {args.phase:g} s phases, w1 cut {args.cut:g} s\n")
    print("| phase | plain/s | confirmed/s | calls/s | confirmed p50 / p99 ms | call p50 / p99 ms | failed |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        failed = ", ".join(f"{kind} {row[kind]['failed']}" for kind in KINDS.values() if row[kind]["failed"]) or "0"
        print(f"| {name} | {row['plain']['per_s']:.0f} | {row['confirmed']['per_s']:.0f} | {row['call']['per_s']:.0f} "
              f"| {ms(row['confirmed']['p50_ms'])} / {ms(row['confirmed']['p99_ms'])} "
              f"| {ms(row['call']['p50_ms'])} / {ms(row['call']['p99_ms'])} | {failed} |")
    print(f"\nclients dropped w2 {timing['w2_dropped_s']:.2f} s and sent w4 work {timing['w4_work_s']:.2f} s after "
          f"the name changed (re-resolve interval 1 s)")
    print(f"at the workers: {arithmetic(count)}")


def main(argv=None) -> int:
    args = parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"bench_fleet: skipped: {reason}. Run it as root on Linux with iproute2: "
              f"sudo -E {sys.executable} benchmarks/bench_fleet.py")
        return 0
    remove_stale_namespaces()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    rates = dict(zip(KINDS, args.rate))
    with Lab("10.254.7") as lab:
        fleet = Fleet(lab, tmp, gevent=args.gevent, loopers=dict.fromkeys(KINDS, args.loopers), rates=rates)
        try:
            timing = run(fleet, args)
        except BaseException:
            print(fleet.tails(), file=sys.stderr)
            raise
        events = [event for found in (fleet.events(client) for client in fleet.clients) for event in found]
        rows = {name: figures(events, start, end) for name, start, end in phases(fleet)}
        try:
            wait_for(lambda: not (found := tally(fleet, "w2"))["c"]["missing"] and found["p"]["missing"] == found["lost"],
                     timeout=20, interval=0.5, what="the workers to run what they hold")
        except AssertionError:
            pass  # reported as counted
        count = tally(fleet, "w2")
    report(rows, timing, count, args)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "phases": rows, "timing": timing, "arithmetic": arithmetic(count)}, handle,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
