"""The Django app config of ``zqsync.contrib.django``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "ZQSYNC":
        from . import reset_client

        reset_client()


class ZqsyncConfig(AppConfig):
    """Registers nothing at import; rebuilds the default client when a test overrides ``ZQSYNC``."""

    name = "zqsync.contrib.django"
    label = "zqsync"
    verbose_name = "zqsync"

    def ready(self) -> None:
        setting_changed.connect(_settings_changed, dispatch_uid="zqsync-settings-changed")
