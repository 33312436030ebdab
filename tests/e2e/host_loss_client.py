"""The client host of ``tests/e2e/test_host_loss.py``: sends confirmed, delayed jobs until told to stop.

``python tests/e2e/host_loss_client.py CONFIG.json``. It sends ``ran`` jobs one after another, each
with ``delay`` seconds, and keeps ``[id, index of its preferred worker, epoch seconds it was
acknowledged]`` for each acknowledged one. Once at least ``ready_each`` jobs preferring each worker
are acknowledged it creates the ``ready`` file; once the ``lost`` file exists it sends for ``after``
seconds more, then writes what was acknowledged to ``out`` (JSON) and exits. Monkey-patched when
``gevent`` is true; ``confirm_retry`` is the client's.
"""

import json
import os
import sys
import time

config = json.loads(open(sys.argv[1]).read())
if config["gevent"]:
    from gevent import monkey

    monkey.patch_all()

import zqsync  # noqa: E402
from zqsync.client.rendezvous import rank  # noqa: E402
from zqsync.wire.endpoints import split_endpoint  # noqa: E402


def main() -> None:
    endpoints = config["endpoints"]
    rpc = [split_endpoint(name)[1] for name in endpoints]
    acked, preferred, until, n = [], [0] * len(endpoints), None, 0
    with zqsync.Client(endpoints, confirm_retry=config["confirm_retry"], confirm_timeout=30) as client:
        while until is None or time.monotonic() < until:
            n += 1
            job_id = f"job-{n}"
            client.enqueue_with_options("ran", args=(config["record"], job_id), confirm=True, job_id=job_id,
                                        delay=config["delay"])
            index = rpc.index(rank(job_id, rpc)[0])
            acked.append([job_id, index, time.time()])
            preferred[index] += 1
            if min(preferred) == config["ready_each"] and preferred[index] == config["ready_each"]:
                open(config["ready"], "w").close()  # once: when the last worker reaches the count
            if until is None and os.path.exists(config["lost"]):
                until = time.monotonic() + config["after"]
    with open(config["out"] + ".tmp", "w") as handle:
        json.dump({"acked": acked}, handle)
    os.replace(config["out"] + ".tmp", config["out"])


main()
