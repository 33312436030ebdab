"""The documentation site builds with ``mkdocs build --strict`` and its API pages carry the docstrings.

Needs the ``docs`` extra (``tox -e docs`` installs it and runs the build); skipped without it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes_only

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const|ref|doc):(?=`|<code>)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module's tests."""
    built = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
                            cwd=ROOT, capture_output=True, text=True, timeout=170,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    return built


@pytest.mark.timeout(180)
def test_mkdocs_builds_strictly_with_api_pages_from_the_docstrings(site):
    def page(path: str) -> str:
        return (site / path / "index.html").read_text()

    assert "enqueue_with_options" in page("reference/client") and "Unconfirmed" in page("reference/client")
    assert "init_app" in page("reference/contrib") and "discover_registry" in page("reference/contrib")
    assert "zqsync advantage" in page("benchmarks") and (site / "bench.png").exists()
    assert "0.2.0" in page("changelog")
    for guide in ("gunicorn", "flask", "django", "scripts", "testing", "deployment"):
        assert (site / "guides" / guide / "index.html").exists()


@pytest.mark.timeout(180)
def test_no_page_shows_a_raw_sphinx_role(site):
    """Docstrings are Markdown: a role such as :class:`X` would reach the reader as those very characters."""
    raw = {str(page.relative_to(site)): ROLE.findall(page.read_text()) for page in site.rglob("*.html")}
    raw = {page: len(found) for page, found in raw.items() if found}
    assert raw == {}, f"{sum(raw.values())} raw roles: {raw}"
