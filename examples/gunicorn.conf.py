"""gunicorn configuration for examples/webapp.py.

    ZQSYNC_ENDPOINT=tcp://127.0.0.1:5555 gunicorn -c examples/gunicorn.conf.py --chdir examples webapp:app
"""

from zqsync.contrib.gunicorn import child_exit, post_fork, worker_exit  # noqa: F401  (gunicorn reads hooks by name)

worker_class = "gevent"
workers = 2
worker_connections = 1000
bind = "127.0.0.1:8000"
graceful_timeout = 10
