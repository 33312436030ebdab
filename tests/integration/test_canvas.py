"""Canvas semantics (issue 26, item 1) on the in-process worker core with a SQLite journal: chains pass
each result on, groups gather, chords call back once; a failed step stops its chain, a failed member
stops or is passed to its chord's callback, a cancel stops what has not finished. Kills and restarts
are in ``test_canvas_kill.py`` (a real worker process); two workers on PostgreSQL in ``test_canvas_pg.py``."""

from __future__ import annotations

import os
import runpy

import pytest

import zqsync
from tests.helpers import slack, wait_for
from tests.integration import canvas_tasks
from tests.integration.canvas_tasks import add, boom, hold, show, total

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(zq_inprocess, tmp_path, monkeypatch):
    """A client of an in-process worker on a SQLite journal; completions go to ``tmp_path/log``."""
    monkeypatch.setenv("CANVAS_LOG", str(tmp_path / "log"))
    worker = zq_inprocess(canvas_tasks.registry, state_dir=str(tmp_path / "state"), concurrency=10)
    with zqsync.Client(worker.endpoint) as client:
        yield client


def completed(tmp_path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_a_chain_passes_each_result_as_the_first_argument_of_the_next(client, tmp_path):
    handle = zqsync.chain(add.s(1, 2), add.s(10), add.s(100)).enqueue(client)
    assert handle.result(timeout=slack(20)) == 113
    status = handle.status()
    assert status.state == "done"
    assert [job.result for job in status.jobs] == [3, 13, 113]
    assert completed(tmp_path) == ["add 1 2", "add 3 10", "add 13 100"]


def test_a_group_gathers_its_results_in_order(client, tmp_path):
    handle = zqsync.group(*(add.s(i, i) for i in range(10))).enqueue(client)
    assert handle.result(timeout=slack(20)) == [2 * i for i in range(10)]
    assert handle.status().state == "done"


def test_a_chord_runs_its_callback_once_with_every_members_result(client, tmp_path):
    gate = tmp_path / "gate"
    members = zqsync.group(*(hold.s(i, str(tmp_path / f"started-{i}"), str(gate)) for i in range(10)))
    handle = zqsync.chord(members, total.s(bonus=5)).enqueue(client)
    wait_for(lambda: all((tmp_path / f"started-{i}").exists() for i in range(10)), what="every member to start")
    gate.touch()  # all ten finish at the same instant, in one worker's ten slots
    assert handle.result(timeout=slack(20)) == sum(range(10)) + 5
    assert [line for line in completed(tmp_path) if line.startswith("total")] == [f"total {list(range(10))} 5"]


def test_a_failed_step_stops_the_chain_and_result_raises_its_error(client, tmp_path):
    handle = zqsync.chain(add.s(1, 1), boom.s(), add.s(1)).enqueue(client)
    with pytest.raises(zqsync.RemoteError, match="boom 2") as raised:
        handle.result(timeout=slack(20))
    assert raised.value.remote_type == "ValueError"
    status = handle.status()
    assert status.state == "failed"
    assert [job.state for job in status.jobs] == ["done", "failed", "unknown"]


def test_a_chord_with_a_failed_member_does_not_run_its_callback_by_default(client, tmp_path):
    handle = zqsync.chord(zqsync.group(add.s(1, 1), boom.s(7)), total.s()).enqueue(client)
    with pytest.raises(zqsync.RemoteError, match="boom 7"):
        handle.result(timeout=slack(20))
    assert handle.status().state == "failed"
    assert handle.status().jobs[-1].state == "unknown"
    assert not [line for line in completed(tmp_path) if line.startswith("total")]


def test_a_chord_with_errors_pass_gives_its_callback_the_errors(client):
    handle = zqsync.chord(zqsync.group(add.s(1, 1), boom.s(7)), show.s(), errors="pass").enqueue(client)
    assert handle.result(timeout=slack(20)) == [2, {"error": {"type": "ValueError", "message": "boom 7"}}]
    assert handle.status().state == "done"


def test_cancel_interrupts_a_running_step_and_no_later_step_is_journaled(client, tmp_path):
    started = tmp_path / "started"
    handle = zqsync.chain(hold.s(1, str(started), str(tmp_path / "never")), add.s(1)).enqueue(client)
    wait_for(started.exists, what="the first step to start")
    assert handle.cancel().state == "cancelled"
    with pytest.raises(zqsync.JobCancelled):
        handle.result(timeout=slack(10))
    assert [job.state for job in handle.status().jobs] == ["cancelled", "unknown"]


def test_a_task_handle_makes_signatures_and_a_bad_canvas_is_refused_before_sending():
    assert add.s(1, b=2) == zqsync.Signature("add", (1,), {"b": 2})
    with pytest.raises(zqsync.ConfigurationError):
        zqsync.chain()
    with pytest.raises(zqsync.ConfigurationError):
        zqsync.chord(zqsync.group(add.s(1, 1)), total.s(), errors="ignore")


def test_the_docs_canvas_example_runs_and_prints_what_the_guide_says(zq_inprocess, root, tmp_path, capsys):
    example = runpy.run_path(os.path.join(root, "examples", "canvas.py"))
    worker = zq_inprocess(example["registry"], state_dir=str(tmp_path / "state"))
    assert example["main"](worker.endpoint) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["chain: 5", "group: [['page', '1'], ['page', '2'], ['page', '3']]", "chord: 12 words in all",
                       "stopped: failed ValueError cannot parse 'page 1 word '"]
    with open(os.path.join(root, "docs", "guides", "canvas.md")) as page:
        guide = page.read()
    assert '--8<-- "examples/canvas.py"' in guide and all(line in guide for line in printed)


def test_a_worker_refuses_a_confirmed_job_whose_canvas_option_is_malformed(client):
    from zqsync.client.client import job_request

    frame, job_id, _, _ = job_request("add", (1, 2), {}, confirm=True, job_id=None, delay=None, eta=None,
                                      store_result=False, deadline=None, send_timeout=None,
                                      canvas={"rest": [["next-id", "add"]]})
    with pytest.raises(zqsync.RemoteError, match="not \\[id, task, args, kwargs\\]") as raised:
        client.send_confirmed(frame, job_id, "add")
    assert raised.value.remote_type == "ProtocolError"
    assert client.job(job_id).state == "unknown"  # never journaled
