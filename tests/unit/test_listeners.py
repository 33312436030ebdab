"""Direct prefork's listening sockets (``worker/listeners.py``) and the client's opt-in expansion of announced slots."""

from __future__ import annotations

import socket

import pytest

import zqsync
from zqsync.errors import ConfigurationError
from zqsync.worker import Registry
from zqsync.worker.listeners import Listeners


def test_a_taken_port_of_the_run_is_a_one_line_error_naming_it():
    free = Listeners("tcp://127.0.0.1:0", 2)
    base = free.port
    free.close()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", base + 3))
        taken.listen(1)
        with pytest.raises(ConfigurationError) as caught:
            Listeners(f"tcp://127.0.0.1:{base}", 2)
    message = str(caught.value)
    assert f"cannot bind tcp://127.0.0.1:{base + 3}" in message and f"ports {base}..{base + 5}" in message
    assert "\n" not in message
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):  # what it had opened, it closed
        probe.connect(("127.0.0.1", base))


def test_port_zero_finds_a_free_run_that_clients_can_reach():
    listeners = Listeners("tcp://127.0.0.1:0", 2)
    try:
        assert listeners.slots == (listeners.port + 2, listeners.port + 4)
        for port in range(listeners.port, listeners.port + 6):
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    finally:
        listeners.close()


def test_an_expanding_client_keeps_a_worker_that_announces_no_slots(zq_inprocess):
    worker = zq_inprocess(Registry())
    with zqsync.Client(worker.endpoint, expand_prefork=True) as expanding:
        assert expanding.call("zqsync.ping") == "pong"  # zqsync.endpoints is unknown there: it stands for itself
        assert expanding.endpoints == (worker.endpoint,)
