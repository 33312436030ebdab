"""A Client pickles as its configuration: a ``spawn`` child gets a fresh client whose calls reach the worker."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

import zqsync
from tests.helpers import slack
from tests.integration.test_security import curve_args, keys  # noqa: F401  (fixture)


def call_from_child(client: zqsync.Client, conn) -> None:
    with client:
        conn.send((os.getpid(), client.call("add", 2, 3), client.stats()))


def run_in_spawn_child(client: zqsync.Client) -> tuple[int, int, dict]:
    """Pass ``client`` to a ``spawn`` child (pickled by multiprocessing) and return what its call saw."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=call_from_child, args=(client, child))
    process.start()
    try:
        assert parent.poll(slack(60.0)), "the spawn child answered"
        return parent.recv()
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def test_spawn_child_rebuilds_the_client_and_reaches_the_worker(zq_worker):
    worker = zq_worker()
    with zqsync.Client(worker.endpoint, call_timeout=30.0, pool_size=3) as client:
        assert client.call("add", 1, 1) == 2  # the parent's sockets and counters stay here
        child_pid, result, child_stats = run_in_spawn_child(client)
    assert result == 5 and child_pid != os.getpid()
    assert child_stats["calls"] == 1, "a fresh client: no counters carried over"
    assert str(child_pid) in worker.stats()["identities_by_pid"], "the worker saw the child's own socket"


def test_curve_client_pickles_its_key_paths_not_its_secret(zq_worker, keys):  # noqa: F811
    worker = zq_worker(extra_args=curve_args(keys))
    secret_file = keys / "allowed" / "web.key_secret"
    curve = zqsync.Curve.from_files(str(keys / "worker.key"), str(secret_file))
    client = zqsync.Client(worker.endpoint, curve=curve, call_timeout=30.0)
    data = pickle.dumps(client)
    assert curve.secret not in data and str(secret_file).encode() in data
    child_pid, result, _ = run_in_spawn_child(client)
    assert result == 5
    with client:  # the probe of worker.stats() has no CURVE keys
        assert str(child_pid) in client.call("zqsync.stats")["identities_by_pid"]


def test_a_curve_of_raw_keys_pickles_its_keys():
    curve = zqsync.Curve(b"s" * 40, b"p" * 40, b"k" * 40)
    assert pickle.loads(pickle.dumps(curve)) == curve


def test_a_moved_key_file_fails_clearly_when_unpickled(tmp_path, keys):  # noqa: F811
    curve = zqsync.Curve.from_files(str(keys / "worker.key"), str(keys / "allowed" / "web.key_secret"))
    data = pickle.dumps(curve)
    os.rename(keys / "allowed" / "web.key_secret", tmp_path / "moved")
    with pytest.raises(zqsync.ConfigurationError, match="web.key_secret"):
        pickle.loads(data)
