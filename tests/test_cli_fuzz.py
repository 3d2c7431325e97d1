"""Mutated input files never crash the CLI: every run of a scenario or a trace with one field
changed (a wrong type, a bad number, markup-like text, a key removed or added) ends with exit
status 0, 1, 2 or 3 (a replay also 4, its livelock diagnosis, LIVE-3), never a traceback; exit 2
prints exactly one line on standard error and writes no output (README "Bad input",
mocker_spec/messages.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker_spec.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "spec" / "scenarios").rglob("*.json"))
#: the golden cases, less the one whose replay runs LIVE-4's whole budget of 200 000 steps by design
CASES = sorted(p for p in (ROOT / "tests" / "goldens" / "refcases").iterdir()
               if (p / "case.json").exists() and p.name != "zero-output-sglang-far-arrival")

ODD = ["[/x]", "[b]", "a\nb", "", "x", "1", None, True, False, 0, -1, 1, 1.5, -0.5, 2**70, -(2**70), 1e308,
       [], [1], {}, {"a": 1}]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _mutate(doc, pick: int, op: int, value):
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    path = paths[pick % len(paths)]
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if op == 0 or not isinstance(parent, dict):
        parent[path[-1]] = value
    elif op == 1:
        del parent[path[-1]]
    else:
        parent["unknown_field"] = value
    return doc


def _check_run(argv, capsys, outputs, allowed=(0, 1, 2, 3)):
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc in allowed, (rc, cap.err)
    assert "Traceback" not in cap.err
    if rc == 2:
        lines = [line for line in cap.err.splitlines() if line.strip()]
        assert len(lines) == 1, cap.err
        for out in outputs:
            assert not out.exists() or (out.is_dir() and not any(out.iterdir())), out
    return rc


MUTATION = st.tuples(st.integers(0, 10_000), st.integers(0, 2), st.sampled_from(ODD))
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(scenario=st.sampled_from(SCENARIOS), mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_scenarios_never_crash_explore(tmp_path_factory, capsys, scenario, mutations):
    doc = json.loads(scenario.read_text())
    for pick, op, value in mutations:
        doc = _mutate(doc, pick, op, value)
    tmp = tmp_path_factory.mktemp("fuzz")
    sc = tmp / "scenario.json"
    sc.write_text(json.dumps(doc))
    out = tmp / "out"
    _check_run(["explore", str(sc), "--max-states", "60", "--no-progress", "--out", str(out)], capsys, [out])


@SETTINGS
@given(case=st.sampled_from(CASES), row=st.integers(0, 5), target=st.sampled_from(["row", "engine"]),
       mutation=MUTATION)
def test_mutated_traces_and_engine_args_never_crash_replay(tmp_path_factory, capsys, case, row, target, mutation):
    spec = json.loads((case / "case.json").read_text())
    engine = spec.get("engine_args") or spec.get("prefill_engine_args")
    rows = [json.loads(line) for line in (case / "trace.jsonl").read_text().splitlines() if line.strip()][:6]
    if target == "row":
        rows[row % len(rows)] = _mutate(rows[row % len(rows)], *mutation)
    else:
        engine = _mutate(engine, *mutation)
    tmp = tmp_path_factory.mktemp("fuzz")
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report, summ = tmp / "report.jsonl", tmp / "summary.json"
    _check_run(["replay", str(trace), "--extra-engine-args", json.dumps(engine), "--report-jsonl", str(report),
                "--summary-json", str(summ), "--no-progress"], capsys, [report, summ], allowed=(0, 1, 2, 3, 4))
