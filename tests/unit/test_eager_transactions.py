"""Eager mode and open Django transactions (``zqsync.eager``): a job enqueued inside ``transaction.atomic()``
warns (or raises, by option), one enqueued from ``on_commit`` or inside ``TestCase``'s own atomic does not.

Django's settings are process-wide and configured once, so the checks run in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("django", reason="Django is not installed (the test extra has it)")

SCRIPT = r'''
import json, warnings
import django
from django.conf import settings
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}})
django.setup()
from django.db import connection, transaction
import zqsync
from zqsync.eager import eager
from zqsync.demo.tasks import registry

def lines(mode, body):
    with zqsync.Client("tcp://127.0.0.1:9") as client, eager(registry, in_transaction=mode) as recorder:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                body(client)
                error = None
            except zqsync.EnqueuedInTransaction as exc:
                error = str(exc)
        return {"warnings": [(str(w.message), w.filename.endswith("<string>")) for w in seen],
                "error": error, "ran": len(recorder.jobs)}

def inside(client):
    client.enqueue("add", 1, 2)  # outside: fine
    with transaction.atomic():
        client.enqueue_with_options("add", args=(3, 4), confirm=True)
        transaction.on_commit(lambda: client.enqueue("add", 5, 6))

def testcase_atomic(client):
    block = transaction.atomic()
    block._from_testcase = True  # what django.test.TestCase does for the atomic around each test
    with block:
        client.enqueue("add", 1, 2)

print(json.dumps({"warn": lines("warn", inside), "error": lines("error", inside),
                  "ignore": lines("ignore", inside), "testcase": lines("warn", testcase_atomic)}))
'''


def test_a_job_enqueued_inside_an_open_transaction_warns_or_raises_and_on_commit_does_not():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    warned = outcome["warn"]["warnings"]
    assert len(warned) == 1 and "enqueued inside a transaction.atomic() block" in warned[0][0], warned
    assert warned[0][1], "the warning names the line that enqueued, not zqsync's own code"
    assert "transaction.on_commit" in warned[0][0]
    assert outcome["warn"]["ran"] == 3  # the warning changes nothing else: the on_commit job ran after the commit
    assert outcome["error"]["error"] and outcome["error"]["ran"] == 1  # raised at the enqueue in the block
    assert outcome["ignore"] == {"warnings": [], "error": None, "ran": 3}
    assert outcome["testcase"] == {"warnings": [], "error": None, "ran": 1}
