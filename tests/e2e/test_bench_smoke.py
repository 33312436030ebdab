"""``zqsync bench`` end to end, as a user runs it from a checkout: every scenario at smoke size.

These tests check that the suite runs and reports; they assert nothing about speed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes_only

SCENARIOS = {"pool", "worker", "zerorpc", "congestion", "rq", "endtoend", "fork", "prefork", "gunicorn"}
#: Scenarios that need nothing beyond the test extra, so they must have run.
ALWAYS_RUN = {"pool", "worker", "congestion", "fork", "prefork", "gunicorn"}


def bench(*args: str, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zqsync", "bench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(900)
def test_bench_smoke_prints_one_table_and_writes_every_scenario_to_json(root, tmp_path):
    report = tmp_path / "bench.json"
    result = bench("--smoke", "--json", str(report), cwd=root, timeout=840)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "| benchmark | comparison | zqsync | peer |" in result.stdout
    assert "`zqsync bench --smoke` on " in result.stdout  # the headline names the command and the machine

    document = json.loads(report.read_text())
    scenarios = document["scenarios"]
    assert set(scenarios) == SCENARIOS
    for name, scenario in scenarios.items():
        assert scenario["status"] in ("ok", "skipped", "pending"), (name, scenario["reason"])
        if scenario["status"] == "skipped":
            assert "install" in scenario["reason"], (name, scenario["reason"])  # says how to get the peer
    for name in ALWAYS_RUN:
        assert scenarios[name]["status"] == "ok", (name, scenarios[name]["reason"])
        assert scenarios[name]["rows"], name
    measured = [item for item in document["comparisons"] if item["advantage"] is not None]
    assert {item["scenario"] for item in measured} >= ALWAYS_RUN
    assert document["meta"]["machine"]["cpus"] >= 1 and document["meta"]["machine"]["python"]


def test_bench_outside_a_checkout_says_where_to_run_it(tmp_path):
    result = bench("--quick", cwd=str(tmp_path), timeout=60)
    assert result.returncode != 0
    assert "checkout" in result.stderr


def test_bench_rejects_an_unknown_scenario_before_running_anything(root):
    result = bench("--only", "pool", "--only", "nosuch", cwd=root, timeout=60)
    assert result.returncode != 0
    assert "unknown scenario nosuch" in result.stderr and "gunicorn" in result.stderr


@pytest.mark.timeout(300)
def test_the_fd_budget_script_measures_a_worker_and_checks_a_client_against_the_formula(root):
    result = subprocess.run([sys.executable, "benchmarks/fd_budget.py", "--connections", "50", "--rounds", "1",
                             "--workers", "2", "--pool-size", "2"], cwd=root, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "standalone: 50 idle connections, 1 rounds: RSS KB per connection" in result.stdout
    assert "descriptors per connection [1.0]" in result.stdout, result.stdout
    assert "the formula's most: (2, 4)" in result.stdout


@pytest.mark.timeout(120)
def test_the_fd_budget_shortage_replays_issue_23s_fault_and_the_worker_says_so(root):
    result = subprocess.run([sys.executable, "benchmarks/fd_budget.py", "--shortage"], cwd=root, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "the worker's ERROR lines: 0" not in result.stdout and "fd_exhausted 0" not in result.stdout, result.stdout
    assert "RLIMIT_NOFILE soft 64, hard 64" in result.stdout, result.stdout
