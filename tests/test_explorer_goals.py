"""Reachability goals ("sometimes", spec/model-checking.md MC-34; scenario field SCN-10).

The expected witness lengths are derived by hand in the comments: a destination needs its
``reserve`` and ``activate`` (or a ``cancel_destination`` to leave), and a vLLM decode pass emits at
most one token per running request.
"""

from __future__ import annotations

import copy
import json

import pytest

from explorer import explore
from explorer.goals import phase_matches
from explorer.outputs import step_names, summary
from explorer.replay import reproduce
from explorer.scenario import ScenarioError, scenario_from_dict
from mocker_spec.cli import main

BASE = {
    "name": "goals",
    "engine": {"engine_type": "vllm", "worker_type": "decode", "block_size": 16, "num_gpu_blocks": 8},
    "requests": [
        {"id": "A", "role": "destination", "handoff": "hA", "prompt_len": 16, "max_output_tokens": 2},
        {"id": "B", "role": "destination", "handoff": "hB", "prompt_len": 32, "max_output_tokens": 2},
    ],
    "adversarial": {"cancel": True},
    "sometimes": [
        {"name": "A reserved", "phases": {"A": "D_reserved"}},
        {"name": "both finished", "phases": {"A": "D_absent", "B": "D_absent"}, "cooperative_only": True},
        {"name": "both gone", "phases": {"A": "D_absent", "B": "D_absent"}},
        {"name": "A active and drained", "phases": {"A": "D_active"}, "drained": True},
    ],
}


@pytest.fixture(scope="module")
def goals_exp():
    return explore(scenario_from_dict(BASE))


def _result(exp, name):
    (r,) = [r for r in exp.goals if r.goal.name == name]
    return r


def test_witnesses_are_shortest_and_replay(goals_exp):
    exp = goals_exp
    # one step: reserve(hA,A) accepts A into a reservation on a roomy pool
    assert step_names(exp, _result(exp, "A reserved").witness) == ["reserve(hA,A)"]
    # cooperatively, each destination needs reserve + activate (4 steps) and then two passes,
    # one per output token (max_output_tokens 2); the 8-block pool holds both, so 6 steps
    fin = _result(exp, "both finished").witness
    assert fin.length == 6 and step_names(exp, fin).count("pass") == 2
    assert all(exp.scenario.action(s).cooperative for s in step_names(exp, fin))
    # by any action, reserve + cancel each: 4 steps, shorter than finishing
    gone = step_names(exp, _result(exp, "both gone").witness)
    assert len(gone) == 4 and sorted(gone)[:2] == ["cancel_destination(hA)", "cancel_destination(hB)"]
    for name in ("A reserved", "both finished", "both gone"):
        r = _result(exp, name)
        rep = reproduce(exp.scenario, step_names(exp, r.witness), "sometimes", name)
        assert r.reached is True and rep.reproduced, rep.message


def test_a_wrong_witness_does_not_reproduce(goals_exp):
    steps = step_names(goals_exp, _result(goals_exp, "both finished").witness)
    # one pass short: both are still running with one token to go
    assert not reproduce(goals_exp.scenario, steps[:-1], "sometimes", "both finished").reproduced
    # the cancels reach "both gone" but not cooperatively
    gone = step_names(goals_exp, _result(goals_exp, "both gone").witness)
    rep = reproduce(scenario_from_dict({**BASE, "sometimes": [dict(BASE["sometimes"][2], cooperative_only=True)]}),
                    gone, "sometimes", "both gone")
    assert not rep.reproduced and "adversarial" in rep.message


