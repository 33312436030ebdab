"""Fork scenarios S01, S02 and S12 (docs/scenarios.md) with real forks and real workers.

Reuse and discard are proven from the worker's side: every pooled socket
carries the identity ``zq-<pid>-<random>``, and the worker reports the
distinct identities it saw per client pid (``identities_by_pid``). One
identity for a pid across many calls means one socket, reused; an identity
under the child's pid means the child dialled a socket of its own.

Plain run: the parent is a synchronous caller (a native thread without a
gevent hub, so the pool hands out plain ``zmq`` sockets). Monkey-patched run:
the parent is the main greenlet (green sockets, gevent's ``os.fork``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import gevent
import pytest

import zqsync
from tests.conftest import MONKEY_PATCHED, ROOT
from zqsync import _common
from zqsync.testing import run_in_fork

pytestmark = pytest.mark.timeout(90)

MODE = "patched" if MONKEY_PATCHED else "plain"


def as_caller(fn, *args, timeout: float = 90.0):
    """Run ``fn`` as this mode's caller: a hub-free native thread (plain) or the main greenlet (patched)."""
    if MONKEY_PATCHED:
        return fn(*args)
    outcome: dict = {}

    def body() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # handed to the test's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=body, name="sync-caller")
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the caller thread hung for more than {timeout} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def by_pid(worker) -> dict[int, int]:
    """Distinct pooled-socket identities (``zq-<pid>-<random>``) the worker saw, per client pid."""
    counts: dict[int, int] = {}
    for identity in worker.identities():
        prefix, pid, _ = identity.split("-")
        assert prefix == "zq", f"unexpected caller identity {identity!r}"
        counts[int(pid)] = counts.get(int(pid), 0) + 1
    return counts


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- S01: a client used before fork keeps working in the parent and the child ----------------


def _child_calls(client_a, client_b, tag: str) -> dict:
    return {
        "pid": os.getpid(),
        "a": [client_a.call("add", n, 100) for n in range(3)],
        "b": [client_b.call("echo", f"{tag}-{n}") for n in range(3)],
    }


def test_bare_os_fork_child_dials_its_own_sockets_and_parent_keeps_its_own(zq_worker, zq_peer):
    """S01 (bare ``os.fork``): every call in parent and child completes; the child opens its
    own sockets to both workers, and the parent's one socket per worker survives the child."""
    worker_a, worker_b = zq_worker(), zq_peer()

    def scenario() -> tuple[int, int]:
        with zqsync.Client(worker_a.endpoint, call_timeout=20.0) as client_a, \
                zqsync.Client(worker_b.endpoint, call_timeout=20.0) as client_b:
            assert client_a.call("add", 1, 2) == 3  # one call, then fork
            assert client_b.call("echo", "parent-before") == "parent-before"
            child = run_in_fork(_child_calls, client_a, client_b, "child", timeout=60.0)
            assert child["a"] == [100, 101, 102]
            assert child["b"] == ["child-0", "child-1", "child-2"]
            assert child["pid"] != os.getpid()
            for n in range(3):  # the parent's pooled sockets still work after the child exited
                assert client_a.call("add", n, 1) == n + 1
                assert client_b.call("echo", f"parent-after-{n}") == f"parent-after-{n}"
            return os.getpid(), child["pid"]

    parent, child = as_caller(scenario)
    for worker in (worker_a, worker_b):
        seen = by_pid(worker)
        assert seen == {parent: 1, child: 1}, (
            f"expected one reused socket for the parent and one new socket for the child, got {seen}"
        )


def _mp_child(path: str, client_a, client_b) -> None:
    result = _child_calls(client_a, client_b, "mp")
    with open(path, "w") as handle:
        json.dump(result, handle)


