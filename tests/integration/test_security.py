"""CURVE authentication, key handling and safe defaults, against real worker processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

import zqsync
from tests.helpers import PREFORK_MODES, wait_for
from zqsync.errors import ConfigurationError, ProcessFailed
from zqsync.wire.curve import keygen, load_secret


@pytest.fixture
def keys(tmp_path):
    """A worker keypair, an allowed client, and a stranger whose key is not listed."""
    allowed = tmp_path / "allowed"
    keygen(str(tmp_path), "worker")
    keygen(str(allowed), "web")
    keygen(str(tmp_path / "others"), "stranger")
    return tmp_path


def curve_args(keys) -> list[str]:
    return ["--curve-secret-key", str(keys / "worker.key_secret"), "--allow-client-keys", str(keys / "allowed")]


def client_for(worker, keys, who: str, **kwargs) -> zqsync.Client:
    secret = keys / "allowed" / f"{who}.key_secret" if who == "web" else keys / "others" / f"{who}.key_secret"
    return zqsync.Client(worker.endpoint, curve=zqsync.Curve.from_files(str(keys / "worker.key"), str(secret)), **kwargs)


def test_keygen_writes_a_private_secret_and_never_overwrites(tmp_path):
    public, secret = keygen(str(tmp_path), "node")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert load_secret(secret)[0] == load_secret(secret)[0] and os.path.exists(public)
    with pytest.raises(ConfigurationError, match="refusing to overwrite"):
        keygen(str(tmp_path), "node")


def test_keygen_command_prints_both_paths(tmp_path):
    result = subprocess.run([sys.executable, "-m", "zqsync", "keygen", "web1", "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "web1.key_secret" in result.stdout and (tmp_path / "web1.key").exists()


@pytest.mark.parametrize("prefork", [None, *PREFORK_MODES.values()], ids=["single", *PREFORK_MODES])
def test_only_listed_curve_clients_get_anything_executed(zq_worker, keys, tmp_path, prefork):
    extra = curve_args(keys) + (["--processes", "2", *prefork] if prefork is not None else [])
    worker = zq_worker(extra_args=extra)
    trace = tmp_path / "trace.txt"
    intruders = [
        zqsync.Client(worker.endpoint, call_timeout=1.0, send_timeout=1.0),  # no CURVE at all
        client_for(worker, keys, "stranger", call_timeout=1.0, send_timeout=1.0),  # CURVE, but not listed
    ]
    for intruder in intruders:
        with intruder:
            with pytest.raises(zqsync.CallTimeout):
                intruder.call("record", str(trace), "call from an intruder")
            with pytest.raises(zqsync.Congested):
                intruder.enqueue("record", str(trace), "job from an intruder")
    with client_for(worker, keys, "web") as friend:
        assert friend.call("add", 2, 3) == 5
        friend.enqueue("record", str(trace), "friend")
    wait_for(lambda: trace.exists() and trace.read_text() == "friend\n", what="the allowed client's job")
    assert "intruder" not in trace.read_text()


def test_worker_refuses_a_secret_key_readable_by_others(zq_worker, keys):
    os.chmod(keys / "worker.key_secret", 0o644)
    with pytest.raises(ProcessFailed, match="chmod 600"):
        zq_worker(extra_args=curve_args(keys))


def test_client_refuses_a_secret_key_readable_by_others(keys):
    os.chmod(keys / "allowed" / "web.key_secret", 0o640)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        zqsync.Curve.from_files(str(keys / "worker.key"), str(keys / "allowed" / "web.key_secret"))


def test_curve_needs_both_worker_options(zq_worker, keys):
    with pytest.raises(ProcessFailed, match="go together"):
        zq_worker(extra_args=["--curve-secret-key", str(keys / "worker.key_secret")])


def test_binding_a_non_loopback_address_without_curve_warns(zq_worker):
    worker = zq_worker(bind="tcp://0.0.0.0:0")
    assert "without CURVE" in worker.output()


def test_default_bind_is_loopback():
    from zqsync import settings

    assert settings.BIND.startswith("tcp://127.0.0.1:")
