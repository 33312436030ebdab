"""Metrics: zqsync's counters as Prometheus metrics, here a web process's client side.

    pip install 'zqsync[prometheus]'
    cd examples/docs && zqsync worker metrics --bind tcp://127.0.0.1:5555 --metrics-port 9100
    curl -s http://127.0.0.1:9100/metrics | grep zqsync_worker_jobs_succeeded
    python examples/docs/metrics.py tcp://127.0.0.1:5555
"""

import sys

from prometheus_client import CollectorRegistry, generate_latest

import zqsync
from zqsync.contrib.prometheus import MetricsSync
from zqsync.worker import Registry

registry = Registry()


@registry.task
def add(a, b):
    return a + b


def main(endpoint):
    metrics = CollectorRegistry()  # in an app: the default registry, and MetricsSync().start() in the background
    sync = MetricsSync(registry=metrics, baseline=True)  # baseline: from now on
    with zqsync.Client(endpoint) as client:
        for n in range(3):
            client.enqueue("add", n, n)
        assert client.call("add", 2, 2) == 4
        sync.update()  # start() does this every second
        text = generate_latest(metrics).decode()  # what a /metrics view returns
    assert "zqsync_client_enqueued_total 3.0" in text, text
    assert "zqsync_client_calls_total 1.0" in text, text
    print("\n".join(line for line in text.splitlines() if line.startswith("zqsync_client_")))


if __name__ == "__main__":
    main(sys.argv[1])
