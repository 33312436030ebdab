"""The worker runtime: results and errors (on the in-process worker core, ``zq_inprocess``), limits
and shutdown (against real worker processes: the watchdog, signals, a parent that dies)."""

from __future__ import annotations

import signal
import threading

import gevent
import pytest
import zmq

import zqsync
from tests.helpers import wait_for
from zqsync.demo.tasks import registry as demo_registry
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint
from zqsync.worker import Registry


@pytest.fixture
def demo(zq_inprocess):
    return zq_inprocess(demo_registry)


def test_remote_error_carries_type_message_and_traceback(demo):
    worker = demo
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.RemoteError) as caught:
            client.call("fail", "disk full")
    assert caught.value.remote_type == "RuntimeError"
    assert caught.value.remote_message == "disk full"
    assert "raise RuntimeError(message)" in caught.value.remote_traceback
    assert "Remote traceback" in str(caught.value)


def test_failing_task_leaves_the_worker_serving(demo):
    worker = demo
    with zqsync.Client(worker.endpoint) as client:
        for _ in range(3):
            with pytest.raises(zqsync.RemoteError):
                client.call("fail", "again")
        assert client.call("add", 1, 1) == 2


def test_unknown_task_call_gets_a_clear_error_naming_the_known_tasks(demo):
    worker = demo
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.UnknownTask) as caught:
            client.call("no_such_task")
    assert "no_such_task" in caught.value.remote_message
    assert "add" in caught.value.remote_message


def test_unknown_task_job_is_counted_and_logged(demo, caplog):
    with zqsync.Client(demo.endpoint) as client:
        client.enqueue("no_such_task", 1)
    demo.wait(lambda counters: counters["unknown_task"] == 1)
    assert "unknown task 'no_such_task'" in caplog.text


limited = Registry()


@limited.task(time_limit=0.2)
def slow() -> None:
    gevent.sleep(30)  # what time.sleep is in a monkey-patched worker


def test_time_limit_interrupts_a_long_task(zq_inprocess):
    worker = zq_inprocess(limited)
    with zqsync.Client(worker.endpoint, call_timeout=20.0) as client:
        with pytest.raises(zqsync.RemoteError) as caught:
            client.call("slow")
        assert client.call("zqsync.stats")["timed_out"] == 1
    assert caught.value.remote_type == "TimeLimitExceeded"
    assert "0.2" in caught.value.remote_message


def test_malformed_call_gets_an_error_reply_and_worker_keeps_serving(demo):
    worker = demo
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        sock.connect(split_endpoint(worker.endpoint)[1])
        sock.send(b"\xc1 definitely not msgpack")
        assert sock.poll(20_000), "no reply to a malformed request"
        reply = envelope.decode_reply(sock.recv())
        assert not reply.ok and reply.error["type"] == "ProtocolError"
    finally:
        sock.close(linger=0)
        context.term()
    with zqsync.Client(worker.endpoint) as client:
        assert client.call("add", 2, 2) == 4


def test_sigterm_lets_an_in_flight_task_finish_then_exits_zero(zq_worker):
    worker = zq_worker()
    client = zqsync.Client(worker.endpoint, call_timeout=30.0)
    outcome: dict = {}

    def slow_call() -> None:
        outcome["value"] = client.call("sleep", 1.0)

    caller = threading.Thread(target=slow_call)
    caller.start()
    wait_for(lambda: worker.stats()["in_flight"] >= 1, what="the sleep task to be running")
    worker.proc.send_signal(signal.SIGTERM)
    caller.join(30)
    client.close()
    assert outcome.get("value") == 1.0
    assert worker.proc.wait(30) == 0
    assert "warm shutdown" in worker.output()


def test_second_sigterm_is_a_cold_shutdown_and_the_caller_is_told(zq_worker):
    worker = zq_worker()
    client = zqsync.Client(worker.endpoint, call_timeout=30.0)
    outcome: dict = {}

    def slow_call() -> None:
        try:
            client.call("sleep", 25.0)
        except zqsync.RemoteError as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=slow_call)
    caller.start()
    wait_for(lambda: worker.stats()["in_flight"] >= 1, what="the sleep task to be running")
    worker.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "warm shutdown" in worker.output(), what="the warm shutdown to begin")
    worker.proc.send_signal(signal.SIGTERM)
    caller.join(30)
    client.close()
    assert worker.proc.wait(30) == 1  # it killed a task: non-zero, so a service manager restarts it
    assert outcome["error"].remote_type == "WorkerShutdown"


def test_worker_started_for_a_parent_exits_when_that_parent_dies(tmp_path):
    """A harness killed mid-test (say by a CI timeout) must not leave workers behind."""
    import os
    import subprocess
    import sys

    ready = tmp_path / "ready"
    pid_file = tmp_path / "pid"
    launcher = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'zqsync', 'worker', 'zqsync.demo.tasks:registry', '--bind',"
        f" 'tcp://127.0.0.1:0', '--ready-file', {str(ready)!r}, '--parent-pid', str(__import__('os').getpid())])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher], cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        wait_for(lambda: ready.exists(), what="the worker to listen")
        worker_pid = int(pid_file.read_text())
        parent.kill()
        parent.wait(10)

        def worker_gone() -> bool:
            try:
                os.kill(worker_pid, 0)
                return False
            except ProcessLookupError:
                return True

        wait_for(worker_gone, timeout=30, what="the orphaned worker to exit")
    finally:
        parent.kill()
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_workers_own_tasks_answer_bad_arguments_with_an_error_not_silence(zq_worker):
    """Regression (found by fuzzing): zqsync.ping with an argument killed the answering greenlet."""
    worker = zq_worker()
    with zqsync.Client(worker.endpoint, call_timeout=10.0) as client:
        with pytest.raises(zqsync.RemoteError) as caught:
            client.call("zqsync.ping", "unexpected")
        assert caught.value.remote_type == "TypeError"
        assert client.call("zqsync.ping") == "pong"
