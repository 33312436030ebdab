"""The client side of the stopping notice: which endpoint a notice names, and what a client leaves out."""

from __future__ import annotations

import time

import zmq

from zqsync.client import notices
from zqsync.worker.stopping import encode_notice


def test_a_notice_names_the_client_endpoint_by_string_else_by_a_unique_port():
    mine = ("tcp://127.0.0.1:5000", "tcp://worker-b:6000")
    assert notices.match(("tcp://127.0.0.1:5000",), mine) == "tcp://127.0.0.1:5000"
    assert notices.match(("tcp://0.0.0.0:6000",), mine) == "tcp://worker-b:6000"
    assert notices.match(("tcp://10.0.0.9:7000",), mine) is None
    assert notices.match(("tcp://0.0.0.0:5000",), ("tcp://a:5000", "tcp://b:5000")) is None
    # a direct prefork child names its slot, then the public endpoint a client that did not expand sent to
    assert notices.match(("tcp://0.0.0.0:7002", "tcp://0.0.0.0:6000"), mine) == "tcp://worker-b:6000"
    assert notices.match((), mine) is None


def test_a_client_leaves_a_stopping_worker_out_and_connects_to_none_when_all_stop(monkeypatch):
    both = ("tcp://a:1", "tcp://b:2")
    avoided = notices.Avoided()
    assert avoided.address(both, both) is both
    avoided.add("tcp://a:1")
    assert avoided.address(both, both) == "tcp://b:2"
    avoided.add("tcp://b:2")
    assert avoided.address(both, both) == ()
    monkeypatch.setattr(time, "monotonic", lambda: 1e12)  # past every deadline
    assert avoided.address(both, both) is both


def test_a_notice_waiting_on_a_dealer_is_found_without_blocking():
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        assert notices.stopping_endpoints(dealer) is None
        dealer.send(b"job")
        identity, _ = router.recv_multipart()
        router.send_multipart([identity, encode_notice(f"tcp://127.0.0.1:{port}")])
        assert dealer.poll(10_000)
        assert notices.stopping_endpoints(dealer) == (f"tcp://127.0.0.1:{port}",)
        assert notices.stopping_endpoints(dealer) is None  # read once
        router.send_multipart([identity, encode_notice("tcp://127.0.0.1:7002", also=("tcp://127.0.0.1:7000",))])
        assert dealer.poll(10_000)
        assert notices.stopping_endpoints(dealer) == ("tcp://127.0.0.1:7002", "tcp://127.0.0.1:7000")
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        context.term()