def test_multiprocessing_fork_child_calls_both_workers_while_the_parent_keeps_calling(zq_worker, zq_peer, tmp_path):
    """S01 (multiprocessing, 'fork' start method): the parent calls while the child runs; every
    call completes, the child dials its own sockets, the parent's sockets are reused throughout."""
    worker_a, worker_b = zq_worker(), zq_peer()
    path = str(tmp_path / "child.json")

    def scenario() -> tuple[int, int]:
        with zqsync.Client(worker_a.endpoint, call_timeout=20.0) as client_a, \
                zqsync.Client(worker_b.endpoint, call_timeout=20.0) as client_b:
            assert client_a.call("add", 1, 2) == 3
            assert client_b.call("echo", "parent-before") == "parent-before"
            process = multiprocessing.get_context("fork").Process(target=_mp_child, args=(path, client_a, client_b))
            process.start()
            try:
                for n in range(20):  # concurrently with the child
                    assert client_a.call("add", n, 1) == n + 1
                    assert client_b.call("echo", n) == n
                process.join(60.0)
                assert process.exitcode == 0, f"child exit code {process.exitcode}"
            finally:
                if process.exitcode is None:
                    kill_pid(process.pid)
                    process.join(5.0)
            assert client_a.call("add", 2, 2) == 4
            with open(path) as handle:
                child = json.load(handle)
            assert child["a"] == [100, 101, 102]
            assert child["b"] == ["mp-0", "mp-1", "mp-2"]
            return os.getpid(), child["pid"]

    parent, child = as_caller(scenario)
    for worker in (worker_a, worker_b):
        assert by_pid(worker) == {parent: 1, child: 1}


def run_in_unhooked_fork(fn, *args, timeout: float = 60.0):
    """:func:`zqsync.testing.run_in_fork` with zqsync's at-fork callbacks emptied while it runs:
    the child learns of the fork only through the pool's pid check, as after a fork made by C code.

    Not a raw ``fork(2)`` through ctypes (as this harness once was): that also skips CPython's own
    after-fork repair (``PyOS_AfterFork_Child``, which C code that forks and keeps running Python
    must call). Without it, a child forked while another thread (zqsync's sweeper, waking every
    2 s) waits for the GIL can wait in ``drop_gil`` for that thread forever: 1 child in 40 hung in
    a 20-line reproduction, and one hung in CI for 60 s.
    """
    saved = list(_common._fork_callbacks)
    _common._fork_callbacks.clear()
    try:
        return run_in_fork(fn, *args, timeout=timeout)
    finally:
        _common._fork_callbacks[:] = saved


def test_fork_that_skips_the_at_fork_hook_is_caught_by_the_pid_check(zq_worker, zq_peer):
    """S01 / rule 9 (a fork zqsync's at-fork hook does not see, as a C-level one): the pid check alone makes the
    child dial its own sockets; its calls complete and the parent's sockets keep working."""
    worker_a, worker_b = zq_worker(), zq_peer()

    def scenario() -> tuple[int, int]:
        with zqsync.Client(worker_a.endpoint, call_timeout=20.0) as client_a, \
                zqsync.Client(worker_b.endpoint, call_timeout=20.0) as client_b:
            assert client_a.call("add", 1, 2) == 3
            assert client_b.call("echo", "parent-before") == "parent-before"
            child = run_in_unhooked_fork(_child_calls, client_a, client_b, "cfork")
            assert child["a"] == [100, 101, 102]
            assert child["b"] == ["cfork-0", "cfork-1", "cfork-2"]
            assert client_a.call("add", 5, 5) == 10
            assert client_b.call("echo", "parent-after") == "parent-after"
            return os.getpid(), child["pid"]

    parent, child = as_caller(scenario)
    for worker in (worker_a, worker_b):
        assert by_pid(worker) == {parent: 1, child: 1}


# -- S02: a task inside a worker forks, and the child calls another worker --------------------


FORKING_APP = "tests.fork.forking_tasks:registry"


