"""The wire: the msgpack envelope, worker endpoints and CURVE keys, shared by client and worker."""
