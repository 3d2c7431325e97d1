"""Explorer outputs, CLI and scenario files (spec/model-checking.md MC-40..MC-50, spec/scenarios.md).

Exports load back with the same node and edge counts; ITF traces parse with itf-py; generated
pytest modules replay their counterexample; the CLI exits 0 / 1 / 2; scenario files are
validated (SCN-1..SCN-9) and agree with the JSON Schema.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import networkx as nx
import pytest

from explorer import ScenarioError, explore, load_scenario, scenario_from_dict
from explorer import graphs, outputs
from mocker_spec.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIB = ROOT / "spec" / "scenarios"
S7 = LIB / "known-defects" / "s7-vllm-zero-time-livelock.json"
S6 = LIB / "known-defects" / "s6-vllm-activated-fifo-deadlock.json"


@pytest.fixture(scope="module")
def s6():
    return explore(load_scenario(S6))


def test_graph_exports_load_back_with_the_same_counts(s6, tmp_path):
    """MC-42: GraphML and node-link JSON load back through networkx; DOT through graphviz if installed."""
    g = graphs.to_networkx(s6)
    n, m = g.number_of_nodes(), g.number_of_edges()
    assert n == s6.num_states and m == sum(1 for e in s6.edges if e.dst >= 0)
    graphs.write_graphml(g, tmp_path / "g.graphml")
    back = nx.read_graphml(tmp_path / "g.graphml", force_multigraph=True)
    assert (back.number_of_nodes(), back.number_of_edges()) == (n, m)
    data = json.loads(json.dumps(graphs.to_node_link(g)))
    back = graphs.from_node_link(data)
    assert (back.number_of_nodes(), back.number_of_edges()) == (n, m)
    mermaid = graphs.to_mermaid(g)
    assert mermaid.count("-->") + mermaid.count("-.->") == m
    dot = graphs.to_dot(g)
    assert dot.count(" -> ") == m
    if shutil.which("dot") is None:
        pytest.skip("graphviz is not installed")
    (tmp_path / "g.dot").write_text(dot)
    out = subprocess.run(["dot", "-Tjson", str(tmp_path / "g.dot")], capture_output=True, text=True, check=True)
    parsed = json.loads(out.stdout)
    assert len(parsed.get("objects", [])) == n and len(parsed.get("edges", [])) == m
    subprocess.run(["dot", "-Tsvg", "-o", str(tmp_path / "g.svg"), str(tmp_path / "g.dot")], check=True)


def test_dot_labels_are_tlc_like(s6):
    """MC-42: node labels are ``/\\ var = value`` lines; the initial state is filled."""
    dot = graphs.to_dot(graphs.to_networkx(s6))
    assert '/\\\\ waiting = <<' in dot and "style=filled" in dot


def test_quotient_derives_the_destination_lifecycle(s6):
    """MC-45: projecting on one handoff gives the spec's destination state machine (§6.2)."""
    q = graphs.quotient(s6, "hY")
    assert {"D_unissued", "D_reserved", "D_active(waiting)", "D_absent"} <= set(q.nodes)
    labels = {(u, v, d["label"]) for u, v, d in q.edges(data=True)}
    assert ("D_unissued", "D_reserved", "reserve") in labels
    assert ("D_reserved", "D_active(waiting)", "activate") in labels
    # a reservation never goes back to pending, and nothing leaves D_absent without an adversary
    assert not any(u == "D_reserved" and v.startswith("D_pending") for u, v, _ in labels)
    assert not any(u == "D_absent" for u, v, _ in labels)
    assert q.nodes["D_unissued"]["initial"]
    assert "stateDiagram-v2" in graphs.to_mermaid(q, state_diagram=True)
    # the counts partition the explored graph: every state lies in one phase, and with projected
    # self-loops kept every transition that has a successor lies on one edge
    assert sum(d["states"] for _n, d in q.nodes(data=True)) == s6.num_states
    full = graphs.quotient(s6, "hY", self_loops=True)
    assert sum(d["count"] for _u, _v, d in full.edges(data=True)) == sum(1 for e in s6.edges if e.dst >= 0)
    phase = {n: s6.views[n][0][graphs.handoff_keys(s6).index("hY")][1] for n in range(s6.num_states)}
    moved = sum(1 for e in s6.edges if e.dst >= 0 and phase[e.src] != phase[e.dst])
    assert sum(d["count"] for _u, _v, d in q.edges(data=True)) == moved


def test_itf_traces_parse_with_itf_py(s6):
    """MC-44: every counterexample is a valid ITF trace; lassos carry ``loop``."""
    itf = pytest.importorskip("itf_py")
    for v in s6.violations:
        data = json.loads(json.dumps(outputs.itf_trace(s6, v)))
        trace = itf.trace_from_json(data)
        assert len(trace.states) == v.length + 1
        assert trace.loop == v.loop_index
        assert trace.states[0].values["action"] == "init"


