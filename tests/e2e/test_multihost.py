"""Multi-host (docs/scenarios.md): one client, two workers on three "hosts", and a cable cut.

The hosts are network namespaces on a private bridge (``tests/e2e/netns.py``):
``c`` (the client) and ``w1``/``w2`` (a real ``zqsync worker`` each, with a
journal). The client process lists both workers and runs loopers, each with a
``Client`` of its own: callers (``zqsync.stats``, which names the serving pid),
confirmers (``record`` with ``confirm=True``) and a pusher (plain ``record``).
It writes one JSON line per operation. Then:

1. traffic reaches both workers;
2. ``w1``'s cable is cut (``eth0`` down): calls keep succeeding through ``w2``
   (a call that times out is retried by the client script, and counted);
   unacknowledged confirmed jobs are retried with their id on their preferred worker,
   and fail over to ``w2`` past the client's bound (``zqsync/client/rendezvous.py``);
3. the cable is restored: calls and confirmed jobs reach ``w1`` again;
4. every job the client saw confirmed ran (``record`` file) and is in a
   journal (``zqsync jobs``); duplicates are counted, not failed on (at least once).

Why a cut costs at most one request per pooled socket: a pooled DEALER still
holds its established TCP connection to ``w1``, and nothing tells it the
link is gone (no heartbeats), so round-robin sends it one request into the
void. That request times out, the socket is discarded (pool rule 3), and its
replacement dials both workers with ``ZMQ_IMMEDIATE``: it only queues to
``w2`` until ``w1`` answers again. The discarded socket's request is still in
the kernel's TCP buffer, though, and reaches ``w1`` once the cable is back: a
confirmed job retried onto ``w2`` then runs on both (at least once; counted).
Plain enqueues (PUSH) get no such feedback: about half of those sent during
the cut wait in the dead connection until the cable is back (measured only).

Needs root and iproute2; skipped otherwise. The client runs monkey-patched
(green sockets) when the suite does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MONKEY_PATCHED, ROOT
from tests.e2e.netns import Lab
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(120)

PORT = 5555
CALL_TIMEOUT = 2.0
CALL_ATTEMPTS = 3
CONFIRM_RETRY = 0.5
CONFIRM_TIMEOUT = 20.0
LOOPERS = {"call": 2, "confirm": 2, "push": 1}
PACE = 0.02  # seconds each looper rests between operations
CUT_AT_LEAST = float(os.environ.get("ZQSYNC_MULTIHOST_CUT", "6"))  # seconds the cable stays cut (keep it under 40)
SPREAD_DEADLINE = 60.0  # seconds for traffic to reach w1 again after the restore

CLIENT_SCRIPT = r'''
"""The client host: loopers with a Client each; one JSON line per operation into the events file."""
import json
import os
import sys
import threading
import time

config = json.loads(open(sys.argv[1]).read())
if config["gevent"]:
    from gevent import monkey

    monkey.patch_all()

import zqsync

events = os.open(config["events"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def emit(**event):
    os.write(events, (json.dumps(event) + "\n").encode())  # one write on O_APPEND: lines never interleave


def call(client):
    timeouts = 0
    for attempt in range(1, config["call_attempts"] + 1):
        try:
            return {"ok": True, "pid": client.call("zqsync.stats")["pid"], "attempts": attempt, "timeouts": timeouts}
        except zqsync.CallTimeout:
            timeouts += 1
    return {"ok": False, "attempts": config["call_attempts"], "timeouts": timeouts, "error": "CallTimeout"}


def confirm(client):
    job_id = os.urandom(16).hex()
    before = client.stats()["confirm_retries"]
    try:
        client.enqueue_with_options("record", args=(config["record"], "c " + job_id), confirm=True, job_id=job_id)
        ok, error = True, None
    except zqsync.ZqsyncError as exc:
        ok, error = False, f"{type(exc).__name__}: {exc}"
    return {"ok": ok, "id": job_id, "retries": client.stats()["confirm_retries"] - before, "error": error}


def push(client):
    job_id = os.urandom(16).hex()
    try:
        client.enqueue_with_options("record", args=(config["record"], "p " + job_id), job_id=job_id)
        return {"ok": True, "id": job_id}
    except zqsync.ZqsyncError as exc:
        return {"ok": False, "id": job_id, "error": f"{type(exc).__name__}: {exc}"}


def loop(role, name):
    client = zqsync.Client(config["endpoints"], call_timeout=config["call_timeout"],
                           confirm_retry=config["confirm_retry"], confirm_timeout=config["confirm_timeout"])
    operation = {"call": call, "confirm": confirm, "push": push}[role]
    try:
        while not os.path.exists(config["stop"]):
            start = time.monotonic()
            try:
                result = operation(client)
            except Exception as exc:  # unexpected: reported, and the test fails on it
                result = {"ok": False, "error": f"unexpected {type(exc).__name__}: {exc}"}
            emit(kind=role, looper=name, start=start, end=time.monotonic(), **result)
            time.sleep(config["pace"])
    finally:
        emit(kind="stats", looper=name, stats=client.stats())
        client.close()


threads = [threading.Thread(target=loop, args=(role, f"{role}-{index}"))
           for role, count in config["loopers"].items() for index in range(count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
emit(kind="done")
'''


class Run:
    """The paths and processes of one multi-host run."""

    def __init__(self, lab: Lab, tmp_path: Path) -> None:
        self.lab, self.tmp = lab, tmp_path
        self.client_host = lab.add_host("c", 1)
        self.workers = {label: lab.add_host(label, number) for label, number in (("w1", 11), ("w2", 12))}
        self.record = tmp_path / "record.txt"
        self.events_path = tmp_path / "events.jsonl"
        self.stop_path = tmp_path / "stop"
        self.logs: dict[str, Path] = {}
        self.procs: dict[str, subprocess.Popen] = {}

    def endpoint(self, label: str) -> str:
        return f"tcp://{self.workers[label].address}:{PORT}"

    def start_workers(self) -> None:
        for label, host in self.workers.items():
            argv = [sys.executable, "-m", "zqsync", "worker", "zqsync.demo.tasks:registry", "--bind", self.endpoint(label),
                    "--state-dir", str(self.tmp / f"state-{label}"), "--ready-file", str(self.tmp / f"ready-{label}"),
                    "--parent-pid", str(os.getpid()), "--graceful-timeout", "5"]
            self.logs[label] = self.tmp / f"{label}.log"
            self.procs[label] = self.lab.popen(host, argv, log_path=str(self.logs[label]), cwd=ROOT)
        for label in self.workers:
            wait_for(lambda label=label: (self.tmp / f"ready-{label}").exists() or self.procs[label].poll() is not None,
                     timeout=60, what=f"worker {label} to listen")
            assert self.procs[label].poll() is None, f"worker {label} exited:\n{self.logs[label].read_text()}"

    def start_client(self) -> None:
        config = {
            "gevent": MONKEY_PATCHED, "endpoints": [self.endpoint(label) for label in self.workers],
            "call_timeout": CALL_TIMEOUT, "call_attempts": CALL_ATTEMPTS, "confirm_retry": CONFIRM_RETRY,
            "confirm_timeout": CONFIRM_TIMEOUT, "loopers": LOOPERS, "pace": PACE,
            "record": str(self.record), "events": str(self.events_path), "stop": str(self.stop_path),
        }
        (self.tmp / "client.json").write_text(json.dumps(config))
        (self.tmp / "client.py").write_text(CLIENT_SCRIPT)
        self.logs["client"] = self.tmp / "client.log"
        self.procs["client"] = self.lab.popen(
            self.client_host, [sys.executable, str(self.tmp / "client.py"), str(self.tmp / "client.json")],
            log_path=str(self.logs["client"]), cwd=ROOT,
        )

    def pid(self, label: str) -> int:
        return self.procs[label].pid  # `ip netns exec` execs: the Popen pid is the worker's own

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every complete event line so far (of ``kind``)."""
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().split("\n")[:-1]  # the last piece is partial or empty
        found = [json.loads(line) for line in lines]
        return [event for event in found if kind is None or event["kind"] == kind]

    def records(self) -> Counter:
        return Counter(self.record.read_text().splitlines()) if self.record.exists() else Counter()

    def journal_ids(self, label: str) -> set[str]:
        """Ids of the confirmed jobs in a worker's journal (done or pending), from ``zqsync jobs``."""
        listed = subprocess.run(
            [sys.executable, "-m", "zqsync", "jobs", "--state-dir", str(self.tmp / f"state-{label}"), "--state", "done",
             "--state", "pending", "--json", "--limit", "1000000"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )
        assert listed.returncode == 0, listed.stderr
        return {json.loads(line)["id"] for line in listed.stdout.splitlines()}

    def log_tails(self) -> str:
        return "\n".join(f"--- {name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
                         for name, path in self.logs.items() if path.exists())


@pytest.fixture
def run(lab, tmp_path):
    made = Run(lab, tmp_path)
    yield made
    print(made.log_tails())  # shown only when the test fails
    lab.close()  # processes by pid first, then the namespaces (the lab fixture's exit is then a no-op)


def per_looper(events: list[dict[str, Any]], since: float) -> Counter:
    return Counter(event["looper"] for event in events if event["start"] >= since)


def test_traffic_survives_a_cut_link_and_spreads_again_after_restore(run):
    run.start_workers()
    run.start_client()
    pids = {run.pid("w1"): "w1", run.pid("w2"): "w2"}
    w1 = run.workers["w1"]

    # 1. Traffic reaches both workers.
    def both_serve() -> bool:
        calls = run.events("call")
        assert run.procs["client"].poll() is None, f"the client exited:\n{run.log_tails()}"
        return {event.get("pid") for event in calls} >= set(pids) and len(run.events("confirm")) >= 20

    wait_for(both_serve, timeout=40, interval=0.2, what="calls and confirmed jobs from the client host to reach both workers")
    assert {event["pid"] for event in run.events("call") if event["ok"]} == set(pids), "a call served by another pid"

    # 2. Cut w1's cable while traffic flows.
    cut = time.monotonic()
    w1.cut()

    def enough_after_cut() -> bool:
        events = run.events()
        counts = per_looper([e for e in events if e["kind"] in ("call", "confirm")], cut + 0.5)
        busy = all(counts[f"{role}-{i}"] >= 15 for role in ("call", "confirm") for i in range(LOOPERS[role]))
        return busy and time.monotonic() - cut >= CUT_AT_LEAST

    wait_for(enough_after_cut, timeout=50, interval=0.2, what="15 calls and confirms per looper with w1 cut off")
    plain_ran_during_cut = {line.split()[1] for line in run.records() if line.startswith("p ")}
    restore = time.monotonic()
    w1.restore()
    cut_events = [event for event in run.events() if cut <= event["start"] < restore]
    plain_sent_during_cut = {event["id"] for event in cut_events if event["kind"] == "push" and event["ok"]}

    # 3. Traffic reaches w1 again: every caller's calls, and confirmed jobs.
    def callers_back_on_w1() -> dict[str, float]:
        first: dict[str, float] = {}
        for event in run.events("call"):
            if event["start"] >= restore and event.get("pid") == run.pid("w1"):
                first.setdefault(event["looper"], event["end"] - restore)
        return first if len(first) == LOOPERS["call"] else {}

    spread = wait_for(callers_back_on_w1, timeout=SPREAD_DEADLINE, interval=0.2,
                      what="every caller to reach w1 again after the restore")

    def confirms_back_on_w1() -> set[str]:
        after = {event["id"] for event in run.events("confirm") if event["ok"] and event["start"] >= restore}
        return after & run.journal_ids("w1")

    wait_for(confirms_back_on_w1, timeout=SPREAD_DEADLINE, interval=1.0,
             what="a confirmed job sent after the restore to land on w1")

    # 4. Stop the client; everything confirmed ran.
    run.stop_path.touch()
    assert run.procs["client"].wait(30) == 0, run.log_tails()
    events = run.events()
    assert events[-1]["kind"] == "done"
    errors = [event for event in events if (event.get("error") or "").startswith("unexpected")]
    assert not errors, errors

    calls = [event for event in events if event["kind"] == "call"]
    confirms = [event for event in events if event["kind"] == "confirm"]
    after_cut = [event for event in calls if event["end"] >= cut]
    failed_calls = [event for event in calls if not event["ok"]]
    assert not failed_calls, f"calls failed after {CALL_ATTEMPTS} attempts of {CALL_TIMEOUT} s: {failed_calls}"
    call_timeouts = sum(event["timeouts"] for event in after_cut)
    # One request per pooled socket that still had w1 connected (see the module docstring); each caller has one.
    assert call_timeouts <= LOOPERS["call"], f"{call_timeouts} call timeouts after the cut"
    slowest = max(event["end"] - event["start"] for event in after_cut)
    assert slowest <= CALL_TIMEOUT * CALL_ATTEMPTS + 2.0
    during_cut = [event for event in calls if cut + 0.5 <= event["start"] < restore]
    assert during_cut and all(event["pid"] == run.pid("w2") for event in during_cut), "a call reached the cut host"

    unconfirmed = [event for event in confirms if not event["ok"]]
    assert not unconfirmed, unconfirmed
    confirmed = {event["id"] for event in confirms}
    retried_during_cut = {event["id"] for event in confirms if event["retries"] and cut <= event["start"] < restore}
    # A job that prefers w1 (rendezvous) retries there until the failover bound: confirmed before the
    # restore, it failed over to w2; confirmed after, it may have reached w1 itself.
    failed_over = {event["id"] for event in confirms if event["id"] in retried_during_cut and event["end"] < restore}
    journals = {label: run.journal_ids(label) for label in ("w1", "w2")}
    before_cut = {event["id"] for event in confirms if event["end"] < cut}
    assert before_cut & journals["w1"] and before_cut & journals["w2"], "confirmed jobs did not reach both workers"
    assert retried_during_cut, "no confirmed job was unacknowledged by the cut host and retried"
    assert failed_over <= journals["w2"], "a confirmed job retried during the cut did not fail over to the healthy worker"
    assert confirmed <= journals["w1"] | journals["w2"], "a confirmed job is in no journal"

    ran = wait_for(lambda: (seen := run.records()) and all(f"c {job}" in seen for job in confirmed) and seen,
                   timeout=30, what="every confirmed job to run")
    duplicates = sum(count - 1 for line, count in ran.items() if line.startswith("c ") and count > 1)
    in_both = journals["w1"] & journals["w2"]
    plain_ran = {line.split()[1] for line in ran if line.startswith("p ")} & plain_sent_during_cut
    served_before_cut = Counter(pids[event["pid"]] for event in calls if event["end"] < cut)
    tracebacks = {label: run.logs[label].read_text().count("Traceback") for label in run.workers}

    print(
        f"\nmulti-host ({'patched' if MONKEY_PATCHED else 'plain'} client): calls before the cut "
        f"w1 {served_before_cut['w1']} w2 {served_before_cut['w2']}; cut {restore - cut:.1f} s; "
        f"calls after cut {len(after_cut)} ok {sum(e['ok'] for e in after_cut)} raw timeouts {call_timeouts} "
        f"slowest {slowest:.2f} s; confirmed sent {len(confirmed)} executed {len(confirmed)} "
        f"duplicates {duplicates} (ids in both journals {len(in_both)}, of them retried during the cut "
        f"{len(in_both & retried_during_cut)}) lost 0; "
        f"confirm retries during cut {sum(e['retries'] for e in confirms if cut <= e['start'] < restore)} "
        f"({len(retried_during_cut)} jobs, {len(failed_over)} failed over to w2); "
        f"calls back on w1 after restore in {min(spread.values()):.1f}-{max(spread.values()):.1f} s; "
        f"plain jobs pushed during cut {len(plain_sent_during_cut)}, ran before restore "
        f"{len(plain_ran_during_cut & plain_sent_during_cut)}, by the end {len(plain_ran)}; "
        f"journals w1 {len(journals['w1'])} w2 {len(journals['w2'])}; worker tracebacks {tracebacks}"
    )
