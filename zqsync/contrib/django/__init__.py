"""Django integration: add ``"zqsync.contrib.django"`` to ``INSTALLED_APPS``.

Settings, all optional, in one dict::

    ZQSYNC = {
        "ENDPOINTS": ["tcp://10.0.0.1:5555"],   # or "ENDPOINT": "tcp://..."; default: $ZQSYNC_ENDPOINT
        "CLIENT_OPTIONS": {"call_timeout": 5.0, "pool_size": 4},   # zqsync.Client keyword arguments
        "TASKS_MODULE": "tasks",                # the module autodiscovered in every installed app
        "REGISTRY": "registry",                 # the Registry attribute in that module
        "WORKER": {"bind": "tcp://127.0.0.1:5555", "processes": 2, "state_dir": "/var/lib/zqsync"},
    }

In views, `enqueue` and `call` use a default client built at first
use from those settings (one per process; it opens sockets per process, hub and
thread on first use, so building it before gunicorn forks is safe too).

Workers: ``python manage.py zqsync_worker`` serves every installed app's
``tasks.py`` registry (see `discover_registry`) in a ``zqsync worker``
process that sets Django up after gevent has monkey-patched it; ``WORKER`` gives
its default options, and arguments after ``--`` are passed to ``zqsync worker``.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any, Optional

from ...client.client import Client
from ...errors import ConfigurationError
from ...worker.registry import Registry
from .._config import build_client

__all__ = ["call", "discover_registry", "enqueue", "get_client", "reset_client", "zqsync_settings"]

_lock = threading.Lock()
_client: Optional[Client] = None


def zqsync_settings() -> dict[str, Any]:
    """``settings.ZQSYNC`` (an empty dict when unset).

    :raises ConfigurationError: it is not a dict.
    """
    from django.conf import settings

    value = getattr(settings, "ZQSYNC", {})
    if not isinstance(value, dict):
        raise ConfigurationError(f"settings.ZQSYNC must be a dict, got {type(value).__name__}", setting="ZQSYNC")
    return value


def get_client() -> Client:
    """The default client for ``settings.ZQSYNC``, built at first use in this process.

    :raises ConfigurationError: no endpoint (neither ``ENDPOINTS``, ``ENDPOINT``
        nor ``$ZQSYNC_ENDPOINT``), a malformed one, or an unknown client option.
    """
    global _client
    with _lock:
        if _client is None:
            config = zqsync_settings()
            key = "ENDPOINTS" if config.get("ENDPOINTS") else "ENDPOINT"
            endpoints = config.get(key) or os.environ.get("ZQSYNC_ENDPOINT")
            _client = build_client(endpoints, config.get("CLIENT_OPTIONS"), endpoints_setting=f"ZQSYNC[{key!r}]",
                                   options_setting="ZQSYNC['CLIENT_OPTIONS']")
        return _client


def reset_client() -> None:
    """Close and forget the default client; the next `get_client` builds a new one.

    Runs when a test changes ``settings.ZQSYNC`` (``override_settings``).
    """
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None:
        client.close(linger=0)


def enqueue(task: str, *args: Any, **kwargs: Any) -> str:
    """`zqsync.Client.enqueue` on `get_client`: at most once; returns the job id."""
    return get_client().enqueue(task, *args, **kwargs)


def call(task: str, *args: Any, **kwargs: Any) -> Any:
    """`zqsync.Client.call` on `get_client`: blocks for the result.

    :raises RemoteError: the task raised. :raises CallTimeout: no reply in time.
    """
    return get_client().call(task, *args, **kwargs)


def discover_registry() -> Registry:
    """One registry with the tasks of every installed app's ``TASKS_MODULE`` (default ``tasks``).

    Each such module must define a `Registry` named
    ``REGISTRY`` (default ``registry``); apps without the module are skipped,
    but an import error inside one is raised, not hidden. Needs Django set up.

    :raises ConfigurationError: a tasks module without its registry, or two
        apps registering the same task name.
    """
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    config = zqsync_settings()
    module_name, attr = config.get("TASKS_MODULE", "tasks"), config.get("REGISTRY", "registry")
    merged, owners = Registry(), dict[str, str]()
    for app in apps.get_app_configs():
        if not module_has_submodule(app.module, module_name):
            continue
        path = f"{app.name}.{module_name}"
        registry = getattr(importlib.import_module(path), attr, None)
        if not isinstance(registry, Registry):
            raise ConfigurationError(f"{path} has no zqsync.worker.Registry named {attr!r}", setting="ZQSYNC['REGISTRY']")
        for name in registry.names():
            if name in owners:
                raise ConfigurationError(f"task {name!r} is registered by both {owners[name]} and {path}", setting="name")
            task = registry.get(name)
            assert task is not None
            merged.add(task.fn, name=name, **{key: value for key, value in task._asdict().items()
                                               if key not in ("name", "fn")})
            owners[name] = path
        merged.periodic_jobs.update(registry.periodic_jobs)
        for middleware in registry.middleware:  # a merged registry's middleware wraps every app's tasks
            if not any(middleware is known for known in merged.middleware):
                merged.add_middleware(middleware)
    return merged
