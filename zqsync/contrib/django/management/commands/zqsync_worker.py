"""``python manage.py zqsync_worker [-- ZQSYNC WORKER OPTIONS]``: serve the project's tasks."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import zqsync_settings

APP = "zqsync.contrib.django.worker:registry"


def worker_argv(options: dict[str, Any]) -> list[str]:
    """``ZQSYNC["WORKER"]`` as ``zqsync worker`` options: ``{"state_dir": "/x", "processes": 2}`` to
    ``["--state-dir", "/x", "--processes", "2"]``; ``True`` is a bare flag, ``False`` and ``None`` are left out."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    return argv


class Command(BaseCommand):
    help = (
        "Run a zqsync worker serving the tasks.py registry of every installed app, with Django set up. "
        "Options come from settings.ZQSYNC['WORKER']; arguments after -- go to 'zqsync worker' and win "
        "(e.g. manage.py zqsync_worker -- --bind tcp://127.0.0.1:5555 --processes 4)."
    )
    requires_system_checks: Any = []  # the worker process sets Django up itself

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker_args", nargs="*", metavar="OPTION",
                            help="options for 'zqsync worker', after --; see zqsync worker --help")

    def handle(self, *args: Any, **options: Any) -> None:
        settings_module = os.environ.get("DJANGO_SETTINGS_MODULE")
        if not settings_module:
            raise CommandError("DJANGO_SETTINGS_MODULE is not set")
        worker = zqsync_settings().get("WORKER", {})
        if not isinstance(worker, dict):
            raise CommandError("settings.ZQSYNC['WORKER'] must be a dict of 'zqsync worker' options")
        project = os.path.abspath(sys.path[0] or os.getcwd())  # manage.py's directory
        path = os.pathsep.join(filter(None, [project, os.environ.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "zqsync", "worker", APP, *worker_argv(worker), *options["worker_args"]]
        if "--reload" in argv:  # watch the project, not the installed zqsync package that APP lives in
            argv += ["--reload-dir", project]
        sys.stdout.flush()
        sys.stderr.flush()
        # exec, not a child: the pid stays the same, so TERM from systemd, a
        # container runtime or a test reaches the worker itself.
        os.execve(sys.executable, argv, {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module, "PYTHONPATH": path})
