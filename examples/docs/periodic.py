"""Periodic jobs: zqsync beat enqueues each tick as a confirmed job; two beats still run it once.

    cd examples/docs && zqsync worker periodic --bind tcp://127.0.0.1:5555 --state-dir /tmp/zq-beat &
    zqsync beat periodic tcp://127.0.0.1:5555    # from examples/docs; run two for availability
    python examples/docs/periodic.py tcp://127.0.0.1:5555   # or this: two beats in threads
"""

import sys
import threading
import time

import zqsync
from zqsync.beat import Beat
from zqsync.worker import Registry

registry = Registry()
runs = []  # in the worker process


@registry.periodic(every=0.2)  # seconds, aligned on the epoch; or cron="*/5 * * * *" (the beat extra)
def refresh():
    runs.append(time.time())


@registry.task
def run_count():
    return len(runs)


def worker_settings(directory):
    return {"state_dir": f"{directory}/state"}  # ticks are confirmed jobs: zqsync worker --state-dir


def main(endpoint):
    sent = set()
    with zqsync.Client(endpoint) as client:
        def enqueue(task, args, kwargs, job_id):  # what zqsync beat does with each tick
            client.enqueue_with_options(task, args=args, kwargs=kwargs, confirm=True, job_id=job_id)
            sent.add(job_id)

        beats = [Beat(list(registry.periodic_jobs.values()), enqueue) for _ in range(2)]
        threads = [threading.Thread(target=beat.run) for beat in beats]
        for thread in threads:
            thread.start()
        while client.call("run_count") < 3:
            time.sleep(0.05)
        for beat, thread in zip(beats, threads):
            beat.stop()
            thread.join()
        while client.call("run_count") < len(sent):  # the last ticks' jobs may still be running
            time.sleep(0.05)
        assert client.call("run_count") == len(sent)  # each tick once, though both beats sent it
        print(len(sent), "ticks,", sum(beat.counters["ticks_sent"] for beat in beats), "sends")


if __name__ == "__main__":
    main(sys.argv[1])
