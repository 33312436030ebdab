"""``zqsync.testing.run_in_fork``: what a child that hangs tells the parent."""

from __future__ import annotations

import time

import pytest

from zqsync.testing import ForkFailed, run_in_fork

pytestmark = pytest.mark.timeout(60)


def _sleeps_past_the_timeout() -> None:
    time.sleep(30)


def test_a_hung_child_is_killed_and_reported_with_where_it_hung():
    with pytest.raises(ForkFailed) as failure:
        run_in_fork(_sleeps_past_the_timeout, timeout=2.0)
    message = str(failure.value)
    assert "hung for more than 2.0 s and was killed" in message
    assert "_sleeps_past_the_timeout" in message, message


def test_a_childs_result_and_its_exception_reach_the_parent():
    assert run_in_fork(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError) as failure:
        run_in_fork(divmod, 1, 0)
    assert "Traceback in the forked child" in "".join(failure.value.__notes__)


SLOW_PARENT_SCRIPT = r"""
from gevent import monkey
monkey.patch_all()
import gevent.os, sys, time
import zqsync.testing

raw_fork, pause = gevent.os._raw_fork, monkey.get_original("time", "sleep")

def fork_then_stall():  # the parent is descheduled right after fork (a loaded machine): the child exits first
    pid = raw_fork()
    if pid:
        pause(0.5)
    return pid

gevent.os._raw_fork = fork_then_stall
print(zqsync.testing.run_in_fork(int, "42", timeout=float(sys.argv[1])), flush=True)
"""


def test_under_gevent_a_child_that_exits_before_the_parent_watches_it_is_still_collected():
    """gevent installs its SIGCHLD handler with the first child watcher, after the fork: the first child's
    exit, if it comes first, is a signal nobody catches, and a parent waiting through gevent's ``waitpid``
    waits forever."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.helpers import slack

    process = subprocess.Popen([sys.executable, "-c", SLOW_PARENT_SCRIPT, "5"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=slack(20))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and out.split() == ["42"], f"exit {process.returncode}: {err[-2000:]}"
