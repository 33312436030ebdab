"""A Django app's tasks, for the discovery test: retry options, a periodic task and middleware."""

from zqsync.worker import Middleware, Registry


class Marker(Middleware):
    pass


registry = Registry(middleware=(Marker(),))


@registry.task(retries=2, retry_on=(OSError,), max_delay=5.0, jitter=0.25)
def fetch(url):
    return url


@registry.periodic(every=60.0, catch_up="latest")
def sweep():
    return None
