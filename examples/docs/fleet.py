"""A fleet: a DNS name stands for every worker it resolves to, re-resolved as the fleet changes.

    cd examples/docs && zqsync worker fleet --bind tcp://127.0.0.1:5555
    python examples/docs/fleet.py tcp://127.0.0.1:5555
"""

import sys

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task
def add(a, b):
    return a + b


def main(endpoint):
    port = endpoint.rsplit(":", 1)[1]
    # In production: tcp://workers.internal:5555 (every A/AAAA record), or srv://workers.internal
    # (SRV records _zqsync._tcp.workers.internal: hosts and ports). Here: localhost, on this machine.
    with zqsync.Client(f"tcp://localhost:{port}", resolve_interval=5.0) as client:
        assert client.call("add", 2, 3) == 5
        assert f"tcp://127.0.0.1:{port}" in client.endpoints  # what the name resolved to
        print("localhost stands for", client.endpoints)


if __name__ == "__main__":
    main(sys.argv[1])
