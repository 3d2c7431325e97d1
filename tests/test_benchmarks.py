"""The benchmark scripts run and print every figure they promise (no timing is asserted here:
speed is measured by the benchmarks themselves, never by tests)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_explore_bench_prints_the_rate_the_breakdown_and_the_model_cap():
    scenario = ROOT / "spec" / "scenarios" / "clean" / "vllm-decode-two-handoffs-roomy.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "explore_bench.py"), "--repeat", "1",
                           "--breakdown", "--model-cap", str(scenario)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the scenario's row: 29 states and 80 transitions (the figures of its exhaustive exploration)
    row = next(line for line in lines if line.startswith("vllm-decode-two-handoffs-roomy"))
    assert row.split()[1:3] == ["29", "80"]
    assert any("model: pass" in line for line in lines)
    cap = [line for line in lines if "model transitions alone" in line]
    # every transition of the exploration is re-timed: 80 calls, one per (core, action) fired
    assert len(cap) == 1 and re.search(r"alone: 80 calls in [0-9.]+s, [0-9.]+ us/call: at most [0-9,]+ states/s",
                                       cap[0]), cap


def test_explore_bench_refuses_a_bad_scenario_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "explore_bench.py"), str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout.count("\n") <= 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
