"""Canvas over a fleet (issue 26, item 1): two in-process workers share one PostgreSQL journal (a real
server, ``tests/pgserver.py``; skipped with the reason where none can be started). A chord's members
run on both and finish at the same instant; its callback runs once, on whichever worker claims it."""

from __future__ import annotations

import pytest

import zqsync
from tests.helpers import slack, wait_for
from tests.integration import canvas_tasks
from tests.integration.canvas_tasks import add, total

pytestmark = pytest.mark.timeout(60)


def test_a_chords_members_finishing_at_once_on_two_workers_call_back_once(pg_url, zq_inprocess, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("CANVAS_LOG", str(tmp_path / "log"))
    a, b = (zq_inprocess(canvas_tasks.registry, journal=pg_url, journal_lease=10.0, concurrency=5) for _ in "ab")
    gate = tmp_path / "gate"
    members = [zqsync.Signature("hold" if i % 2 else "hold_b", (i, str(tmp_path / f"started-{i}"), str(gate)))
               for i in range(10)]
    with zqsync.Client(a.endpoint, routes={"hold_b": [b.endpoint]}) as client:
        handle = zqsync.chord(zqsync.group(*members), total.s()).enqueue(client)
        wait_for(lambda: all((tmp_path / f"started-{i}").exists() for i in range(10)), what="every member to start")
        gate.touch()  # five finish on each worker at the same instant
        assert handle.result(timeout=slack(30)) == sum(range(10))
        assert zqsync.chain(add.s(1, 2), add.s(3)).enqueue(client).result(timeout=slack(30)) == 6
    lines = (tmp_path / "log").read_text().splitlines()
    assert sorted(line for line in lines if line.startswith("hold")) == sorted(f"hold {i}" for i in range(10))
    assert [line for line in lines if line.startswith("total")] == [f"total {list(range(10))} 0"]
