"""Settings of the example Django project: no database, one app (shop) with a tasks.py."""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "mysite.urls"
WSGI_APPLICATION = "mysite.wsgi.application"
INSTALLED_APPS = ["zqsync.contrib.django", "shop"]
DATABASES: dict = {}
USE_TZ = True

#: Shown by the tasks, to prove the worker runs with these settings.
SHOP_CURRENCY = "EUR"
#: The file the ``record_order`` job appends to.
SHOP_ORDERS_LOG = os.environ.get("SHOP_ORDERS_LOG", "orders.log")

ZQSYNC = {
    "ENDPOINT": os.environ.get("ZQSYNC_ENDPOINT", "tcp://127.0.0.1:5555"),
    "CLIENT_OPTIONS": {"call_timeout": 5.0},
    "WORKER": {"bind": os.environ.get("ZQSYNC_BIND", "tcp://127.0.0.1:5555"), "concurrency": 50},
}
