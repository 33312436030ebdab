"""Security: CURVE keys, so that only listed clients reach the worker, over encrypted connections.

    zqsync keygen worker --dir keys && zqsync keygen web1 --dir keys
    mkdir -p keys/clients && cp keys/web1.key keys/clients/
    cd examples/docs && zqsync worker security --bind tcp://0.0.0.0:5555 \
        --curve-secret-key ../../keys/worker.key_secret --allow-client-keys ../../keys/clients
    python examples/docs/security.py tcp://127.0.0.1:5555 keys
"""

import os
import shutil
import sys

import zqsync
from zqsync.wire.curve import keygen
from zqsync.worker import Registry

registry = Registry()


@registry.task
def add(a, b):
    return a + b


def worker_settings(directory):
    """Make the keys as `zqsync keygen` does (mode 0600 secrets) and list web1 as the only client."""
    keys = os.path.join(directory, "keys")
    _, worker_secret = keygen(keys, "worker")
    web1_public, _ = keygen(keys, "web1")
    keygen(keys, "intruder")  # a well-formed key the worker does not list
    os.makedirs(os.path.join(keys, "clients"))
    shutil.copy(web1_public, os.path.join(keys, "clients"))
    main.keys = keys  # for main(), run by the docs test right after
    return {"curve_secret_key": worker_secret, "allow_client_keys": os.path.join(keys, "clients")}


def main(endpoint, keys=None):
    keys = keys or main.keys
    web1 = zqsync.Curve.from_files(f"{keys}/worker.key", f"{keys}/web1.key_secret")
    with zqsync.Client(endpoint, curve=web1) as client:
        assert client.call("add", 1, 2) == 3

    intruder = zqsync.Curve.from_files(f"{keys}/worker.key", f"{keys}/intruder.key_secret")
    with zqsync.Client(endpoint, curve=intruder, call_timeout=0.5) as client:
        try:
            client.call("add", 1, 2)  # the handshake never completes: nothing it sends is received
        except zqsync.CallTimeout:
            print("not listed: no answer")
        else:
            raise AssertionError("an unlisted client was answered")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
