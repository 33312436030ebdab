"""Plain synchronous use: no gevent, no web server.

    zqsync worker zqsync.demo.tasks:registry --bind tcp://127.0.0.1:5555 &
    python examples/sync_script.py tcp://127.0.0.1:5555
"""

from __future__ import annotations

import sys

import zqsync


def main(endpoint: str) -> int:
    with zqsync.Client(endpoint, call_timeout=5.0) as client:
        print("add(2, 3) =", client.call("add", 2, 3))
        print("checksum('zq') =", client.call("checksum", "zq", rounds=100)[:16], "...")
        job_ids = [client.enqueue("add", i, i) for i in range(100)]
        print(f"enqueued {len(job_ids)} jobs, first id {job_ids[0]}")
        try:
            client.call("fail", "on purpose")
        except zqsync.RemoteError as exc:
            print(f"remote error, as expected: {exc.remote_type}: {exc.remote_message}")
        stats = client.stats()
        print(f"sockets opened: {stats['jobs']['opened']} job DEALER, {stats['dealer']['opened']} call DEALER "
              f"for {stats['enqueued']} jobs and {stats['calls']} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"))
