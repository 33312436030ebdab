"""One client host of the fleet test (``tests/e2e/fleet.py``): a web process's ``Client`` under load.

``python tests/e2e/fleet_client.py CONFIG.json`` builds one :class:`zqsync.Client` of a DNS name
(the nameserver comes from ``ZQSYNC_RESOLVER``) and runs paced loopers on it, threads or, with
``"gevent"``, greenlets: pushers (plain ``note`` jobs), confirmers (``confirm=True``) and callers
(``call("note")``), each operation with an id of its own (``p-``, ``c-``, ``k-``), until the file
``stop`` exists. Every operation is one JSON line in ``events`` (``k`` kind, ``id``, ``s`` and
``e`` its start and end on the monotonic clock, ``ok``, ``err``), appended with one ``write``
on an ``O_APPEND`` descriptor. A sampler adds an ``ep`` line whenever the client's endpoints
(``stats()["endpoints"]``) change, and the last line is ``done`` with the client's stats
after its ``close()``.
"""

import json
import os
import sys
import threading
import time

config = json.loads(open(sys.argv[1]).read())
if config["gevent"]:
    from gevent import monkey

    monkey.patch_all()

import zqsync  # noqa: E402  (after the patching)

events = os.open(config["events"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
prefix = config["name"]


def emit(**event):
    os.write(events, (json.dumps(event) + "\n").encode())


def push(client, job_id):
    client.enqueue("note", f"p {job_id}")


def confirm(client, job_id):
    client.enqueue_with_options("note", args=(f"c {job_id}",), confirm=True, job_id=job_id)


def call(client, job_id):
    client.call("note", f"k {job_id}")


OPERATIONS = {"p": push, "c": confirm, "k": call}


def loop(client, kind, index):
    pace = 1.0 / config["rates"][kind]
    n = 0
    next_due = time.monotonic()
    while not os.path.exists(config["stop"]):
        n += 1
        job_id = f"{prefix}-{kind}{index}-{n}"
        start = time.monotonic()
        try:
            OPERATIONS[kind](client, job_id)
            ok, error = True, None
        except zqsync.ZqsyncError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        end = time.monotonic()
        emit(k=kind, id=job_id, s=start, e=end, ok=ok, err=error)
        next_due = max(next_due + pace, end - pace)  # a stalled operation's slots are not made up in a burst
        time.sleep(max(0.0, next_due - time.monotonic()))


def sample(client, done):
    seen = None
    while not done.is_set():
        endpoints = client.stats()["endpoints"]
        if endpoints != seen:
            seen = endpoints
            emit(k="ep", t=time.monotonic(), eps=endpoints)
        time.sleep(0.05)


def main():
    client = zqsync.Client(config["endpoint"], call_timeout=config["call_timeout"],
                           confirm_retry=config["confirm_retry"], confirm_timeout=config["confirm_timeout"])
    done = threading.Event()
    sampler = threading.Thread(target=sample, args=(client, done))
    sampler.start()
    loopers = [threading.Thread(target=loop, args=(client, kind, index))
               for kind, count in config["loopers"].items() for index in range(count)]
    for looper in loopers:
        looper.start()
    for looper in loopers:
        looper.join()
    done.set()
    sampler.join()
    client.close()
    emit(k="done", stats=client.stats())


main()
