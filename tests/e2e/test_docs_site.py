"""The documentation site builds with ``mkdocs build --strict`` and its API pages carry the docstrings.

Needs the ``docs`` extra (``tox -e docs`` installs it and runs the build); skipped without it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes_only

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")


@pytest.mark.timeout(180)
def test_mkdocs_builds_strictly_with_api_pages_from_the_docstrings(root, tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=root, capture_output=True, text=True, timeout=170,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr

    def page(path: str) -> str:
        return (site / path / "index.html").read_text()

    assert "enqueue_with_options" in page("reference/client") and "Unconfirmed" in page("reference/client")
    assert "init_app" in page("reference/contrib") and "discover_registry" in page("reference/contrib")
    assert "zqsync advantage" in page("benchmarks") and (site / "bench.png").exists()
    assert "0.2.0" in page("changelog")
    for guide in ("gunicorn", "flask", "django", "scripts", "testing", "deployment"):
        assert (site / "guides" / guide / "index.html").exists()
