"""Integrations with other software: gunicorn server hooks (``gunicorn``), a Prometheus exporter
(``prometheus``), a Flask extension (``flask``) and a Django app (``django``).

Each is imported only when used, and needs its extra: ``zqsync[prometheus]``, ``zqsync[flask]``, ``zqsync[django]``.
"""