def stop_with_forked_children(worker) -> None:
    """Stop the worker by its pid, then SIGKILL what is left of its process group: children
    its tasks forked (the worker runs in a session of its own, so the group id is its pid)."""
    worker.stop(timeout=10.0)
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_child_forked_by_a_task_calls_another_worker_and_the_worker_keeps_serving(zq_worker, zq_peer):
    """S02: a task that already used its pooled client forks; the child's calls to another
    worker complete on a socket of its own, and the forking worker keeps serving."""
    peer = zq_peer()
    worker = zq_worker(FORKING_APP, cwd=ROOT)
    gevent.get_hub()
    try:
        with zqsync.Client(worker.endpoint, call_timeout=30.0) as client:
            reports = [client.call("fork_and_call", peer.endpoint, f"round{n}") for n in range(3)]
            for n, report in enumerate(reports):
                assert report["exit_code"] == 0, report
                assert report["before"] == f"before-fork-round{n}"
                assert report["child"]["results"] == [f"round{n}-{i}" for i in range(3)], report
                assert report["child"]["pid"] == report["child_pid"]
            # the worker keeps serving, and its own pooled socket to the peer still works
            assert client.call("call_peer", peer.endpoint, "after")["result"] == "after"
            assert isinstance(client.call("ping"), int)
    finally:
        stop_with_forked_children(worker)
    worker_pid = reports[0]["worker_pid"]
    seen = by_pid(peer)
    assert seen[worker_pid] == 1, f"the worker's own socket was not reused across forks: {seen}"
    for report in reports:
        assert seen[report["child_pid"]] == 1, seen
    assert set(seen) == {worker_pid} | {report["child_pid"] for report in reports}


def test_worker_keeps_serving_concurrent_calls_while_a_task_child_is_alive(zq_worker, zq_peer):
    """S02: while a task's forked child is alive and calling another worker, the forking worker
    answers other calls, including one whose pooled lease was in flight at the moment of the
    fork (greenlets copied into the child must not touch the parent's sockets)."""
    peer = zq_peer()
    idle = peer.stats()["in_flight"]  # 0, or 1 where the asking zqsync.stats call counts itself
    worker = zq_worker(FORKING_APP, cwd=ROOT)
    gevent.get_hub()
    try:
        with zqsync.Client(worker.endpoint, call_timeout=30.0, pool_size=16, lease_timeout=30.0) as client:
            assert client.call("call_peer", peer.endpoint, "warm")["result"] == "warm"
            slow = gevent.spawn(client.call, "call_peer_slowly", peer.endpoint, 3.0, "slow")
            deadline = time.monotonic() + 20.0
            while peer.stats()["in_flight"] - idle < 1:  # the worker's lease to the peer is on the wire
                assert time.monotonic() < deadline, "the slow call never reached the peer"
                gevent.sleep(0.05)
            forker = gevent.spawn(client.call, "fork_and_call", peer.endpoint, "busy", 4, 0.4)
            pings = []
            until = time.monotonic() + 2.0
            while time.monotonic() < until:  # calls land on the worker while its child lives
                pings.append(gevent.spawn(client.call, "ping"))
                gevent.sleep(0.02)
            gevent.joinall([slow, forker, *pings], timeout=40.0)
            for greenlet in [slow, forker, *pings]:
                assert greenlet.successful(), f"{greenlet!r} failed: {greenlet.exception!r}"
            report = forker.value
            assert report["exit_code"] == 0 and report["child"]["results"] == [f"busy-{i}" for i in range(4)], report
            assert slow.value["result"] == "slow"
            assert {ping.value for ping in pings} == {report["worker_pid"]}
            assert client.call("call_peer", peer.endpoint, "after")["result"] == "after"
    finally:
        stop_with_forked_children(worker)


# -- S12: children exit in every way; the parent's pooled sockets keep working ---------------