def test_generated_pytest_replays_the_counterexample(s6, tmp_path):
    """MC-46: the generated test module passes, and fails when its steps are cut short."""
    for v in s6.violations:
        src = outputs.pytest_source(s6, v)
        ns: dict = {}
        exec(compile(src, f"cex_{v.kind}.py", "exec"), ns)
        tests = [f for k, f in ns.items() if k.startswith("test_")]
        assert len(tests) == 1
        tests[0]()
        broken = src.replace("LOOP = ", "STEPS = STEPS[:1]\nLOOP = ")
        ns = {}
        exec(compile(broken, "broken.py", "exec"), ns)
        with pytest.raises(AssertionError):
            [f for k, f in ns.items() if k.startswith("test_")][0]()


def test_cli_exit_codes_and_outputs(tmp_path, capsys):
    """MC-50: exit 1 with a violation (files written), 0 when clean, 2 for a bad scenario."""
    out = tmp_path / "out"
    assert main(["explore", str(S7), "--out", str(out), "--no-progress"]) == 1
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "livelock.txt", "livelock.itf.json", "states.dot", "states.graphml", "states.json",
            "states.mmd", "quotient-hx.dot", "quotient-hy.mmd"} <= names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and any(v["kind"] == "livelock" and v["steps"] <= 6 for v in summary["violations"])
    assert main(["explore", str(LIB / "clean" / "vllm-decode-two-handoffs-roomy.json"), "--no-progress",
                 "--out", str(tmp_path / "c"), "--format", "json"]) == 0
    assert not (tmp_path / "c" / "states.dot").exists() and (tmp_path / "c" / "states.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "engine": {"num_gpu_blocks": 0}}')
    assert main(["explore", str(bad), "--no-progress"]) == 2
    assert main(["explore", str(tmp_path / "missing.json"), "--no-progress"]) == 2
    assert main(["explore", str(S7), "--no-progress", "--format", "png"]) == 2
    capsys.readouterr()
    assert main(["explore", str(S7), "--no-progress", "--max-states", "3"]) == 0
    # a bounded search does not claim the scenario clean, only the states it reached (MC-40)
    printed = " ".join(capsys.readouterr().out.split())
    assert "no violation in the 3 states reached (exploration stopped by max_states" in printed


def test_deadlock_report_and_summary_carry_the_dead_end_diagnosis(tmp_path, capsys):
    """MC-48: the S6 fresh-head deadlock ends in the state LIVE-6 calls a blocked head before an
    activated destination; the report prints it under the steps and summary.json records it.
    Violations of other kinds get no cause (S7's livelock)."""
    out = tmp_path / "out"
    assert main(["explore", str(LIB / "known-defects" / "s6-vllm-fresh-head-deadlock.json"), "--out", str(out),
                 "--no-progress"]) == 1
    printed = capsys.readouterr().out
    assert "  why (blocked_head_before_activated_destination): the head F " in printed
    dead = [v for v in json.loads((out / "summary.json").read_text())["violations"] if v["kind"] == "deadlock"]
    assert dead and dead[0]["cause"] == "blocked_head_before_activated_destination"
    s7 = outputs.summary(explore(load_scenario(S7)))
    assert s7["violations"] and all("cause" not in v for v in s7["violations"])


def _set_tokens(request, tokens):
    """The request's prompt given as explicit tokens instead of a length."""
    request.pop("prompt_len")
    request["tokens"] = tokens


@pytest.mark.parametrize("mutate,fragment", [
    (lambda d: d.pop("engine"), "engine"),
    (lambda d: d.update(extra=1), "unknown field"),
    (lambda d: d["requests"][0].update(role="both"), "role"),
    (lambda d: d["requests"][0].pop("handoff"), "handoff"),
    (lambda d: d["requests"][0].update(tokens=[1]), "exactly one"),
    (lambda d: d["requests"].append(dict(d["requests"][0])), "duplicate"),
    (lambda d: d.update(actions=[{"kind": "teleport"}]), "kind"),
    (lambda d: d.update(actions=[{"kind": "activate"}]), "handoff id"),
    (lambda d: d.update(checks={"safety": True}), "unknown field"),
    (lambda d: d.update(expect={"verdict": "violation"}), "kind"),
    (lambda d: d.update(expect={"verdict": "maybe"}), "expect.verdict"),
    (lambda d: d.update(expect={"verdict": "violation", "kind": "oops"}), "expect.kind"),
    (lambda d: d.update(expect={"verdict": "violation", "kind": "livelock", "max_steps": -1}), "expect.max_steps"),
    (lambda d: d.update(expect={"verdict": "violation", "kind": "livelock", "max_steps": "6"}), "expect.max_steps"),
    (lambda d: d.update(expect={"verdict": "violation", "kind": "livelock", "defect": 7}), "expect.defect"),
    (lambda d: d.update(expect=[]), "scenario.expect"),
    (lambda d: d.update(now_ms=-1), "now_ms"),
    # JSON true is not an integer (the schema's "integer"), although Python's bool is an int
    (lambda d: d.update(expect={"verdict": "violation", "kind": "livelock", "max_steps": True}), "expect.max_steps"),
    (lambda d: d.update(bounds={"max_states": 10, "max_depth": True}), "max_depth"),
    (lambda d: d["requests"][0].update(max_output_tokens=True), "max_output_tokens"),
    (lambda d: _set_tokens(d["requests"][0], [1, True]), "u32 integers"),
    (lambda d: d.update(actions=[{"kind": "submit", "request": {"id": "Q", "prompt_len": 4,
                                                                 "max_output_tokens": False}}]), "max_output_tokens"),
    (lambda d: d.update(description=5), "description"),
    (lambda d: d.update(bounds={"max_states": 0}), "max_states"),
    (lambda d: d["requests"][0].update(max_output_tokens=-1), "max_output_tokens"),
    (lambda d: d["requests"][0].update(max_output_tokens="2"), "max_output_tokens"),
    (lambda d: d.update(actions=[{"kind": "submit", "request": {"id": "", "prompt_len": 4}}]), "request.id"),
    (lambda d: d.update(actions=[{"kind": "submit", "request": {"id": 7, "prompt_len": 4}}]), "request.id"),
])
def test_invalid_scenarios_are_rejected(mutate, fragment):
    """SCN-1..SCN-9: every malformed scenario raises ScenarioError naming the problem."""
    data = json.loads(S7.read_text())
    mutate(data)
    with pytest.raises(ScenarioError, match=fragment):
        scenario_from_dict(data)


def test_toml_scenarios_load_like_json(tmp_path):
    """SCN-1: a TOML file decodes to the same scenario as its JSON twin."""
    pytest.importorskip("tomllib")
    toml = tmp_path / "s7.toml"
    toml.write_text(
        'name = "s7-vllm-zero-time-livelock"\n'
        '[engine]\nengine_type = "vllm"\nworker_type = "decode"\nblock_size = 16\nnum_gpu_blocks = 3\n'
        '[[requests]]\nid = "X"\nrole = "destination"\nhandoff = "hX"\nprompt_len = 32\nmax_output_tokens = 2\n'
        '[[requests]]\nid = "Y"\nrole = "destination"\nhandoff = "hY"\nprompt_len = 16\nmax_output_tokens = 2\n'
        '[expect]\nverdict = "violation"\nkind = "livelock"\nmax_steps = 6\ndefect = "S7"\n')
    a, b = load_scenario(toml), load_scenario(S7)
    assert a.actions == b.actions and a.requests == b.requests and a.args == b.args


def test_segments_share_prefixes_and_prompt_len_does_not():
    """SCN-3: equal segment names give equal tokens; ``prompt_len`` tokens are private."""
    sc = load_scenario(LIB / "clean" / "vllm-prefill-three-sources.json")
    a, b, c = sc.requests
    assert a.tokens[:16] == b.tokens[:16] and a.tokens[16:] != b.tokens[16:]
    assert not set(c.tokens) & (set(a.tokens) | set(b.tokens))


def test_library_matches_the_json_schema():
    """SCN-1: every library scenario validates against spec/scenario.schema.json."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "spec" / "scenario.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    files = sorted(LIB.rglob("*.json"))
    assert files
    for path in files:
        jsonschema.validate(json.loads(path.read_text()), schema)
        load_scenario(path)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "engine": {}, "bogus": 1}, schema)


def test_cli_depth_bound_and_stop_at_first(capsys):
    """MC-50: --max-depth bounds the search (and is refused below 1, naming the flag); --stop-at-first
    ends it at the first safety violation, a shortest one, with fewer states than the full search."""
    s1 = LIB / "known-defects" / "s1-fifo-tombstone-revival.json"
    assert main(["explore", str(s1), "--no-progress", "--max-depth", "0"]) == 2
    assert "--max-depth=0: must be at least 1" in capsys.readouterr().err
    assert main(["explore", str(LIB / "clean" / "vllm-mixed-three-handoffs.json"), "--no-progress",
                 "--max-depth", "3"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "depth 3, incomplete (max_depth)" in printed and "stopped by max_depth" in printed
    full = explore(load_scenario(s1))
    assert main(["explore", str(s1), "--no-progress", "--stop-at-first"]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    liveness = ("deadlock", "livelock", "starvation", "unreachable_goal", "avoidable_goal")
    first = min((v for v in full.violations if v.kind not in liveness), key=lambda v: v.length)
    assert "incomplete (stop)" in printed and f"shortest counterexample, {first.length} step(s)" in printed
    states = int(printed.split(": ", 1)[1].split(" states")[0])
    assert states < full.num_states