def test_a_goal_no_state_reaches_is_a_violation(goals_exp, tmp_path, capsys):
    # an active destination holds blocks or a queue entry, so its core is never drained
    r = _result(goals_exp, "A active and drained")
    assert r.reached is False and r.witness is None
    (v,) = [v for v in goals_exp.violations if v.kind == "unreachable_goal"]
    assert v.name == "A active and drained" and v.length == 0
    assert v.node == 0  # no steps: the report stands on the initial state, not on some other one
    assert "no state reachable has A at D_active, a drained core" in v.message
    assert reproduce(goals_exp.scenario, [], "unreachable_goal", "A active and drained").reproduced
    assert not reproduce(goals_exp.scenario, [], "unreachable_goal", "A reserved").reproduced
    path = tmp_path / "goals.json"
    path.write_text(json.dumps(BASE))
    out = tmp_path / "out"
    assert main(["explore", str(path), "--no-progress", "--out", str(out), "--format", "itf"]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    assert "sometimes both finished: reached in 6 step(s): reserve(hA,A)," in printed
    assert "sometimes A active and drained: never" in printed
    s = json.loads((out / "summary.json").read_text())
    assert [g["reached"] for g in s["sometimes"]] == [True, True, True, False]
    assert {"sometimes-a_reserved.txt", "sometimes-both_finished.itf.json", "test_witness_goals_both_gone.py",
            "unreachable_goal-a_active_and_drained.txt"} <= {p.name for p in out.iterdir()}


def test_generated_witness_tests_pass(goals_exp, tmp_path):
    """MC-46 for witnesses: the generated module replays its witness and passes."""
    from explorer.outputs import pytest_source

    w = _result(goals_exp, "both finished").witness
    src = pytest_source(goals_exp, w)
    assert "Witness replay" in src and "def test_goals_sometimes_both_finished_replays" in src
    ns: dict = {}
    exec(compile(src, "witness.py", "exec"), ns)
    ns["test_goals_sometimes_both_finished_replays"]()


def test_symmetry_keeps_concrete_goals():
    """MC-34: with symmetry on, goals are evaluated on the unreduced graph, so a goal naming B (which
    the reduction may fold onto A) gets the same answer and witness length as without symmetry."""
    raw = copy.deepcopy(BASE)
    raw["requests"][1]["prompt_len"] = 16  # A and B interchangeable
    raw["sometimes"] = [{"name": "B running", "phases": {"B": "D_active(running)"}, "cooperative_only": True}]
    plain = explore(scenario_from_dict(raw), symmetry=False)
    sym = explore(scenario_from_dict(raw), symmetry=True)
    assert sym.symmetry is not None and sym.num_states < plain.num_states
    a, b = plain.goals[0], sym.goals[0]
    # reserve(hB,B), activate(hB), pass: B is admitted and decodes its first token
    assert a.reached and b.reached and a.witness.length == b.witness.length == 3
    names = step_names(sym, b.witness)
    assert reproduce(sym.scenario, names, "sometimes", "B running").reproduced


def test_incomplete_exploration_leaves_a_goal_unknown():
    raw = dict(BASE, sometimes=[{"name": "both finished", "phases": {"A": "D_absent", "B": "D_absent"},
                                 "cooperative_only": True}])
    exp = explore(scenario_from_dict(raw), max_states=5)
    assert not exp.complete and exp.goals[0].reached is None
    assert not [v for v in exp.violations if v.kind == "unreachable_goal"]
    assert summary(exp)["sometimes"][0]["reached"] is None


def test_phase_matching():
    assert phase_matches("D_active", "D_active(running)")
    assert phase_matches("D_pending", "D_pending(tried)")
    assert phase_matches("waiting", "waiting(fresh)")
    assert not phase_matches("D_active(waiting)", "D_active(waiting(fresh))")
    assert not phase_matches("D_pending(tried)", "D_pending")
    assert not phase_matches("S_held", "S_absent")


@pytest.mark.parametrize("goal, field", [
    ({"name": "g", "phases": {"Z": "D_absent"}}, "sometimes[0].phases names unknown request 'Z'"),
    ({"name": "g", "phases": {"A": "done"}}, "sometimes[0].phases.A must be one of"),
    ({"name": "g"}, "sometimes[0] needs a condition"),
    ({"name": "", "drained": True}, "sometimes[0].name"),
    ({"name": "g", "drained": "yes"}, "sometimes[0].drained must be true or false"),
    ({"name": "g", "drained": True, "when": 1}, "sometimes[0]"),
    ({"name": "g", "drained": True, "cooperative_only": 1}, "sometimes[0].cooperative_only"),
])
def test_bad_goals_are_refused_naming_the_field(goal, field, tmp_path, capsys):
    raw = dict(BASE, sometimes=[goal])
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(raw)
    assert field in str(err.value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    assert main(["explore", str(path), "--no-progress"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and field in err_lines[0]


def test_duplicate_goal_names_are_refused():
    raw = dict(BASE, sometimes=[{"name": "g", "drained": True}, {"name": "g", "drained": False}])
    with pytest.raises(ScenarioError, match="sometimes\\[1\\]: duplicate goal name 'g'"):
        scenario_from_dict(raw)


# ---------------------------------------------------------------------------------------------
# eventually goals (MC-35, SCN-11)
# ---------------------------------------------------------------------------------------------

LIB = __import__("pathlib").Path(__file__).resolve().parent.parent / "spec" / "scenarios"
FINISHED = {"destination": "D_absent", "source": "S_absent", "plain": "done"}


@pytest.mark.parametrize("defect", ["s13-vllm-slot-gate-starvation", "s9-sglang-no-headroom-starvation"])
def test_eventually_all_finish_agrees_with_starvation(defect):
    """MC-35 against MC-32: on the known starvations, "every request eventually finishes" is
    avoidable with the very lasso the starvation check reports, and the lasso reproduces."""
    raw = json.loads((LIB / "known-defects" / f"{defect}.json").read_text())
    raw["eventually"] = [{"name": "all finish",
                          "phases": {r["id"]: FINISHED[r.get("role", "plain")] for r in raw["requests"]}}]
    exp = explore(scenario_from_dict(raw))
    starv = exp.violation("starvation")
    (avoid,) = [v for v in exp.violations if v.kind == "avoidable_goal"]
    assert exp.eventually[0].reached is False
    assert step_names(exp, avoid) == step_names(exp, starv) and avoid.loop_index == starv.loop_index
    assert reproduce(exp.scenario, step_names(exp, avoid), "avoidable_goal", "all finish", avoid.loop_index).reproduced
    # the same lasso does not show that a goal its loop state already has is avoidable
    raw["eventually"].append({"name": "B issued", "phases": {raw["requests"][1]["id"]: "D_reserved"}})
    sc = scenario_from_dict(raw)
    rep = reproduce(sc, step_names(exp, avoid), "avoidable_goal", "B issued", avoid.loop_index)
    assert not rep.reproduced and "already has" in rep.message


def test_eventually_on_the_library_and_its_edges():
    # roomy pool, no adversary: every fair run finishes both (the clean library's own goal)
    roomy = explore(scenario_from_dict(json.loads((LIB / "clean" / "vllm-decode-two-handoffs-roomy.json").read_text())))
    assert [r.reached for r in roomy.eventually] == [True] and roomy.clean
    # a goal true at the empty core holds trivially
    raw = dict(BASE, sometimes=[], eventually=[{"name": "drained", "drained": True}])
    assert explore(scenario_from_dict(raw)).eventually[0].reached is True
    # with cancels, A can be cancelled before it ever runs; once reserve(hA,A) has fired the driver
    # never issues it again, so A never becomes active: avoidable, through the adversary's cancel
    raw = dict(BASE, sometimes=[], eventually=[{"name": "A ran", "phases": {"A": "D_active"}}])
    exp = explore(scenario_from_dict(raw))
    (v,) = [v for v in exp.violations if v.kind == "avoidable_goal"]
    steps = step_names(exp, v)
    assert "cancel_destination(hA)" in steps[:v.loop_index] and "activate(hA)" not in steps
    assert reproduce(exp.scenario, steps, "avoidable_goal", "A ran", v.loop_index).reproduced
    # an incomplete exploration leaves it unknown and reports nothing
    part = explore(scenario_from_dict(raw), max_states=4)
    assert part.eventually[0].reached is None and not [v for v in part.violations if v.kind == "avoidable_goal"]
    assert summary(part)["eventually"][0]["holds"] is None


def test_eventually_refuses_cooperative_only():
    raw = dict(BASE, eventually=[{"name": "g", "drained": True, "cooperative_only": True}])
    with pytest.raises(ScenarioError, match=r"eventually\[0\]: unknown field\(s\) \['cooperative_only'\]"):
        scenario_from_dict(raw)


def _campaign():
    from script_loader import load_script

    return load_script("scenario_campaign")


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _coop_distances(exp):
    """Distances from the initial node over cooperative transitions, by a plain BFS over the
    explored edges (independent of explorer.goals)."""
    dist = {0: 0}
    layer = [0]
    succ: dict = {}
    for e in exp.edges:
        if e.dst >= 0 and exp.scenario.actions[e.action].cooperative:
            succ.setdefault(e.src, []).append(e.dst)
    while layer:
        nxt = []
        for n in layer:
            for d in succ.get(n, ()):
                if d not in dist:
                    dist[d] = dist[n] + 1
                    nxt.append(d)
        layer = nxt
    return dist


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, 100_000))
def test_goals_on_random_scenarios_replay_independently(index):
    """MC-34 / MC-35 on random small scenarios: a goal is reached exactly when some explored node
    has it (over cooperative transitions for a cooperative goal), every witness replays without the
    graph (MC-46), it is as short as the shallowest such node (BFS depth from the search, or a
    plain BFS over the cooperative edges, not the goal code's), and every avoidable_goal lasso
    replays."""
    raw = _campaign().random_scenario(7, index, 3000)
    fin = {r["id"]: FINISHED[r.get("role", "plain")] for r in raw["requests"]}
    raw["sometimes"] = ([{"name": f"{rid} finishes", "phases": {rid: ph}} for rid, ph in fin.items()]
                        + [{"name": f"{rid} finishes cooperatively", "phases": {rid: ph}, "cooperative_only": True}
                           for rid, ph in fin.items()])
    raw["eventually"] = [{"name": "all finish", "phases": fin}]
    exp = explore(scenario_from_dict(raw))
    if not exp.complete:
        assert all(r.reached in (True, None) for r in exp.goals)
        return
    from explorer.goals import holds

    by_name = {r.goal.name: r for r in exp.goals}
    coop = _coop_distances(exp)
    for r in exp.goals:
        sat = [n for n in range(exp.num_states) if holds(r.goal, exp.views[n], exp.drained[n])]
        depth = [exp.depth[n] for n in sat] if not r.goal.cooperative_only else [coop[n] for n in sat if n in coop]
        assert r.reached is bool(depth)
        if not r.reached:
            continue
        names = step_names(exp, r.witness)
        rep = reproduce(exp.scenario, names, "sometimes", r.goal.name)
        assert rep.reproduced, rep.message
        assert r.witness.length == min(depth)
        if r.goal.cooperative_only:
            assert r.witness.length >= by_name[r.goal.name.replace(" cooperatively", "")].witness.length
    for v in exp.violations:
        if v.kind == "avoidable_goal":
            rep = reproduce(exp.scenario, step_names(exp, v), "avoidable_goal", v.name, v.loop_index)
            assert rep.reproduced, rep.message


def test_never_goals_report_the_shortest_path_to_a_forbidden_state(tmp_path, capsys):
    """MC-36 / SCN-12: a forbidden state reached is a violation with a shortest path that
    reproduces; one no path reaches is silent; one found in an incomplete exploration still counts."""
    raw = dict(BASE, sometimes=[], never=[
        # reserve(hA,A), activate(hA), reserve(hB,B), activate(hB), pass: both admitted together
        {"name": "both running", "phases": {"A": "D_active(running)", "B": "D_active(running)"}},
        # a pending destination needs a pool too small for its reservation; 8 blocks hold both
        {"name": "A pending", "phases": {"A": "D_pending"}},
    ])
    exp = explore(scenario_from_dict(raw))
    (v,) = [v for v in exp.violations if v.kind == "forbidden_state"]
    assert v.name == "both running" and v.length == 5
    assert "a reachable state has A at D_active(running), B at D_active(running)" == v.message
    assert reproduce(exp.scenario, step_names(exp, v), "forbidden_state", "both running").reproduced
    assert not reproduce(exp.scenario, step_names(exp, v)[:-1], "forbidden_state", "both running").reproduced
    part = explore(scenario_from_dict(raw), max_states=40)
    assert not part.complete and [v.name for v in part.violations if v.kind == "forbidden_state"] == ["both running"]
    with pytest.raises(ScenarioError, match=r"never\[0\]: unknown field\(s\) \['cooperative_only'\]"):
        scenario_from_dict(dict(BASE, never=[{"name": "g", "drained": True, "cooperative_only": False}]))
    path = tmp_path / "never.json"
    path.write_text(json.dumps(raw))
    assert main(["explore", str(path), "--no-progress", "--out", str(tmp_path / "o")]) == 1
    assert (tmp_path / "o" / "forbidden_state-both_running.txt").exists()
    capsys.readouterr()


def test_symmetry_report_names_the_unreduced_run_only_when_there_is_one(tmp_path, capsys):
    """MC-25 / MC-34 in the report: with liveness off and no goals, no unreduced run happens and
    the symmetry line says nothing of one; with a goal, it names the run the goal was judged on."""
    raw = copy.deepcopy(BASE)
    raw["requests"][1]["prompt_len"] = 16
    raw.update(sometimes=[], symmetry=True, checks={"deadlock": False, "livelock": False, "starvation": False})
    path = tmp_path / "sym.json"
    path.write_text(json.dumps(raw))
    assert main(["explore", str(path), "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(safety checks on the reduced graph)" in out and "None" not in out
    raw["sometimes"] = [{"name": "B runs", "phases": {"B": "D_active(running)"}}]
    path.write_text(json.dumps(raw))
    assert main(["explore", str(path), "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    full = explore(scenario_from_dict(raw), symmetry=False).num_states
    assert f"liveness and goals on the unreduced graph of {full} states" in out


def test_goal_names_are_printed_as_written(tmp_path, capsys):
    """A goal name that looks like console markup is printed verbatim, not interpreted."""
    raw = dict(BASE, sometimes=[{"name": "[red]A[/] pending", "phases": {"A": "D_pending"}}],
               eventually=[{"name": "[bold]A[/] ran", "phases": {"A": "D_active"}}])
    path = tmp_path / "markup.json"
    path.write_text(json.dumps(raw))
    assert main(["explore", str(path), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "sometimes [red]A[/] pending: never" in out and "eventually [bold]A[/] ran: avoidable" in out


def test_witness_itf_traces_parse_with_itf_py(goals_exp):
    """MC-44 for witnesses: each is a finite ITF trace whose last state has the goal's phases."""
    itf = pytest.importorskip("itf_py")
    from explorer.outputs import itf_trace

    for r in goals_exp.goals:
        if r.witness is None:
            continue
        trace = itf.trace_from_json(json.loads(json.dumps(itf_trace(goals_exp, r.witness))))
        assert len(trace.states) == r.witness.length + 1 and trace.loop is None
        last = trace.states[-1].values["phases"]
        handoff = {"A": "hA", "B": "hB"}
        for _i, rid, want in r.goal.phases:
            assert phase_matches(want, getattr(last, handoff[rid]))  # ITF records decode to Rec