S12_SCRIPT = r"""
import faulthandler, json, os, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's dump of a hung script: every thread
mode, endpoint, record_path = sys.argv[1:4]
if mode == "patched":
    from gevent import monkey
    monkey.patch_all()
    import gevent.util
    signal.signal(signal.SIGUSR2, lambda *_: gevent.util.print_run_info(file=sys.stderr))  # and every greenlet
    gevent.get_hub().loop.install_sigchld()  # before the first fork (docs/guides/testing.md)
import multiprocessing
import zqsync

client = zqsync.Client(endpoint, call_timeout=20.0)
report = {"pid": os.getpid(), "before": [client.call("echo", n) for n in range(3)], "exits": {}, "after": {}}
client.enqueue("record", record_path, "parent-before")

def use_client(tag):
    return [client.call("echo", f"{tag}-{n}") for n in range(2)]

def mp_target(tag):
    use_client(tag)

ways = ["os_exit_idle", "os_exit_used", "exit_idle", "exit_used", "uncaught_used", "mp_used", "mp_idle"]
for way in ways:
    if way.startswith("mp_"):
        process = multiprocessing.get_context("fork").Process(
            target=mp_target if way == "mp_used" else (lambda: None), args=(way,) if way == "mp_used" else ())
        process.start()
        process.join(60)
        code = process.exitcode
    else:
        pid = os.fork()
        if pid == 0:
            if way.endswith("_used"):
                use_client(way)
                if not way.startswith("os_exit"):  # os._exit skips the flush at exit: at most once
                    client.enqueue("record", record_path, way)
            if way.startswith("os_exit"):
                os._exit(0)
            if way.startswith("uncaught"):
                raise RuntimeError("child ends by an uncaught exception")
            sys.exit(0)  # normal interpreter exit: atexit hooks, module teardown, garbage collection
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    report["exits"][way] = code
    report["after"][way] = client.call("echo", way)  # the parent's pooled socket, right after the child ended
client.enqueue("record", record_path, "parent-after")
report["final"] = [client.call("echo", n) for n in range(3)]
client.close()
print(json.dumps(report), flush=True)
"""


def test_children_exiting_any_way_never_break_the_parents_pooled_sockets(zq_worker, tmp_path):
    """S12: a parent holding pooled sockets forks children that exit through ``os._exit``,
    normal interpreter exit, an uncaught exception and multiprocessing; after each, the parent's
    same socket (one identity, seen by the worker) answers, and its PUSH socket still delivers."""
    worker = zq_worker()
    record = tmp_path / "records.txt"
    process = subprocess.Popen(
        [sys.executable, "-c", S12_SCRIPT, MODE, worker.endpoint, str(record)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=60.0)
    except subprocess.TimeoutExpired:  # show where it hangs: every thread, then (patched) every greenlet
        for dump in (signal.SIGUSR1, signal.SIGUSR2):
            os.killpg(process.pid, dump)
            time.sleep(1.0)
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate(timeout=10.0)
        pytest.fail(f"the script hung for 60 s; records {record.read_text() if record.exists() else ''!r}; "
                    f"its output {out[-2000:]!r}; its stacks:\n{err[-20000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the script and any child it left
            process.wait(5.0)
    assert process.returncode == 0, f"parent script died with {process.returncode}:\n{err[-3000:]}"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["before"] == [0, 1, 2] and report["final"] == [0, 1, 2]
    expected_exits = {"os_exit_idle": 0, "os_exit_used": 0, "exit_idle": 0, "exit_used": 0,
                      "uncaught_used": 1, "mp_used": 0, "mp_idle": 0}
    assert report["exits"] == expected_exits, err[-3000:]
    assert report["after"] == {way: way for way in expected_exits}
    seen = by_pid(worker)
    assert seen.pop(report["pid"]) == 1, "the parent's pooled DEALER was replaced: a child broke it"
    assert len(seen) == 4 and set(seen.values()) == {1}, f"one own socket per child that called: {seen}"

    def lines() -> list[str]:
        return record.read_text().split() if record.exists() else []

    deadline = time.monotonic() + 20.0
    while sorted(lines()) != sorted(["parent-before", "parent-after", "exit_used", "uncaught_used"]):
        assert time.monotonic() < deadline, f"jobs missing: {lines()}"
        time.sleep(0.05)
