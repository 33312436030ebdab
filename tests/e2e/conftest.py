"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e.netns import Lab, remove_stale_namespaces, unavailable_reason


@pytest.fixture
def lab():
    """A :class:`~tests.e2e.netns.Lab` on 10.254.7.0/24 (private to its namespaces); skips without root."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    remove_stale_namespaces()
    with Lab("10.254.7") as made:
        yield made
