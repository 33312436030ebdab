"""gunicorn configuration: gevent workers, and zqsync's hooks (a bounded close at worker exit)."""

from zqsync.contrib.gunicorn import child_exit, post_fork, worker_exit  # noqa: F401  (gunicorn reads hooks by name)

worker_class = "gevent"
workers = 2
graceful_timeout = 10
