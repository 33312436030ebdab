"""Settings are read at construction with clear errors; the registry refuses bad tasks."""

from __future__ import annotations

import pytest

import zqsync
from zqsync.errors import ConfigurationError
from zqsync.settings import ClientSettings, WorkerSettings
from zqsync.wire.endpoints import split_endpoint
from zqsync.worker import Registry


def test_environment_is_read_at_construction_not_import(monkeypatch):
    monkeypatch.setenv("ZQSYNC_POOL_SIZE", "7")
    monkeypatch.setenv("ZQSYNC_CALL_TIMEOUT", "2.5")
    settings = ClientSettings.from_env()
    assert (settings.pool_size, settings.call_timeout) == (7, 2.5)


def test_explicit_arguments_beat_the_environment(monkeypatch):
    monkeypatch.setenv("ZQSYNC_POOL_SIZE", "7")
    assert ClientSettings.from_env(pool_size=2).pool_size == 2


@pytest.mark.parametrize("var, value", [("ZQSYNC_POOL_SIZE", "0"), ("ZQSYNC_POOL_SIZE", "four"),
                                        ("ZQSYNC_CALL_TIMEOUT", "-1"), ("ZQSYNC_CONGESTION", "maybe")])
def test_bad_environment_values_raise_an_error_naming_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigurationError, match=var):
        ClientSettings.from_env()


def test_endpoint_maps_to_jobs_port_and_rpc_port_plus_one():
    assert split_endpoint("tcp://127.0.0.1:5555") == ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556")


@pytest.mark.parametrize("endpoint", ["127.0.0.1:5555", "ipc:///tmp/x", "tcp://host:65535", "tcp://host:0", ""])
def test_malformed_endpoints_are_refused_with_the_expected_shape(endpoint):
    with pytest.raises(ConfigurationError, match="tcp://HOST:PORT"):
        zqsync.Client(endpoint)


def test_default_client_without_endpoint_says_what_to_set(monkeypatch):
    monkeypatch.delenv("ZQSYNC_ENDPOINT", raising=False)
    monkeypatch.setattr(zqsync.client.client, "_default", None)
    with pytest.raises(ConfigurationError, match="ZQSYNC_ENDPOINT"):
        zqsync.call("add", 1, 2)


def test_default_client_uses_zqsync_endpoint(monkeypatch, zq_worker):
    worker = zq_worker()
    monkeypatch.setenv("ZQSYNC_ENDPOINT", worker.endpoint)
    monkeypatch.setattr(zqsync.client.client, "_default", None)
    try:
        assert zqsync.call("add", 20, 22) == 42
        assert len(zqsync.enqueue("add", 1, 1)) == 32
    finally:
        zqsync.default_client().close()
        zqsync.client.client._default = None


def test_registry_registers_bare_and_named_tasks():
    registry = Registry()

    @registry.task
    def add(a, b):
        return a + b

    @registry.task(name="resize", time_limit=30.0)
    def resize(image_id, size="small"):
        return image_id

    assert registry.names() == ["add", "resize"]
    assert registry.get("resize").time_limit == 30.0
    assert add(1, 2) == 3, "the decorator returns the function unchanged"


@pytest.mark.parametrize("kwargs, fault", [({"name": "zqsync.stats"}, "reserved"), ({"time_limit": 0}, "time_limit"),
                                           ({"name": "x" * 300}, "characters")])
def test_registry_refuses_bad_task_definitions(kwargs, fault):
    with pytest.raises(ConfigurationError, match=fault):
        Registry().task(**kwargs)(lambda: None)


def test_registry_refuses_duplicate_names():
    registry = Registry()
    registry.task(name="t")(lambda: None)
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.task(name="t")(lambda: None)


def test_worker_keepalive_is_whole_seconds_within_what_tcp_takes():
    assert WorkerSettings().keepalive == (60.0, 10.0)
    assert WorkerSettings(keepalive_idle=2.5, keepalive_interval=1).keepalive == (3.0, 1.0)  # rounded up
    for field, value in (("keepalive_idle", 0), ("keepalive_interval", 0.5), ("keepalive_idle", 40000),
                         ("keepalive_interval", "never")):
        with pytest.raises(ConfigurationError, match=f"{field} must be from 1 to 32767 seconds"):
            WorkerSettings(**{field: value})
