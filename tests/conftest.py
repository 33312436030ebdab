"""Shared test configuration. Fixtures for workers and peers come from the zqsync.testing plugin."""

import os
import shutil
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests import cpu_load, pgserver
from tests.helpers import slack

#: True in the tox env that monkey-patches before pytest starts.
MONKEY_PATCHED = "gevent.monkey" in sys.modules and sys.modules["gevent.monkey"].is_anything_patched()
BURNERS = pytest.StashKey[list]()

# Hypothesis times each example and its input generation by the wall clock (a 200 ms deadline and the
# too_slow health check by default): on a busy machine the deadline scales with ZQSYNC_TEST_SLACK and
# slow generation is no failure. A test's own settings still override these.
settings.register_profile("zqsync", deadline=timedelta(seconds=slack(1.0)), suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("zqsync")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("ZQSYNC_TEST_MONKEY") == "1" and not MONKEY_PATCHED:
    # tox's gevent env sets this and patches before pytest starts; a run that
    # sets it without patching would pass while testing the plain mode twice.
    raise pytest.UsageError("ZQSYNC_TEST_MONKEY=1 but gevent.monkey.patch_all() did not run before pytest: "
                            "run the suite through `tox -e gevent`")


def pytest_configure(config: pytest.Config) -> None:
    """``ZQSYNC_TEST_LOAD=N`` (:mod:`tests.cpu_load`): start N CPU burners for the run, in the
    controlling process only (a pytest-xdist worker has ``workerinput``)."""
    if hasattr(config, "workerinput"):
        return
    try:
        count = cpu_load.wanted()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[BURNERS] = cpu_load.start(count)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under monkey-patching, skip the tests whose every check runs in processes they start (marked
    ``processes_only``): the plain run already ran them, unchanged by this process's patching."""
    if not MONKEY_PATCHED:
        return
    skip = pytest.mark.skip(reason="processes_only: what it checks runs in the processes it starts, "
                            "the same in both tox envs; the plain env runs it")
    for item in items:
        if item.get_closest_marker("processes_only"):
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Kill the burners (also after Ctrl-C: pytest unconfigures then too)."""
    cpu_load.stop(config.stash.get(BURNERS, []))


def pytest_report_header(config: pytest.Config) -> list[str]:
    burners = config.stash.get(BURNERS, [])
    pids = " ".join(str(burner.pid) for burner in burners)
    return [f"{cpu_load.VARIABLE}: {len(burners)} CPU burner(s), pids {pids}"] if burners else []


@pytest.fixture
def root() -> str:
    """The repository root (examples/ and benchmarks/ live there)."""
    return ROOT


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path (``/tmp/zq-XXXX``), removed after the test.

    For a ``TMPDIR`` under which the worker makes ``ipc://`` endpoints, whose paths
    must stay under 107 bytes: ``tmp_path`` is longer under pytest-xdist (``popen-gwN/``).
    """
    path = Path(tempfile.mkdtemp(prefix="zq-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator["pgserver.Server"]:
    """A real PostgreSQL server for this test process (``tests/pgserver.py``); skips with the reason without one."""
    reason = pgserver.unavailable()
    if reason is not None:
        pytest.skip(f"no PostgreSQL: {reason}")
    server = pgserver.start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server: "pgserver.Server") -> Iterator[str]:
    """The URL of a new, empty database on :func:`pg_server`, dropped after the test."""
    url = pg_server.database()
    yield url
    pg_server.drop(url)
