"""discover_registry keeps each task's retry options, the periodic schedules and the middleware."""

import subprocess
import sys

import pytest

pytest.importorskip("django")

SCRIPT = """
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=["tests.unit.django_merge_app"])
django.setup()
from zqsync.contrib.django import discover_registry
merged = discover_registry()
fetch = merged.get("fetch")
assert (fetch.retries, fetch.retry_on, fetch.max_delay, fetch.jitter) == (2, (OSError,), 5.0, 0.25), fetch
assert merged.periodic_jobs["sweep"].every == 60.0 and merged.periodic_jobs["sweep"].catch_up == "latest"
assert [type(m).__name__ for m in merged.middleware] == ["Marker"], merged.middleware
print("ok")
"""


def test_discovered_registry_keeps_task_options_schedules_and_middleware(root):
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
