"""Every feature page of the site shows a runnable example, and every example runs against a real worker.

An example is ``examples/docs/NAME.py``: a ``registry`` of tasks and ``main(endpoint)``, which uses a
client on that worker and asserts what it shows (``python examples/docs/NAME.py ENDPOINT`` runs it against
``zqsync worker examples/docs/NAME.py``). Optional: ``worker_settings(directory)``, the worker's settings
(a journal in ``directory``, CURVE keys). An example whose ``main()`` takes no endpoint (eager mode)
needs no worker. Pages include their example with ``--8<-- "examples/docs/NAME.py"``, so what the reader sees is
what ran. The worker is the in-process worker core, over loopback TCP.
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import re

import pytest
import yaml

from tests.conftest import ROOT

EXAMPLES = pathlib.Path(ROOT, "examples", "docs")
DOCS = pathlib.Path(ROOT, "docs")
#: Feature page -> the example it includes: the features the issue found documented only outside the site.
FEATURES = {
    "features/time-limits.md": "time_limits",
    "features/retries.md": "retries",
    "features/results.md": "results",
    "features/delayed.md": "delayed",
    "guides/limits.md": "limits",
    "features/periodic.md": "periodic",
    "features/cancel.md": "cancel",
    "features/routes-and-queues.md": "routes_and_queues",
    "features/middleware.md": "middleware",
    "guides/testing.md": "eager_testing",
    "features/metrics.md": "metrics",
    "features/security.md": "security",
    "features/fleet.md": "fleet",
}
INCLUDE = re.compile(r'--8<-- "examples/docs/(\w+)\.py')


def nav_pages(node) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, dict):
        return set().union(*(nav_pages(value) for value in node.values()))
    return set().union(*(nav_pages(item) for item in node))


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_feature_page_is_in_the_nav_and_includes_its_example():
    with open(pathlib.Path(ROOT, "mkdocs.yml")) as handle:
        nav = nav_pages(yaml.load(handle, Loader=yaml.BaseLoader)["nav"])
    missing = {page: example for page, example in FEATURES.items()
               if page not in nav or not (DOCS / page).exists()
               or example not in INCLUDE.findall((DOCS / page).read_text())}
    assert missing == {}, f"features without a page in the nav that includes their example: {missing}"


def test_every_example_is_on_a_page():
    included = {name for page in DOCS.rglob("*.md") for name in INCLUDE.findall(page.read_text())}
    examples = {path.stem for path in EXAMPLES.glob("[a-z]*.py")}
    assert examples and examples <= included, f"examples no page shows: {sorted(examples - included)}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(set(FEATURES.values())))
def test_the_example_runs_against_a_real_worker(name, zq_inprocess, tmp_path):
    module = load(name)
    if not inspect.signature(module.main).parameters:
        module.main()
        return
    settings = module.worker_settings(str(tmp_path)) if hasattr(module, "worker_settings") else {}
    worker = zq_inprocess(module.registry, **settings)
    module.main(worker.endpoint)
