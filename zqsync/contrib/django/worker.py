"""The registry a Django worker serves: ``zqsync worker zqsync.contrib.django.worker``.

Imported by ``zqsync worker`` after gevent has monkey-patched the process, so
Django (and every app's ``tasks.py``) is set up on patched modules. Needs
``DJANGO_SETTINGS_MODULE``; ``manage.py zqsync_worker`` sets everything up.
"""

from __future__ import annotations

import os

if not os.environ.get("DJANGO_SETTINGS_MODULE"):
    raise ImportError("set DJANGO_SETTINGS_MODULE (or run 'python manage.py zqsync_worker') to serve a Django project")

import django  # noqa: E402

django.setup()

from . import discover_registry  # noqa: E402

#: Every installed app's tasks, served by ``zqsync worker zqsync.contrib.django.worker``.
registry = discover_registry()
