"""Shared test configuration. Fixtures for workers and peers come from the zqsync.testing plugin."""

import os
import sys

import pytest

#: True in the tox env that monkey-patches before pytest starts.
MONKEY_PATCHED = "gevent.monkey" in sys.modules and sys.modules["gevent.monkey"].is_anything_patched()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def root() -> str:
    """The repository root (examples/ and benchmarks/ live there)."""
    return ROOT
