"""The built wheel carries the license, the PEP 561 marker and full metadata, with the version from one place."""

from __future__ import annotations

import email
import glob
import subprocess
import sys
import zipfile

import pytest

import zqsync

pytestmark = pytest.mark.processes_only


@pytest.mark.timeout(300)
def test_wheel_has_license_py_typed_classifiers_and_the_package_version(root, tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), root],
                           cwd=str(tmp_path), capture_output=True, text=True, timeout=280)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = glob.glob(str(tmp_path / "zqsync-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
        (license_name,) = [name for name in names if ".dist-info/" in name and name.endswith("LICENSE")]
        license_text = archive.read(license_name).decode()
    assert "zqsync/py.typed" in names
    # The dashboard serves its page and its vendored chart library (with its licence) from the package.
    for served in ("templates/index.html", "templates/login.html", "static/dashboard.js", "static/uPlot.iife.min.js",
                   "static/uPlot.min.css", "static/uPlot.LICENSE"):
        assert f"zqsync/dashboard/{served}" in names
    assert license_text.startswith("MIT License") and "Copyright (c) 2026 the zqsync authors" in license_text
    assert metadata["Version"] == zqsync.__version__
    assert "MIT" in (metadata["License-Expression"], metadata["License"])
    classifiers = metadata.get_all("Classifier")
    for expected in ("Typing :: Typed", "Framework :: Gevent",
                     "Framework :: Django", "Framework :: Flask", "Programming Language :: Python :: 3.9"):
        assert expected in classifiers
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"django", "flask", "docs", "package", "test"} <= extras
