"""gunicorn configuration for the demo app; copy it as your own ``gunicorn.conf.py``.

    ZQSYNC_ENDPOINT=tcp://127.0.0.1:5555 gunicorn -c python:zqsync.demo.gunicorn_conf zqsync.demo.webapp:app
"""

from zqsync.contrib.gunicorn import child_exit, post_fork, worker_exit  # noqa: F401  (gunicorn reads hooks by name)

worker_class = "gevent"
workers = 2
worker_connections = 1000
bind = "127.0.0.1:8000"
graceful_timeout = 10
