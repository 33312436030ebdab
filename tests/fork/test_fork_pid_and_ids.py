"""The pid and the random ids of ``zqsync/client/process.py`` after a fork (pool rule 9).

Both are cached without a system call per use: the pid, and ids drawn 64 at a time. A forked child,
including one that zqsync's at-fork hook never saw (as after a fork made by C code), must see its own
pid at once, and must never hand out an id its parent hands out too: a job id shared by two processes
is one job to a worker (duplicates are dropped) and one job's result to ``result()``.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.fork.test_fork_scenarios import run_in_unhooked_fork
from zqsync.client import process

pytestmark = pytest.mark.timeout(60)

#: Ids each side draws after the fork: fewer than one draw holds, so both would come from the same buffer.
DRAWN = 8


def _child_view() -> dict:
    return {"pid": os.getpid(), "cached_pid": process.getpid(), "ids": [process.new_id() for _ in range(DRAWN)]}


def test_new_ids_are_32_hex_characters_and_distinct():
    ids = [process.new_id() for _ in range(5 * process.IDS_PER_DRAW)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", job_id) for job_id in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_WIPEONFORK is Linux's")
def test_on_linux_the_pid_and_ids_come_from_a_page_the_kernel_wipes_in_a_child():
    assert process.wiped_on_fork() is not None
    assert process.getpid is not os.getpid  # the cached pid is in use, so the fork tests below test it


def test_a_child_the_fork_hook_missed_sees_its_own_pid_and_draws_ids_its_parent_never_hands_out():
    assert process.getpid() == os.getpid()
    process.new_id()  # the buffer now holds ids the child inherits with the page
    child = run_in_unhooked_fork(_child_view)
    parent = [process.new_id() for _ in range(DRAWN)]
    assert child["cached_pid"] == child["pid"] != os.getpid()
    assert process.getpid() == os.getpid()
    assert not set(child["ids"]) & set(parent), "the child handed out ids its parent hands out too"
