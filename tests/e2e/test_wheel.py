"""The built wheel stands alone: installed into a fresh venv outside the checkout, ``zqsync demo`` runs."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import venv

import pytest

pytestmark = pytest.mark.processes_only


def run(command: list[str], *, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "ZQSYNC_TEST_MONKEY")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(600)
def test_wheel_installed_outside_the_checkout_runs_the_demo(root, tmp_path):
    wheels = tmp_path / "wheels"
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), root],
                cwd=str(tmp_path), timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = glob.glob(str(wheels / "zqsync-*.whl"))

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    installed = run([python, "-m", "pip", "install", "-q", f"{wheel}[web]"], cwd=str(tmp_path), timeout=400)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run([python, "-c", "import zqsync; print(zqsync.__file__)"], cwd=str(elsewhere), timeout=60)
    assert str(env_dir) in where.stdout, where.stdout + where.stderr  # the wheel, not the checkout

    demo = run([str(env_dir / "bin" / "zqsync"), "demo", "--requests", "200", "--concurrency", "10"],
               cwd=str(elsewhere), timeout=200)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "200 enqueued, 200 executed" in demo.stdout
    assert "result: OK" in demo.stdout

    bench = run([str(env_dir / "bin" / "zqsync"), "bench", "--smoke"], cwd=str(elsewhere), timeout=60)
    assert bench.returncode != 0 and "checkout" in bench.stderr
