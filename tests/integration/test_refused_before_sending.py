"""The client refuses what the worker would refuse, before sending; endpoints and settings that cannot work
raise ``ConfigurationError`` at ``Client()``; IPv6 literals work on both sides (issue 11, items 5 and 6)."""

from __future__ import annotations

import math
import socket
import time

import msgpack
import pytest

import zqsync
from tests.helpers import slack, wait_for
from zqsync.demo.tasks import registry as demo_registry
from zqsync.errors import ProcessFailed
from zqsync.wire import envelope

pytestmark = pytest.mark.timeout(120)

REFUSED = [
    pytest.param(({(1, 2): "v"},), {}, "map key", id="tuple-map-key"),
    pytest.param((), {1: "v"}, "str keys", id="non-str-kwargs-key"),
    pytest.param((eval("[" * 150 + "]" * 150),), {}, "MAX_DEPTH", id="150-deep"),
    pytest.param(("x" * (17 * 1024 * 1024),), {}, "16777216", id="17-MiB"),
]


@pytest.mark.parametrize(("args", "kwargs", "named"), REFUSED)
def test_a_job_the_worker_would_refuse_raises_before_sending_and_later_jobs_all_arrive(zq_worker, tmp_path,
                                                                                       args, kwargs, named):
    """Before the fix each of these returned an id and was dropped by the worker as malformed;
    after a 17 MiB one, the worker reset the connection and the jobs sent after it were lost."""
    worker = zq_worker()
    target = tmp_path / "record.txt"
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.ProtocolError, match=named):
            client.enqueue_with_options("echo", args=args, kwargs=kwargs)
        assert client.stats()["enqueued"] == 0
        for number in range(200):
            client.enqueue("record", str(target), str(number))
        wait_for(lambda: target.exists() and len(target.read_text().split()) == 200, what="the 200 jobs after it")
        stats = worker.stats()
        assert stats["malformed"] == 0 and stats["disconnections_jobs"] == 0


@pytest.mark.parametrize("value", [msgpack.ExtType(5, b"x"), {"when": [msgpack.Timestamp(1, 0)]}],
                         ids=["ext-type", "nested-timestamp"])
def test_a_msgpack_extension_is_refused_before_sending_and_the_worker_sees_no_malformed_frame(zq_inprocess, value):
    """Before the fix msgpack packed it, enqueue returned an id and the worker dropped the frame as malformed
    (it refuses every extension type), and a call got a worker's error reply instead of a ProtocolError."""
    worker = zq_inprocess(demo_registry)
    with zqsync.Client(worker.endpoint, call_timeout=slack(10.0)) as client:
        with pytest.raises(zqsync.ProtocolError, match="msgpack extension"):
            client.enqueue("echo", value)
        with pytest.raises(zqsync.ProtocolError, match="msgpack extension"):
            client.call("echo", value)
        assert client.stats()["enqueued"] == 0
        client.enqueue("echo", "after it")
        counters = worker.join(1, timeout=slack(10.0))
        assert client.call("echo", "still served") == "still served"
    assert counters["malformed"] == 0 and counters["jobs_succeeded"] == 1, counters


def test_a_17_mib_call_raises_protocol_error_naming_the_limit_at_once(zq_worker):
    worker = zq_worker()
    with zqsync.Client(worker.endpoint, call_timeout=10.0) as client:
        started = time.monotonic()
        with pytest.raises(zqsync.ProtocolError, match=r"17825\d+ bytes, over the limit of 16777216"):
            client.call("echo", "x" * (17 * 1024 * 1024))
        assert time.monotonic() - started < slack(2.0)  # not the 10 s deadline


@pytest.mark.parametrize("job_id", ["x" * 65, 12345, ""])
def test_a_bad_job_id_is_refused(job_id):
    with zqsync.Client("tcp://127.0.0.1:9") as client:
        with pytest.raises(zqsync.ProtocolError, match="'id'"):
            client.enqueue_with_options("echo", job_id=job_id)


def test_the_worker_applies_the_same_checks_on_decode():
    with pytest.raises(zqsync.ProtocolError, match="MAX_DEPTH"):
        envelope.decode_request(envelope._pack({"v": 1, "id": "a", "kind": "job", "task": "t",
                                                "args": eval("[" * 150 + "]" * 150), "kwargs": {}}))


@pytest.mark.parametrize("endpoint", ["tcp://*:5555", "tcp://bücher.example:5555", "tcp://1.2.3.999:5555",
                                      "tcp://[zz::x]:5555", "tcp://a..b:5555", "udp://h:5555"])
def test_endpoints_that_cannot_work_raise_configuration_error_at_client_naming_them(endpoint):
    with pytest.raises(zqsync.ConfigurationError, match="endpoint"):
        zqsync.Client(endpoint)


@pytest.mark.parametrize("endpoints", [["tcp://h:5555", "tcp://h:5555"], ["tcp://h:5555", "tcp://H:5556"]])
def test_duplicate_or_overlapping_endpoints_are_refused(endpoints):
    with pytest.raises(zqsync.ConfigurationError, match="tcp://"):
        zqsync.Client(endpoints)


@pytest.mark.parametrize("setting", [{"confirm_retry": 0}, {"confirm_retry": 0.0001}, {"call_timeout": 0},
                                     {"confirm_timeout": 0}, {"linger": math.inf}, {"send_timeout": math.nan}])
def test_settings_that_cannot_work_are_refused(setting):
    with pytest.raises(zqsync.ConfigurationError, match=next(iter(setting))):
        zqsync.Client("tcp://127.0.0.1:9", **setting)


@pytest.mark.parametrize("timeout", [-1, math.nan, math.inf])
def test_a_per_call_timeout_that_cannot_work_is_refused(timeout):
    with zqsync.Client("tcp://127.0.0.1:9") as client:
        with pytest.raises(zqsync.ConfigurationError, match="timeout"):
            client.call_with_options("echo", timeout=timeout)


def test_call_timeout_and_congested_name_the_endpoint_and_likely_causes():
    with zqsync.Client("tcp://127.0.0.1:9", send_timeout=0.2) as client:
        with pytest.raises(zqsync.CallTimeout, match=r"tcp://127\.0\.0\.1:9.*CURVE.*does not resolve"):
            client.call_with_options("echo", timeout=0.2)
        with pytest.raises(zqsync.Congested, match=r"tcp://127\.0\.0\.1:9.*does not resolve"):
            client.enqueue("echo")


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
def test_a_worker_bound_to_an_ipv6_literal_serves_a_client_calling_it(zq_worker, tmp_path):
    try:
        worker = zq_worker(bind="tcp://[::1]:0")
    except ProcessFailed as exc:  # before the fix: "ZMQError: No such device"
        pytest.fail(f"the worker could not bind [::1]: {exc}")
    assert worker.endpoint.startswith("tcp://[::1]:")
    target = tmp_path / "record.txt"
    with zqsync.Client(worker.endpoint, call_timeout=10.0) as client:
        assert client.call("echo", "over IPv6") == "over IPv6"
        client.enqueue("record", str(target), "job-over-ipv6")
        wait_for(lambda: target.exists() and "job-over-ipv6" in target.read_text(), what="the job over IPv6")


def test_a_host_name_works(zq_worker):
    worker = zq_worker()
    port = worker.endpoint.rsplit(":", 1)[1]
    with zqsync.Client(f"tcp://localhost:{port}", call_timeout=10.0) as client:
        assert client.call("echo", "by name") == "by name"
