"""What libzmq does to a PULL socket's queued jobs when the worker unbinds or closes it.

A client process PUSHes 108-byte messages as fast as it can (``ZMQ_IMMEDIATE``,
HWM 1000, heartbeats: as zqsync's pool does). The worker reads 20,000, stops
reading for BUSY seconds (a busy worker: queues and kernel buffers fill), then:

* ``close``: closes the socket (linger 0);
* ``unbind``: unbinds the endpoint, waits AFTER_UNBIND seconds, then reads
  what is left until nothing comes for 1 s.

It prints sent, read, lost, and the kernel's TCPAbortOn* counter deltas
(machine-wide, so other traffic may add to them).

Findings (libzmq 4.3.5, loopback): ``unbind`` closes the listener *and every
connection accepted on it* (the client sees the disconnect and stops sending
to it); every message already in the socket's queue (its RCVHWM, 1000) stays
readable after the unbind, even 2 s later, whatever the linger; what was in
the kernel buffers and in the client's queue for this worker is lost
(25,000-45,000 messages after 0.5 s busy, mostly the client's 4 MB send
buffer; TCPAbortOnClose +1). ``close`` loses the socket's queue too.

usage: python -m benchmarks.unbind_experiment close|unbind [BUSY]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import zmq

CLIENT = r"""
import sys, time, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.PUSH)
s.setsockopt(zmq.IMMEDIATE, 1); s.setsockopt(zmq.SNDHWM, 1000)
s.setsockopt(zmq.HEARTBEAT_IVL, 1000); s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
s.connect(sys.argv[1])
sent, started = 0, time.monotonic()
while time.monotonic() - started < float(sys.argv[2]):
    try:
        s.send(sent.to_bytes(8, "big") + b"x" * 100, zmq.NOBLOCK)
        sent += 1
    except zmq.Again:
        time.sleep(0.0005)
print(sent, flush=True)
s.close(linger=0); ctx.term()
"""


def netstat() -> dict[str, int]:
    with open("/proc/net/netstat") as handle:
        rows = handle.read().splitlines()
    values: dict[str, int] = {}
    for names, numbers in zip(rows[::2], rows[1::2]):
        values.update(zip(names.split()[1:], map(int, numbers.split()[1:])))
    return {key: values[key] for key in ("TCPAbortOnData", "TCPAbortOnClose")}


def main(variant: str, busy: float) -> dict:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 1000)
    pull.setsockopt(zmq.LINGER, int(os.environ.get("LINGER", "1000")))
    endpoint = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
    before = netstat()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, endpoint, "4"], stdout=subprocess.PIPE, text=True)
    got = set()
    while len(got) < 20_000:
        got.add(int.from_bytes(pull.recv()[:8], "big"))
    time.sleep(busy)
    drained = 0
    if variant == "unbind":
        pull.unbind(endpoint)
        time.sleep(float(os.environ.get("AFTER_UNBIND", "0")))
        while pull.poll(1000):
            got.add(int.from_bytes(pull.recv()[:8], "big"))
            drained += 1
    pull.close(linger=0)
    sent = int(client.communicate(timeout=30)[0])
    after = netstat()
    context.term()
    return {"variant": variant, "busy": busy, "sent": sent, "read_after_stop": drained, "read": len(got),
            "lost": sent - len(got), **{key: after[key] - before[key] for key in after}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.5)))
