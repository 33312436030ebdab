"""Requests that come while a client's very first look-up of a name is in flight (found by the fleet test).

A client that names its workers by DNS resolves the name in the first request that needs it, and
other requests meanwhile "go on with the endpoints known so far" (``client/discovery.py``). Before
the first answer that is none at all: a confirmed job then raised ``IndexError`` from an empty
rendezvous ranking (two client processes of ``tests/e2e/test_fleet.py`` died of it at start).
The nameserver here is the test's own UDP socket on loopback, which answers only when the test
says, so the second request certainly comes while the first look-up waits.
"""

from __future__ import annotations

import socket
import threading

import pytest

import zqsync
from tests.helpers import slack

dns_message = pytest.importorskip("dns.message", reason="dnspython (zqsync[dns]) is not installed")
import dns.rdatatype  # noqa: E402
import dns.rrset  # noqa: E402


def answer(nameserver: socket.socket, data: bytes, peer) -> None:
    """Answer one question: ``127.0.0.1`` for A, nothing for AAAA."""
    query = dns_message.from_wire(data)
    reply = dns_message.make_response(query)
    question = query.question[0]
    if question.rdtype == dns.rdatatype.A:
        reply.answer.append(dns.rrset.from_text_list(question.name, 30, "IN", "A", ["127.0.0.1"]))
    nameserver.sendto(reply.to_wire(), peer)


@pytest.mark.timeout(60)
def test_a_confirmed_job_sent_while_the_first_look_up_is_unanswered_is_confirmed_not_failed(zq_worker, tmp_path):
    # A worker process: an in-process worker with a journal printed a replay on its closed journal at stop.
    worker = zq_worker(extra_args=["--state-dir", str(tmp_path / "state")])
    nameserver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        nameserver.bind(("127.0.0.1", 0))
        nameserver.settimeout(slack(10))
        port = worker.endpoint.rpartition(":")[2]
        client = zqsync.Client(f"tcp://workers.test:{port}", resolver=f"127.0.0.1:{nameserver.getsockname()[1]}",
                               confirm_timeout=slack(20))
        outcomes: dict[str, str] = {}

        def confirm(name: str) -> None:
            try:
                client.enqueue_with_options("echo", args=(name,), confirm=True)
                outcomes[name] = "confirmed"
            except Exception as exc:  # the outcome is the test's subject
                outcomes[name] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=confirm, args=(name,)) for name in ("first", "second")]
        threads[0].start()
        first_question = nameserver.recvfrom(4096)  # the first look-up waits for this answer
        threads[1].start()
        threads[1].join(slack(0.5))  # it raised at once before the fix; now it waits for an address too
        answer(nameserver, *first_question)
        nameserver.settimeout(0.05)
        while any(thread.is_alive() for thread in threads):
            try:
                answer(nameserver, *nameserver.recvfrom(4096))
            except socket.timeout:
                continue
        for thread in threads:
            thread.join()
        client.close()
        assert outcomes == {"first": "confirmed", "second": "confirmed"}
    finally:
        nameserver.close()
