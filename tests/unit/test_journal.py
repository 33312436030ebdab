"""What only the SQLite journal does: owner lock files. The rules every journal keeps are checked on
each backend by tests/contract/test_journal_contract.py."""

from __future__ import annotations

import os

from zqsync.worker.journal import Journal


def owner(tmp_path) -> Journal:
    journal = Journal(str(tmp_path))
    journal.register()
    return journal


def test_lock_files_of_owners_that_are_gone_are_swept(tmp_path):
    me, gone = owner(tmp_path), owner(tmp_path)
    os.close(gone._lock_fd)  # as a SIGKILL would: the lock is released, the file stays
    gone._lock_fd = None
    assert len(os.listdir(tmp_path / "owners")) == 2
    assert me.sweep_owners() == 1
    assert os.listdir(tmp_path / "owners") == [f"{me.token}.lock"]
