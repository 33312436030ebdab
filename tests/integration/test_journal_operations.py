"""What an operator does with a worker's journal: foreign orphans left for the right worker, dead
letters listed with their arguments, requeued, purged and pruned, a dead job's id refused with
DuplicateJob; and a supervisor that survives a replacement child's bad boot."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest

import zqsync
from tests.helpers import children_of, wait_for

TASKS = "tests.integration.crash_tasks:registry"


def count_lines(path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def jobs_cli(state, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zqsync", "jobs", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60)


def listed(state, *args: str) -> list[dict]:
    result = jobs_cli(state, *args, "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.timeout(120)
def test_orphans_of_a_task_this_worker_lacks_stay_for_a_worker_that_has_it(zq_worker, tmp_path):
    state, out, gate = tmp_path / "state", tmp_path / "out.txt", tmp_path / "gate"
    first = zq_worker(TASKS, extra_args=["--state-dir", str(state)], concurrency=2)
    lines = [f"job-{index}" for index in range(5)]
    with zqsync.Client(first.endpoint) as client:
        for line in lines:
            client.enqueue_with_options("gated", args=(str(out), line, str(gate)), confirm=True)
    first.stop(sig=signal.SIGKILL)
    other = zq_worker("tests.integration.crash_tasks:other", extra_args=["--state-dir", str(state)])
    wait_for(lambda: "this worker has no such task" in other.output(), what="the foreign orphans to be noticed")
    gate.touch()
    zq_worker(TASKS, extra_args=["--state-dir", str(state)], concurrency=2)
    seen = wait_for(lambda: (c := count_lines(out)) and len(c) == 5 and c, timeout=30,
                    what="the worker that has the task to run them")
    print(f"foreign orphans: acknowledged 5, executed {sum(seen.values())}, "
          f"twice {sum(1 for n in seen.values() if n > 1)}, lost {5 - len(seen)}")
    assert seen == Counter(lines)
    assert other.output().count("this worker has no such task") == 1, "logged once"
    assert other.stats()["jobs_succeeded"] == 0


@pytest.mark.timeout(120)
def test_dead_letters_are_listed_with_their_arguments_refused_as_duplicates_requeued_and_purged(zq_worker, tmp_path):
    state, out, marker = tmp_path / "state", tmp_path / "out.txt", tmp_path / "fixed"
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    with zqsync.Client(worker.endpoint) as client:
        for job_id in ("dead-1", "dead-2", "dead-3"):
            client.enqueue_with_options("fails_until", args=(str(out), job_id), kwargs={"marker": str(marker)},
                                        confirm=True, job_id=job_id)
        wait_for(lambda: len(listed(state, "--state", "dead")) == 3, what="three dead letters")
        [row] = listed(state, "--id", "dead-1")
        # Named as client.job() names it: a dead letter of a task without retries is "failed".
        assert (row["state"], row["stored_state"], row["attempts"], row["args"], row["kwargs"]) == (
            "failed", "dead", 1, [str(out), "dead-1"], {"marker": str(marker)})
        assert f"{marker} is missing" in row["error"]
        table = jobs_cli(state, "--state", "dead").stdout
        assert '"kwargs": {"marker"' in table and "dead-2" in table
        with pytest.raises(zqsync.DuplicateJob) as caught:
            client.enqueue_with_options("fails_until", args=(str(out), "dead-1"), confirm=True, job_id="dead-1")
        assert caught.value.job_id == "dead-1" and "requeue" in caught.value.remote_message
    marker.touch()
    assert jobs_cli(state, "requeue", "dead-1").stdout.strip() == "requeued 1 job(s)"
    wait_for(lambda: count_lines(out) == Counter(["dead-1"]), what="the requeued job to run on the live worker")
    wait_for(lambda: listed(state, "--id", "dead-1")[0]["state"] == "done", what="the requeued job to be done")
    assert "purged 0 job(s)" in jobs_cli(state, "purge", "--state", "dead", "--older-than", "7d").stdout
    assert "purged 2 job(s)" in jobs_cli(state, "purge", "--state", "dead", "--older-than", "0").stdout
    assert jobs_cli(state, "purge", "--state", "pending", "--older-than", "0").returncode != 0
    assert listed(state, "--state", "dead") == []


@pytest.mark.timeout(120)
def test_requeue_all_dead_and_retention_of_dead_rows(zq_worker, tmp_path):
    state, out, marker = tmp_path / "state", tmp_path / "out.txt", tmp_path / "fixed"
    worker = zq_worker(TASKS, extra_args=["--state-dir", str(state)])
    with zqsync.Client(worker.endpoint) as client:
        for job_id in ("a", "b"):
            client.enqueue_with_options("fails_until", args=(str(out), job_id, str(marker)), confirm=True, job_id=job_id)
    wait_for(lambda: len(listed(state, "--state", "dead")) == 2, what="two dead letters")
    marker.touch()
    assert jobs_cli(state, "requeue", "--all-dead").stdout.strip() == "requeued 2 job(s)"
    wait_for(lambda: count_lines(out) == Counter(["a", "b"]), what="both requeued jobs to run")
    worker.stop()
    marker.unlink()
    pruning = zq_worker(TASKS, extra_args=["--state-dir", str(state), "--keep-dead", "1", "--keep-done", "1"])
    with zqsync.Client(pruning.endpoint) as client:
        client.enqueue_with_options("fails_until", args=(str(out), "c", str(marker)), confirm=True, job_id="c")
    wait_for(lambda: listed(state, "--state", "dead", "--state", "done") == [], timeout=20,
             what="done and dead rows older than 1 s to be pruned")


@pytest.mark.timeout(120)
def test_a_replacement_child_that_fails_to_boot_is_retried_while_its_sibling_serves(zq_worker, tmp_path):
    broken = tmp_path / "mid-deploy"
    supervisor = zq_worker("tests.integration.flaky_boot:registry", extra_args=["--processes", "2"],
                           env={"ZQSYNC_TEST_BREAK_BOOT": str(broken)})
    victim = children_of(supervisor.pid)[0]
    broken.touch()
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: supervisor.output().count("before it finished booting") >= 2, timeout=30,
             what="the replacement to fail to boot twice")
    assert supervisor.proc.poll() is None, "the supervisor keeps running"
    with zqsync.Client(supervisor.endpoint, call_timeout=5) as client:
        assert [client.call("add", 1, index) for index in range(10)] == [1 + index for index in range(10)]
        broken.unlink()
        wait_for(lambda: [child["state"] for child in client.call("zqsync.stats")["children"]] == ["up", "up"],
                 timeout=30, what="the replacement to boot once the deploy is complete")


#: Runs the CLI and prints its peak RSS (``VmHWM``: ``ru_maxrss`` would carry the forking test process's).
RSS_OF_CLI = (
    "import runpy, sys\n"
    "sys.argv = ['zqsync', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('zqsync', run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "hwm = [line for line in open('/proc/self/status') if line.startswith('VmHWM')][0]\n"
    "sys.stderr.write('maxrss_kb %s\\n' % hwm.split()[1])\n"
)


@pytest.mark.timeout(120)
def test_listing_a_big_journal_streams_its_rows_at_flat_memory(tmp_path):
    """``zqsync jobs --json`` on 200,000 dead jobs prints every row and keeps its RSS near an empty
    listing's (it read every row into a list first: 222 MB against 44 MB)."""
    from zqsync.wire.envelope import encode_request
    from zqsync.worker.journal import SqliteJournal, journal_path

    state = tmp_path / "state"
    state.mkdir()
    SqliteJournal(str(state)).close()  # the schema
    rows = 200_000
    with sqlite3.connect(journal_path(str(state))) as db:
        db.executemany("INSERT INTO jobs (id, task, body, state, attempts, created_at, updated_at) "
                       "VALUES (?, 'add', ?, 'dead', 1, ?, ?)",
                       ((f"job-{n:07d}", encode_request("confirm", f"job-{n:07d}", "add", (n, "x" * 100), {}), n, n)
                        for n in range(rows)))

    def listing(*states: str) -> tuple[int, int]:
        argv = [sys.executable, "-c", RSS_OF_CLI, "jobs", "--json", "--limit", "1000000", "--state-dir", str(state)]
        for name in states:
            argv += ["--state", name]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=90)
        return result.stdout.count("\n"), int(result.stderr.split("maxrss_kb ")[1].split()[0])

    printed, rss_kb = listing("dead")
    _, empty_kb = listing("cancelled")
    print(f"zqsync jobs --json on {rows} rows: RSS {rss_kb / 1024:.0f} MB; on none {empty_kb / 1024:.0f} MB")
    assert printed == rows
    assert rss_kb < empty_kb + 20 * 1024, "the listing held the rows in memory"
