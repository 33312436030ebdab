"""Canvas across a SIGKILL (issue 26, item 1, its target row): a chain of 3, a group of 10 and a chord of
10 + callback, each with jobs running in a real worker process when it is SIGKILLed; a new worker on the
same journal finishes them. Each completes once with the right result, counted at the worker (each task
appends a line to ``$CANVAS_LOG`` as it completes)."""

from __future__ import annotations

import signal

import pytest

import zqsync
from tests.helpers import slack, wait_for
from tests.integration.canvas_tasks import add, hold, total
from zqsync.canvas import CanvasHandle

TASKS = "tests.integration.canvas_tasks:registry"


@pytest.mark.timeout(120)
def test_a_chain_group_and_chord_killed_mid_run_each_complete_once_after_a_restart(zq_worker, tmp_path):
    state, log, gate = tmp_path / "state", tmp_path / "log", tmp_path / "gate"
    options = {"extra_args": ["--state-dir", str(state), "--concurrency", "32"], "env": {"CANVAS_LOG": str(log)}}

    def holding(value, name):
        return hold.s(*((value,) if value is not None else ()), str(tmp_path / f"started-{name}"), str(gate))

    first = zq_worker(TASKS, **options)
    with zqsync.Client(first.endpoint) as client:
        handles = [
            zqsync.chain(add.s(1, 2), holding(None, "chain"), add.s(100)).enqueue(client),
            zqsync.group(*(holding(i, f"group-{i}") for i in range(10))).enqueue(client),
            zqsync.chord(zqsync.group(*(holding(i, f"chord-{i}") for i in range(10, 20))), total.s()).enqueue(client),
        ]
    names = ["chain", *(f"group-{i}" for i in range(10)), *(f"chord-{i}" for i in range(10, 20))]
    wait_for(lambda: all((tmp_path / f"started-{name}").exists() for name in names), what="21 jobs to be running")
    first.stop(sig=signal.SIGKILL)
    gate.touch()
    second = zq_worker(TASKS, **options)
    with zqsync.Client(second.endpoint) as client:
        chain, group, chord = (CanvasHandle(client, handle.kind, handle.ids) for handle in handles)
        assert chain.result(timeout=slack(60)) == 103
        assert group.result(timeout=slack(60)) == list(range(10))
        assert chord.result(timeout=slack(60)) == sum(range(10, 20))
        assert {handle.status().state for handle in (chain, group, chord)} == {"done"}
    completed = sorted(log.read_text().splitlines())
    assert completed == sorted(["add 1 2", "hold 3", "add 3 100", *(f"hold {i}" for i in range(20)),
                                f"total {list(range(10, 20))} 0"])
