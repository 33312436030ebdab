"""Every zqsync error pickles with its fields, and the worker's error names map to client classes."""

from __future__ import annotations

import inspect
import pickle

import pytest

from zqsync import errors

#: One instance of every error class, built with the arguments its raisers pass.
SAMPLES = [
    errors.ZqsyncError("root"),
    errors.ClientClosed("this Client of ['tcp://127.0.0.1:5555'] is closed"),
    errors.ProcessFailed("worker did not start"),
    errors.ForkFailed("forked child 12 hung"),
    errors.ConfigurationError("pool_size must be at least 1, got 0", setting="pool_size"),
    errors.ProtocolError("frame too large"),
    errors.PoolError("no pooled socket came free"),
    errors.CallTimeout("add", 2.5),
    errors.Congested(("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5557"), 0.5),
    errors.Unconfirmed("ab" * 16, 10.0, "no reply"),
    errors.RemoteError("ValueError", "bad", "Traceback ..."),
    errors.UnknownTask("UnknownTask", "no task named 'x'", ""),
    errors.NoJournal("NoJournal", "start it with --state-dir", ""),
    errors.TimeLimitExceeded("TimeLimitExceeded", "over 0.5 s", ""),
    errors.SoftTimeLimitExceeded("SoftTimeLimitExceeded", "past its soft time limit of 0.2 s", ""),
    errors.WorkerShutdown("WorkerShutdown", "stopped", ""),
    errors.WorkerStopping("WorkerStopping", "stopping: not run", ""),
    errors.RequestRejected("ProtocolError", "malformed request", ""),
    errors.JournalUnavailable("JournalUnavailable", "disk full", "", job_id="ab" * 16),
    errors.DuplicateJob("DuplicateJob", "dead-lettered", "", job_id="cd" * 16),
    errors.JobCancelled("JobCancelled", "cancelled while it ran", "", job_id="ef" * 16),
    errors.JobExpired("JobExpired", "expired before it started", "", job_id="fe" * 16),
    errors.DeadlineExpired("DeadlineExpired", "not run: its deadline had passed 0.500 s before", ""),
    errors.JobNotFound("ab" * 16, ["tcp://127.0.0.1:5555"]),
    errors.EnqueuedInTransaction("job 'add' enqueued inside a transaction.atomic() block"),
]


def every_error_class() -> set[type]:
    return {obj for _, obj in inspect.getmembers(errors, inspect.isclass)
            if issubclass(obj, errors.ZqsyncError)}


def test_the_samples_cover_every_error_class():
    assert {type(sample) for sample in SAMPLES} == every_error_class()


@pytest.mark.parametrize("error", SAMPLES, ids=lambda error: type(error).__name__)
def test_error_survives_pickle_with_its_fields(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)
    assert vars(error) or type(error) in (errors.ZqsyncError, errors.ClientClosed, errors.ProcessFailed,
                                          errors.ForkFailed, errors.ProtocolError, errors.PoolError,
                                          errors.EnqueuedInTransaction)


def test_call_timeout_keeps_task_and_timeout_across_pickle():
    copy = pickle.loads(pickle.dumps(errors.CallTimeout("add", 2.5)))
    assert (copy.task, copy.timeout) == ("add", 2.5)
    assert isinstance(copy, TimeoutError)


@pytest.mark.parametrize("name, cls", [
    ("UnknownTask", errors.UnknownTask), ("NoJournal", errors.NoJournal),
    ("TimeLimitExceeded", errors.TimeLimitExceeded), ("WorkerShutdown", errors.WorkerShutdown),
    ("WorkerStopping", errors.WorkerStopping),
    ("ProtocolError", errors.RequestRejected), ("ValueError", errors.RemoteError),
    ("JournalUnavailable", errors.JournalUnavailable), ("DuplicateJob", errors.DuplicateJob),
    ("JobCancelled", errors.JobCancelled), ("JobExpired", errors.JobExpired),
    ("SoftTimeLimitExceeded", errors.SoftTimeLimitExceeded),
    ("DeadlineExpired", errors.DeadlineExpired),
])
def test_a_worker_error_name_maps_to_its_client_class(name, cls):
    error = errors.remote_error(name, "message", "tb", request_id="job-1")
    assert type(error) is cls
    assert getattr(error, "job_id", "job-1") == "job-1"
    assert (error.remote_type, error.remote_message, error.remote_traceback) == (name, "message", "tb")
