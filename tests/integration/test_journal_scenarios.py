"""Confirmed jobs in the situations operators meet: restarts in a fresh PID namespace, a job that
kills its process, a journal that is locked, deleted, replaced or on a full disk.

Real worker processes, real SIGKILL, real namespaces and tmpfs (those need root: skipped otherwise,
with the reason). Each test prints a line ``scenario: acknowledged N, executed N, twice N, lost N``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import pytest

import zqsync
from tests.helpers import children_of, over_prefork_modes, pid_exists, wait_for
from zqsync.processes import stop_process
from zqsync.wire.endpoints import split_endpoint

TASKS = "tests.integration.crash_tasks:registry"
ROOT = Path(__file__).resolve().parents[2]
DIED = "worker died while running it"


def count_lines(path: Path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def report(scenario: str, acknowledged: list[str], seen: Counter) -> None:
    executed = sum(seen[line] for line in acknowledged)
    twice = sum(1 for line in acknowledged if seen[line] > 1)
    lost = sum(1 for line in acknowledged if not seen[line])
    print(f"{scenario}: acknowledged {len(acknowledged)}, executed {executed}, twice {twice}, lost {lost}")


def job_row(state: Path, job_id: str) -> Optional[tuple]:
    """(state, attempts, error) of a job, read with plain sqlite3."""
    db = sqlite3.connect(state / "journal.sqlite3", timeout=10)
    try:
        return db.execute("SELECT state, attempts, error FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        db.close()


def confirm_gated(endpoint: str, out: Path, gate: Path, count: int) -> list[str]:
    lines = [f"job-{index}" for index in range(count)]
    with zqsync.Client(endpoint) as client:
        for line in lines:
            client.enqueue_with_options("gated", args=(str(out), line, str(gate)), confirm=True)
    return lines


# -- 1. a restart in a fresh PID namespace ---------------------------------------------------------


def _namespace_unavailable() -> Optional[str]:
    if os.geteuid() != 0:
        return "a new PID namespace needs root (run the suite as root to include it)"
    if shutil.which("unshare") is None:
        return "util-linux's `unshare` is not installed"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
                           capture_output=True, text=True, timeout=20)
    return None if probe.returncode == 0 else f"`unshare --pid` does not work here: {probe.stderr.strip()}"


class NamespacedWorker:
    """``zqsync worker`` as PID 1 of a new PID namespace, as ``docker run`` starts it.

    ``--kill-child``: SIGKILL of the ``unshare`` process kills the namespace's init, and with it
    every process of the namespace. No ``--parent-pid``: the parent is outside the namespace.
    """

    def __init__(self, tmp_path: Path, state: Path, name: str, processes: Optional[int]) -> None:
        ready = tmp_path / f"{name}.ready"
        command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                   sys.executable, "-m", "zqsync", "worker", TASKS, "--bind", "tcp://127.0.0.1:0",
                   "--ready-file", str(ready), "--state-dir", str(state), "--concurrency", "2"]
        if processes:
            command += ["--processes", str(processes)]
        with open(tmp_path / f"{name}.log", "ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: ready.exists() or self.proc.poll() is not None, timeout=60, what="the worker to listen")
        assert self.proc.poll() is None, (tmp_path / f"{name}.log").read_text()
        self.endpoint = ready.read_text().strip()

    def pids(self) -> set[int]:
        """The worker's pid, or its children's."""
        with zqsync.Client(self.endpoint) as client:
            stats = client.call("zqsync.stats")
        return {process["pid"] for process in stats.get("children", [stats])}

    def kill(self) -> None:
        """SIGKILL the namespace, and return once every process of it is gone.

        The kernel kills the namespace's processes after its init dies, not at
        once: a worker child could otherwise still run a job the test releases next.
        """
        processes = self._descendants(self.proc.pid)
        stop_process(self.proc, sig=signal.SIGKILL)
        wait_for(lambda: not any(pid_exists(pid) for pid in processes), timeout=30,
                 what="every process of the killed namespace to be gone")

    @staticmethod
    def _descendants(pid: int) -> list[int]:
        found, pending = [], [pid]
        while pending:
            children = children_of(pending.pop())
            found += children
            pending += children
        return found


@pytest.fixture
def namespaces():
    reason = _namespace_unavailable()
    if reason:
        pytest.skip(reason)
    started: list[NamespacedWorker] = []
    yield started
    for worker in started:
        worker.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [None, 2])
def test_jobs_acknowledged_before_a_restart_in_a_fresh_pid_namespace_run_after_it(namespaces, tmp_path, processes):
    state, out, gate = tmp_path / "state", tmp_path / "out.txt", tmp_path / "gate"
    first = NamespacedWorker(tmp_path, state, "first", processes)
    namespaces.append(first)
    first_pids = first.pids()  # asked first: the gated jobs will hold every task slot
    acknowledged = confirm_gated(first.endpoint, out, gate, 20)
    first.kill()
    gate.touch()
    second = NamespacedWorker(tmp_path, state, "second", processes)
    namespaces.append(second)
    assert second.pids() & first_pids, "the same pids again, as in containers"
    seen = wait_for(lambda: (c := count_lines(out)) and len(c) == 20 and c, timeout=30,
                    what="every acknowledged job to run after the restart")
    report(f"pid namespace restart, processes={processes or 1}", acknowledged, seen)
    assert seen == Counter(acknowledged)


def confirm_until_killed(worker, out: Path, prefix: str, kill_after: int) -> list[str]:
    """Confirm ``record`` jobs one at a time from a thread; SIGKILL the worker once ``kill_after`` are
    acknowledged, at whatever point of the next confirm it is. Returns the ids acknowledged."""
    acknowledged: list[str] = []
    killed = threading.Event()

    def confirm() -> None:
        with zqsync.Client(worker.endpoint, confirm_timeout=2.0, confirm_retry=0.5) as client:
            for index in range(100_000):
                try:
                    client.enqueue_with_options("record", args=(str(out), f"{prefix}-{index}"), confirm=True,
                                                job_id=f"{prefix}-{index}")
                except zqsync.Unconfirmed:
                    return
                acknowledged.append(f"{prefix}-{index}")
                if killed.is_set():
                    return

    client = threading.Thread(target=confirm)
    client.start()
    wait_for(lambda: len(acknowledged) >= kill_after, what=f"{kill_after} acknowledged confirms")
    os.kill(worker.pid, signal.SIGKILL)
    killed.set()
    client.join(30)
    return acknowledged


@pytest.mark.timeout(120)
def test_a_worker_killed_while_a_sequential_client_confirms_runs_every_acknowledged_job_after_a_restart(
        zq_worker, tmp_path):
    """Sequential confirms are journaled by the hub itself (``GroupCommit.add``): SIGKILLs at moments spread over a
    stream of them lose none that was acknowledged."""
    state, out = tmp_path / "state", tmp_path / "out.txt"
    acknowledged: list[str] = []
    for round_, kill_after in enumerate((40, 97, 151)):
        worker = zq_worker("zqsync.demo.tasks:registry", extra_args=["--state-dir", str(state)])
        acknowledged += confirm_until_killed(worker, out, f"r{round_}", kill_after)
    zq_worker("zqsync.demo.tasks:registry", extra_args=["--state-dir", str(state)])  # replays the dead owners' rows
    seen = wait_for(lambda: (c := count_lines(out)) and set(acknowledged) <= set(c) and c, timeout=60,
                    what="every acknowledged job to run")
    report("SIGKILL during sequential confirms", acknowledged, seen)
    assert set(acknowledged) <= set(seen)


# -- 2. a job that kills its process ---------------------------------------------------------------


def confirm_poison(client: zqsync.Client, marks) -> None:
    """Confirm the poison job. It kills its process the moment it starts, which can take the
    acknowledgement, sent an instant before, down with it (docs/design.md, "Confirmed enqueue"): the
    client then sends the confirm again, and the answer says what became of the job by then."""
    try:
        client.enqueue_with_options("poison", args=(str(marks),), confirm=True, job_id="poison-1")
    except zqsync.DuplicateJob as exc:
        assert "dead-lettered" in str(exc)


@pytest.mark.timeout(120)
def test_a_job_that_kills_its_process_is_dead_lettered_after_its_attempts_and_healthy_jobs_complete(
        zq_worker, tmp_path):
    """poison has retries=2: three attempts, each counted before it starts, then dead-lettered. Ten
    healthy jobs running beside its first attempt die with it, and are run again, alone, to completion."""
    state, out, marks = tmp_path / "state", tmp_path / "out.txt", tmp_path / "poison.txt"
    args = {"extra_args": ["--state-dir", str(state)], "concurrency": 20}
    worker = zq_worker(TASKS, **args)
    healthy = [f"healthy-{index}" for index in range(10)]
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with zqsync.Client(worker.endpoint, confirm_timeout=60) as client:
                for line in healthy:
                    client.enqueue_with_options("record", args=(str(out), line, 0.3), confirm=True)
                confirm_poison(client, marks)
        except BaseException as exc:  # reported below
            errors.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()

    def poison_state() -> str:
        return (job_row(state, "poison-1") or ("?",))[0]

    restarts = 0
    while poison_state() != "dead" and restarts < 6:
        proc = worker.proc
        wait_for(lambda proc=proc: proc.poll() is not None or poison_state() == "dead", timeout=30,
                 what="the worker to die or the poison job to be dead-lettered")
        if proc.poll() is not None:  # restarted, as a service manager would
            worker = zq_worker(TASKS, bind=worker.endpoint, **args)
            restarts += 1
    sender.join(60)
    assert errors == []
    assert job_row(state, "poison-1") == ("dead", 3, DIED)
    assert count_lines(marks) == Counter({"poison": 3}), "retries + 1 attempts, no more"
    seen = wait_for(lambda: (c := count_lines(out)) and len(c) == 10 and c, timeout=30,
                    what="every healthy job to complete")
    report("poison job (os._exit), healthy jobs", healthy, seen)
    assert set(seen) == set(healthy)
    assert restarts == 3


@pytest.mark.timeout(120)
@over_prefork_modes
def test_under_a_supervisor_a_job_that_kills_its_process_is_dead_lettered_while_healthy_jobs_complete(
        zq_worker, tmp_path, mode):
    state, out, marks = tmp_path / "state", tmp_path / "out.txt", tmp_path / "poison.txt"
    supervisor = zq_worker(TASKS, extra_args=["--processes", "2", *mode, "--state-dir", str(state)], concurrency=20)
    healthy: list[str] = []
    with zqsync.Client(supervisor.endpoint, confirm_timeout=60) as client:
        confirm_poison(client, marks)
        deadline = time.monotonic() + 60
        while ((job_row(state, "poison-1") or ("?",))[0] != "dead" or len(healthy) < 20) and time.monotonic() < deadline:
            healthy.append(f"healthy-{len(healthy)}")
            client.enqueue_with_options("record", args=(str(out), healthy[-1], 0.05), confirm=True)
    assert job_row(state, "poison-1") == ("dead", 3, DIED)
    assert count_lines(marks) == Counter({"poison": 3})
    seen = wait_for(lambda: (c := count_lines(out)) and len(c) == len(healthy) and c, timeout=30,
                    what="every healthy job to complete")
    report("poison job (os._exit) under a supervisor, healthy jobs meanwhile", healthy, seen)
    assert set(seen) == set(healthy)
    assert supervisor.proc.poll() is None


# -- 3. journal errors -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_journal_locked_at_startup_delays_replay_loudly_and_refuses_confirms_with_the_cause(
        zq_worker, tmp_path):
    state, out, gate = tmp_path / "state", tmp_path / "out.txt", tmp_path / "gate"
    first = zq_worker(TASKS, extra_args=["--state-dir", str(state)], concurrency=2)
    acknowledged = confirm_gated(first.endpoint, out, gate, 20)
    first.stop(sig=signal.SIGKILL)
    holder = sqlite3.connect(state / "journal.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write lock, held across the restart
    try:
        worker = zq_worker(TASKS, extra_args=["--state-dir", str(state), "--journal-busy-timeout", "0.3"])
        wait_for(lambda: worker.output().count("journal replay failed") >= 2, what="replay failures to be logged")
        with zqsync.Client(worker.endpoint) as client:
            with pytest.raises(zqsync.JournalUnavailable) as caught:
                client.enqueue_with_options("record", args=(str(out), "refused"), confirm=True, job_id="refused")
        assert "locked" in caught.value.remote_message and caught.value.job_id == "refused"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    gate.touch()
    with zqsync.Client(worker.endpoint) as client:
        wait_for(lambda: _confirms(client, out, "after-the-lock"), what="a confirm to be acknowledged again")
    acknowledged.append("after-the-lock")
    seen = wait_for(lambda: (c := count_lines(out)) and len(c) == 21 and c, timeout=30,
                    what="every acknowledged job to be replayed once the lock is gone")
    report("journal locked at startup", acknowledged, seen)
    assert seen == Counter(acknowledged)
    assert "ERROR zqsync.worker.scheduler: journal replay failed" in worker.output()


def zqsync_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zqsync", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def corrupt_indexes(journal: Path) -> None:
    """Overwrite the root page of every index of the (checkpointed) journal with garbage."""
    db = sqlite3.connect(journal)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = [row[0] for row in db.execute("SELECT rootpage FROM sqlite_master WHERE type = 'index'")]
    db.close()
    with open(journal, "r+b") as handle:
        for page in pages:
            handle.seek((page - 1) * size)
            handle.write(b"\xa5" * size)


@pytest.mark.timeout(120)
def test_a_corrupt_journal_is_reported_at_error_again_and_again_and_confirms_are_refused(zq_worker, tmp_path):
    state, out, gate = tmp_path / "state", tmp_path / "out.txt", tmp_path / "gate"
    first = zq_worker(TASKS, extra_args=["--state-dir", str(state)], concurrency=2)
    acknowledged = confirm_gated(first.endpoint, out, gate, 5)
    first.stop(sig=signal.SIGKILL)
    corrupt_indexes(state / "journal.sqlite3")
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    wait_for(lambda: worker.output().count("journal replay failed") >= 3, what="replay failures to be logged, and retried")
    assert "malformed" in worker.output()
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.JournalUnavailable) as caught:
            client.enqueue_with_options("record", args=(str(out), "refused"), confirm=True)
        assert "malformed" in caught.value.remote_message
        assert client.call("zqsync.ping") == "pong", "the worker keeps serving calls"
    assert "zqsync jobs recover" in worker.output(), "the log says how to repair it"
    refused = zqsync_cli("jobs", "recover", "--state-dir", str(state))
    assert refused.returncode != 0 and "stop it first" in refused.stderr, "never under a live worker"
    worker.stop()
    recovered = zqsync_cli("jobs", "recover", "--state-dir", str(state))
    assert recovered.returncode == 0, recovered.stderr
    assert f"recovered {len(acknowledged)} job(s)" in recovered.stdout
    gate.touch()
    zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    wait_for(lambda: sum(count_lines(out).values()) >= len(acknowledged), what="the acknowledged jobs to run after recover")
    report("corrupt index pages, then zqsync jobs recover", acknowledged, count_lines(out))
    assert count_lines(out) == Counter(acknowledged)


@pytest.mark.parametrize("how", ["deleted", "replaced", "directory removed"])
def test_a_worker_whose_journal_file_is_gone_refuses_to_acknowledge(zq_worker, tmp_path, how):
    state, out = tmp_path / "state", tmp_path / "out.txt"
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    with zqsync.Client(worker.endpoint) as client:
        client.enqueue_with_options("record", args=(str(out), "before"), confirm=True)
        if how == "directory removed":
            shutil.rmtree(state)
        else:
            for suffix in ("", "-wal", "-shm"):
                (state / f"journal.sqlite3{suffix}").unlink()
        if how == "replaced":
            sqlite3.connect(state / "journal.sqlite3").close()
        for attempt in range(2):  # and it keeps refusing
            with pytest.raises(zqsync.JournalUnavailable) as caught:
                client.enqueue_with_options("record", args=(str(out), f"after-{attempt}"), confirm=True)
            assert "journal file" in caught.value.remote_message
            assert ("replaced" if how == "replaced" else "gone") in caught.value.remote_message
    wait_for(lambda: count_lines(out) == Counter(["before"]), what="the job acknowledged before to run")
    assert worker.stats()["confirmed_refused"] == 2


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (run the suite as root to include the full-disk test)")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                             capture_output=True, text=True, timeout=20)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=20)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:  # ENOSPC: full
        return filler
    finally:
        os.close(fd)


@pytest.mark.timeout(120)
def test_a_full_disk_refuses_confirms_at_once_and_outcomes_are_kept_until_written(zq_worker, tmp_path, small_tmpfs):
    state, out, gate = small_tmpfs / "state", tmp_path / "out.txt", tmp_path / "gate"
    args = {"extra_args": ["--state-dir", str(state)], "concurrency": 30}  # slots to spare for stats calls
    worker = zq_worker(TASKS, **args)
    acknowledged = confirm_gated(worker.endpoint, out, gate, 20)
    wait_for(lambda: worker.stats()["in_flight"] == 20, what="every job to be running")
    filler = fill(small_tmpfs)
    with zqsync.Client(worker.endpoint, confirm_timeout=10) as client:
        with pytest.raises(zqsync.JournalUnavailable) as caught:
            client.enqueue_with_options("record", args=(str(out), "refused"), confirm=True)
        assert "full" in caught.value.remote_message
        # More confirms while the disk stays full: the journal is probed between them, and no probe
        # may call it writable (an empty transaction succeeds on a full disk; the next write then fails).
        wait_for(lambda: _refused(client, tmp_path / "elsewhere.txt")
                 and worker.output().count("journal write failed") >= 5, what="writes and probes to fail")
    # Old code: a WARNING "can be written again" after every failure. A write can really succeed on a
    # full disk (SQLite reuses the WAL file's space after a checkpoint), so one is tolerated.
    assert worker.output().count("written again") <= 1, worker.output()
    gate.touch()  # the jobs finish while their outcomes cannot be written
    wait_for(lambda: len(count_lines(out)) == 20, what="the jobs to run")
    wait_for(lambda: "; 20 outcome(s) kept to retry" in worker.output(), what="the outcomes' write to fail")
    filler.unlink()
    wait_for(lambda: _done(state) == 20, timeout=30, what="the kept outcomes to be written once there is space")
    with zqsync.Client(worker.endpoint, confirm_timeout=10) as client:  # acknowledging again
        wait_for(lambda: _confirms(client, out, "recovered"), what="a confirm to be acknowledged again")
    assert "the journal was written again after" in worker.output()
    acknowledged.append("recovered")
    wait_for(lambda: _done(state) == 21, what="the recovered job to be done")
    worker.stop(sig=signal.SIGKILL)
    zq_worker(TASKS, bind=worker.endpoint, **args)
    time.sleep(2.0)  # several replay passes: a job whose outcome was lost would run again now
    seen = count_lines(out)
    report("full disk (tmpfs)", acknowledged, seen)
    assert seen == Counter(acknowledged), "nothing ran twice after the restart"


def _refused(client: zqsync.Client, out: Path) -> bool:
    try:
        client.enqueue_with_options("record", args=(str(out), "probe"), confirm=True)
    except zqsync.JournalUnavailable:
        return True
    return False


def _confirms(client: zqsync.Client, out: Path, line: str) -> bool:
    try:
        client.enqueue_with_options("record", args=(str(out), line), confirm=True, job_id=line)
    except zqsync.JournalUnavailable:
        return False
    return True


def _done(state: Path) -> int:
    db = sqlite3.connect(state / "journal.sqlite3", timeout=10)
    try:
        return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'done'").fetchone()[0]
    finally:
        db.close()


# -- 5. several workers: one preferred worker per job id --------------------------------------------


def _confirm_all(endpoints: list[str], out: Path, ids: list[str]) -> tuple:
    """Confirms ``ids`` from one thread each, over one shared client; returns (errors, threads, client)."""
    errors: list[BaseException] = []
    client = zqsync.Client(endpoints, confirm_retry=0.3, confirm_timeout=30)  # one per process, shared

    def send(job_id: str) -> None:
        try:
            client.enqueue_with_options("record", args=(str(out), job_id), confirm=True, job_id=job_id)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(job_id,), daemon=True) for job_id in ids]
    for thread in threads:
        thread.start()
    return errors, threads, client


@pytest.mark.timeout(120)
@pytest.mark.parametrize("slow_for", [1.0, 3.0])
def test_a_retried_confirm_goes_to_the_same_worker_and_fails_over_only_past_the_bound(zq_worker, tmp_path, slow_for):
    """Worker 1's hub is blocked (a task busy-looping) while 12 confirms are in flight; its I/O thread
    still takes them in. Slow for 1.0 s (3 attempts of 0.3 s, under the 1.5 s failover bound): every
    attempt goes to the job's preferred worker, and every job runs once. Slow for 3.0 s: the jobs
    that prefer worker 1 fail over to worker 2, and may run twice: the documented case."""
    from zqsync.client.rendezvous import rank

    out = tmp_path / "out.txt"
    workers = [zq_worker(TASKS, extra_args=["--state-dir", str(tmp_path / f"state{n}")]) for n in (1, 2)]
    endpoints = [worker.endpoint for worker in workers]
    rpc = [split_endpoint(endpoint)[1] for endpoint in endpoints]
    ids = [f"job-{index}" for index in range(12)]
    prefer_slow = {job_id for job_id in ids if rank(job_id, rpc)[0] == rpc[0]}
    assert 0 < len(prefer_slow) < len(ids)
    with zqsync.Client(endpoints[0], call_timeout=30) as hog_client:
        marker = tmp_path / "hogging"
        hogging = threading.Thread(target=hog_client.call, args=("hog", slow_for, str(marker)), daemon=True)
        hogging.start()
        wait_for(marker.exists, what="worker 1 to be busy")
        errors, threads, client = _confirm_all(endpoints, out, ids)
        hogging.join(30)
    for thread in threads:
        thread.join(60)
    client.close()
    assert errors == []
    wait_for(lambda: len(count_lines(out)) == len(ids), what="every job to run")
    time.sleep(1.0)  # a duplicate, if any, runs now
    seen = count_lines(out)
    report(f"two workers, preferred one slow {slow_for} s", ids, seen)
    twice = {job_id for job_id in ids if seen[job_id] > 1}
    if slow_for < 1.5:
        assert twice == set()
    else:
        assert twice <= prefer_slow
