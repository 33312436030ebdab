"""Eager mode: your app's unit tests run its jobs and calls in the test's process, with no worker.

    pytest examples/docs/eager_testing.py
"""

import zqsync
from zqsync.testing import eager
from zqsync.worker import Registry

registry = Registry()  # in your app: from myapp.tasks import registry
client = zqsync.Client("tcp://127.0.0.1:5555")  # your app's client: eager mode sends nothing through it
outbox = []


@registry.task
def send_welcome(address):
    outbox.append(address)
    return "sent"


@registry.task
def remind(user_id):
    outbox.append(f"reminder for {user_id}")


def signup(address):  # the view under test
    return client.enqueue_with_options("send_welcome", args=(address,), confirm=True)


def test_signup_sends_a_welcome_mail():
    with eager(registry) as ran:
        job = signup("ada@example.org")
        assert job.result() == "sent"                  # answered as a worker would
    assert [job.task for job in ran.jobs] == ["send_welcome"]
    assert not ran.failed()                            # eager(registry, propagate=True) raises instead


def test_a_reminder_goes_out_a_day_later():
    with eager(registry) as ran:
        client.enqueue_with_options("remind", args=(42,), delay=86400)
        assert ran.jobs == []
        ran.advance(86400)                             # the block's clock, not the wall clock
        assert [job.task for job in ran.jobs] == ["remind"]


def test_an_unknown_task_fails_as_it_would_on_a_worker():
    with eager(registry):
        try:
            client.call("no_such_task")
        except zqsync.UnknownTask:
            pass
        else:
            raise AssertionError("no UnknownTask")


def main():
    try:
        for test in (test_signup_sends_a_welcome_mail, test_a_reminder_goes_out_a_day_later,
                     test_an_unknown_task_fails_as_it_would_on_a_worker):
            test()
    finally:
        client.close()
    assert outbox == ["ada@example.org", "reminder for 42"]
