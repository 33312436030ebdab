"""A tiny authoritative DNS server for the discovery tests, on a loopback UDP port (no real network).

``python tests/dns_server.py RECORDS.json`` binds 127.0.0.1 on an ephemeral port, prints the port on
stdout, and answers A, AAAA and SRV questions from ``RECORDS.json``, read again for every question
so a test changes the answers by rewriting the file (atomically: write, then rename)::

    {"ttl": 30, "A": {"workers.test": ["127.0.0.2"]}, "AAAA": {}, "SRV": {"_zqsync._tcp.workers.test":
     [[0, 0, 5555, "workers.test"]]}}

An SRV record is ``[priority, weight, port, target]`` (the target as an absolute name).

A name with none of the asked type gets an empty answer; a name unknown to every type, NXDOMAIN.
Every question is appended to ``RECORDS.json.log`` as ``TYPE NAME`` (the tests count look-ups).
"""

from __future__ import annotations

import json
import socket
import sys

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


def answer(query: dns.message.Message, records: dict) -> dns.message.Message:
    reply = dns.message.make_response(query)
    reply.flags |= 0x0400  # authoritative
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    kind = dns.rdatatype.to_text(question.rdtype)
    known = any(name in records.get(each, {}) for each in ("A", "AAAA", "SRV"))
    values = records.get(kind, {}).get(name, [])
    if not known:
        reply.set_rcode(dns.rcode.NXDOMAIN)
    elif values:
        texts = [" ".join(str(part) for part in value) + "." if isinstance(value, list) else value for value in values]
        reply.answer.append(dns.rrset.from_text_list(question.name, int(records.get("ttl", 30)), "IN", kind, texts))
    return reply


def main() -> None:
    path = sys.argv[1]
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    while True:
        data, peer = server.recvfrom(4096)
        try:
            query = dns.message.from_wire(data)
        except Exception:
            continue
        with open(path) as handle:
            records = json.load(handle)
        question = query.question[0]
        with open(path + ".log", "a") as log:
            log.write(f"{dns.rdatatype.to_text(question.rdtype)} {question.name.to_text(omit_final_dot=True)}\n")
        try:
            reply = answer(query, records)
        except Exception as exc:  # a bad record in the test's file: say so, and answer SERVFAIL
            print(f"dns_server: {exc!r}", file=sys.stderr, flush=True)
            reply = dns.message.make_response(query)
            reply.set_rcode(dns.rcode.SERVFAIL)
        server.sendto(reply.to_wire(), peer)


if __name__ == "__main__":
    main()
