"""The journal is chosen by URL: ``sqlite:///PATH`` is ``--state-dir PATH``; anything malformed is refused by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

import zqsync
from tests.helpers import wait_for
from zqsync.demo.tasks import registry as demo_registry
from zqsync.errors import ConfigurationError
from zqsync.settings import WorkerSettings
from zqsync.worker.journal import SqliteJournal
from zqsync.worker.journal_api import open_journal


def test_a_sqlite_url_is_the_state_dir_and_the_state_dir_is_a_sqlite_url(tmp_path):
    assert WorkerSettings(journal=f"sqlite:///{tmp_path}").journal_url == f"sqlite:///{tmp_path}"
    assert WorkerSettings(state_dir=str(tmp_path)).journal_url == f"sqlite:///{tmp_path}"
    assert WorkerSettings(state_dir=str(tmp_path), journal=f"sqlite:///{tmp_path}").journal_url == f"sqlite:///{tmp_path}"
    assert WorkerSettings().journal_url is None
    journal = open_journal(f"sqlite:///{tmp_path / 'state'}")
    try:
        assert isinstance(journal, SqliteJournal) and journal.path == str(tmp_path / "state" / "journal.sqlite3")
    finally:
        journal.close()


def test_a_postgresql_url_is_accepted_as_given():
    url = "postgresql://zq@db.internal:5432/jobs?sslmode=require"
    assert WorkerSettings(journal=url).journal_url == url


@pytest.mark.parametrize("url, shape", [
    ("/var/lib/zqsync", "sqlite:///PATH or postgresql://"),
    ("sqlite://", "sqlite:///PATH (the state directory)"),
    ("sqlite:///", "sqlite:///PATH (the state directory)"),
    ("postgresql://", "postgresql://USER@HOST:PORT/DB"),
    ("postgresql://zq@host:5432", "postgresql://USER@HOST:PORT/DB"),
    ("postgresql://zq@host:port/db", "is not a number"),
    ("mysql://zq@host/db", "sqlite:///PATH or postgresql://"),
])
def test_a_malformed_journal_url_is_refused_naming_the_shape(url, shape):
    with pytest.raises(ConfigurationError) as refused:
        WorkerSettings(journal=url)
    assert shape in str(refused.value) and refused.value.setting == "journal"


def test_the_journal_is_given_once(tmp_path):
    with pytest.raises(ConfigurationError, match="give the journal once"):
        WorkerSettings(state_dir=str(tmp_path), journal="postgresql://zq@127.0.0.1:5432/jobs")
    with pytest.raises(ConfigurationError, match="give the journal once"):
        WorkerSettings(state_dir=str(tmp_path), journal=f"sqlite:///{tmp_path}/other")


def test_the_worker_command_names_the_flag_of_a_bad_journal_url():
    done = subprocess.run([sys.executable, "-m", "zqsync", "worker", "--journal", "redis://x", "zqsync.demo.tasks"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "zqsync worker: --journal: a journal is sqlite:///PATH or postgresql://USER@HOST:PORT/DB" in done.stderr


def test_a_worker_given_a_sqlite_url_journals_confirmed_jobs_in_that_directory(zq_inprocess, tmp_path):
    worker = zq_inprocess(demo_registry, journal=f"sqlite:///{tmp_path / 'state'}")
    with zqsync.Client(worker.endpoint) as client:
        job_id = client.enqueue_with_options("add", args=(1, 2), confirm=True)
        assert client.result(job_id, timeout=10) == 3
    journal = SqliteJournal(str(tmp_path / "state"))
    try:  # the outcome is committed a moment after the result is known
        wait_for(lambda: journal.rows(("done",)), what="the job's row done")
        assert [(row.id, row.state) for row in journal.rows(("pending", "done", "dead"))] == [(job_id, "done")]
    finally:
        journal.close()
