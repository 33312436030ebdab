"""`Reader` (``worker/inline.py``): replies sent beside a parked reader, seen from a real peer's DEALER.

A ZeroMQ socket's descriptor announces new input once: whoever processes the socket's commands
first (a send does, now and then) consumes the announcement. The tests consume it on purpose, with
a ``zmq_poll`` on the socket, exactly where a reply's send may, and then send a reply: the parked
reader must still read the request that is waiting.
"""

from __future__ import annotations

from typing import Iterator

import gevent
import pytest
import zmq
import zmq.green

from tests.helpers import slack
from zqsync.worker.inline import Reader

pytestmark = pytest.mark.timeout(30)

PEER = b"peer-1"


@pytest.fixture
def pair() -> Iterator[tuple[Reader, zmq.Socket]]:
    """A `Reader` on a green ROUTER and a connected DEALER (routing id `PEER`) that has said hello."""
    context = zmq.green.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.setsockopt(zmq.ROUTING_ID, PEER)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hello")
        reader = Reader(router)
        with gevent.Timeout(slack(10.0)):
            assert reader.recv_multipart() == [PEER, b"hello"]
        yield reader, dealer
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        context.term()


def consume_the_announcement(reader: Reader) -> None:
    """Wait (natively, the hub does not run) until a message is readable, processing the socket's commands
    as a send may: the descriptor's announcement of it is gone."""
    assert reader.raw.poll(slack(10.0) * 1000, zmq.POLLIN), "the request never arrived"


def test_a_parked_reader_reads_a_request_whose_announcement_a_reply_s_send_consumed(pair):
    reader, dealer = pair
    parked = gevent.spawn(reader.recv_multipart)
    gevent.sleep(0)  # it finds the socket empty and waits on the descriptor
    dealer.send(b"request")
    consume_the_announcement(reader)
    reader.reply([PEER], b"answer")
    parked.join(slack(5.0))
    assert parked.ready(), "the parked reader never woke for the request"
    assert parked.get() == [PEER, b"request"]
    with gevent.Timeout(slack(10.0)):
        assert dealer.recv() == b"answer"


def test_replies_sent_together_beside_a_parked_reader_all_arrive_in_order_and_it_reads_on(pair):
    reader, dealer = pair
    for turn in range(3):  # each time the reader parks again, a new announcement may be consumed
        parked = gevent.spawn(reader.recv_multipart)
        gevent.sleep(0)
        dealer.send(b"request %d" % turn)
        consume_the_announcement(reader)
        for n in range(5):  # one hub iteration, several replies: the reader is looked at once, after them
            reader.reply([PEER], b"answer %d.%d" % (turn, n))
        parked.join(slack(5.0))
        assert parked.ready(), f"the parked reader never woke for request {turn}"
        assert parked.get() == [PEER, b"request %d" % turn]
        with gevent.Timeout(slack(10.0)):
            assert [dealer.recv() for _ in range(5)] == [b"answer %d.%d" % (turn, n) for n in range(5)]
