"""Reports and files of an exploration (spec/model-checking.md MC-40..MC-47).

Pure builders (:func:`summary`, :func:`steps_text`, :func:`itf_trace`,
:func:`pytest_source`) and the writers that put them on disk
(:func:`write_outputs`) or on a console (:func:`print_report`).
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Dict, List, Tuple

from . import graphs
from .files import Content, publish
from .search import Exploration, Violation, graph_of


def summary(exp: Exploration) -> Dict[str, Any]:
    """MC-40: states, transitions, depth, rate, memory, per-action coverage and violations."""
    sc = exp.scenario
    cov = {}
    for a, c in zip(sc.actions, exp.coverage):
        cov[a.name] = {"cooperative": a.cooperative, "enabled": c.enabled, "fired": c.fired,
                       "rejected": c.rejected, "new_states": c.new_states}
    return {
        "scenario": sc.name,
        "engine": sc.engine_type,
        "states": exp.num_states,
        "transitions": exp.num_transitions,
        "depth": exp.max_depth,
        "complete": exp.complete,
        "truncated_by": exp.truncated_by,
        "symmetry": None if exp.symmetry is None else {"classes": [list(c) for c in exp.symmetry.classes],
                                                      "permutations": exp.symmetry.size},
        "liveness_checked": exp.liveness_checked,
        "liveness_states": exp.liveness_states,
        "elapsed_s": round(exp.elapsed_s, 3),
        "states_per_s": round(exp.states_per_s, 1),
        "bytes_per_state": None if exp.bytes_per_state is None else round(exp.bytes_per_state),
        "coverage": cov,
        "violations": [_violation_summary(exp, v) for v in exp.violations],
        "sometimes": [_goal_summary(exp, r) for r in exp.goals],
        "eventually": [{"name": r.goal.name, "goal": r.goal.describe(), "holds": r.reached} for r in exp.eventually],
    }


def _goal_summary(exp: Exploration, r) -> Dict[str, Any]:
    """MC-34: a goal's answer; ``reached`` is null when an incomplete exploration did not find it."""
    out: Dict[str, Any] = {"name": r.goal.name, "goal": r.goal.describe(),
                           "cooperative_only": r.goal.cooperative_only, "reached": r.reached}
    if r.witness is not None:
        out["steps"] = r.witness.length
        out["trace"] = step_names(exp, r.witness)
    return out


def _violation_summary(exp: Exploration, v: Violation) -> Dict[str, Any]:
    out = {"kind": v.kind, "name": v.name, "message": v.message, "steps": v.length,
           "loop": v.loop_index, "occurrences": v.occurrences, "trace": step_names(exp, v)}
    d = deadlock_diagnosis(exp, v)
    if d is not None:
        out["cause"] = d.cause
    return out


def step_names(exp: Exploration, v: Violation) -> List[str]:
    g = graph_of(v, exp)
    return [exp.scenario.actions[g.edges[e].action].name for e in v.steps()]


def deadlock_diagnosis(exp: Exploration, v: Violation):
    """MC-48: the replay's dead-end diagnosis (spec/replay.md LIVE-6) of the core a deadlock
    counterexample ends in, replayed step by step (MC-46); None for other kinds. Kept on the
    violation, so the report and summary.json share one counterfactual run."""
    if v.kind != "deadlock":
        return None
    if v.diagnosis is None:
        from model.replay.dead_end import StuckWorker, diagnose_stuck

        from .replay import replay_steps

        core = replay_steps(exp.scenario, step_names(exp, v)).cores[-1]
        v.diagnosis = diagnose_stuck(StuckWorker("scenario", 0, core, exp.scenario.args))
    return v.diagnosis


def steps_text(exp: Exploration, v: Violation) -> str:
    """MC-43: the counterexample as numbered readable steps (the loop marked)."""
    g = graph_of(v, exp)
    lines = [f"{v.kind}: {v.message}"]
    loop = v.loop_index
    for n, e in enumerate(v.steps()):
        if loop is not None and n == loop:
            lines.append("  -- loop starts here --")
        ed = g.edges[e]
        a = exp.scenario.actions[ed.action]
        tag = "" if a.cooperative else " [adversarial]"
        lines.append(f"  {n + 1}. {a.name}{tag} -> {ed.outcome.label}")
    if loop is not None:
        lines.append(f"  -- back to the state after step {loop} --")
    return "\n".join(lines)


def itf_trace(exp: Exploration, v: Violation) -> Dict[str, Any]:
    """MC-44: the counterexample as an ITF trace (Apalache ADR-015): one state per step with the
    action taken, its outcome, the live queues, the free KV units and every handoff's phase;
    ``loop`` is the index of the state where a lasso's cycle starts."""
    g = graph_of(v, exp)
    states = []

    def state(node, action, outcome, idx):
        phases, waiting, running, free = g.views[node]
        return {
            "#meta": {"index": idx},
            "action": action,
            "outcome": outcome,
            "waiting": list(waiting),
            "running": list(running),
            "free": -1 if free is None else free,
            "phases": {h: p for h, p in phases},
        }

    states.append(state(0, "init", "", 0))
    node = 0
    for i, e in enumerate(v.steps()):
        ed = g.edges[e]
        name = exp.scenario.actions[ed.action].name
        if ed.dst < 0:
            s = state(node, name, ed.outcome.label, i + 1)
        else:
            node = ed.dst
            s = state(node, name, ed.outcome.label, i + 1)
        states.append(s)
    trace: Dict[str, Any] = {
        "#meta": {
            "format": "ITF",
            "format-description": "https://apalache-mc.org/docs/adr/015adr-trace.html",
            "source": exp.scenario.name,
            "description": f"{v.kind}: {v.message}",
        },
        "vars": ["action", "outcome", "waiting", "running", "free", "phases"],
        "states": states,
    }
    if v.loop_index is not None:
        trace["loop"] = v.loop_index
    return trace


def _ident(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_").lower() or "x"


def _distinct(stems) -> List[str]:
    """MC-47: the stems in order, each repeated one suffixed ``-2``, ``-3``... so no file
    overwrites another."""
    used: set = set()
    out = []
    for base in stems:
        stem, n = base, 2
        while stem in used:
            stem, n = f"{base}-{n}", n + 1
        used.add(stem)
        out.append(stem)
    return out


def pytest_source(exp: Exploration, v: Violation) -> str:
    """MC-46: a self-contained pytest module that replays the counterexample (or a goal's witness,
    MC-34) against the model."""
    sc = exp.scenario
    names = step_names(exp, v)
    scenario_json = json.dumps(sc.raw, indent=2, sort_keys=True)
    what = "Witness" if v.kind == "sometimes" else "Counterexample"
    return f'''"""{what} replay generated by ``mocker-spec explore`` (spec/model-checking.md MC-46).

Scenario {sc.name!r}: {v.kind} ({v.name}), {len(names)} step(s).
{v.message}
"""

import json
import os

from explorer.replay import reproduce

SCENARIO = json.loads(r"""
{scenario_json}
""")

STEPS = {json.dumps(names, indent=4)}

LOOP = {v.loop_index!r}


def test_{_ident(sc.name)}_{_ident(v.kind if v.kind != "sometimes" else "sometimes_" + v.name)}_replays():
    result = reproduce(SCENARIO, STEPS, {v.kind!r}, {v.name!r}, LOOP)
    assert result.reproduced, result.message
'''


def write_outputs(exp: Exploration, out_dir, formats) -> List[str]:
    """MC-47: write ``summary.json``, per violation ``<kind>.txt`` / ``.itf.json`` / ``test_*.py``,
    and the graph exports in ``formats`` (state graph and one quotient per handoff).

    All or nothing (:func:`explorer.files.publish`): the files are staged and put in place only
    once every one is written; a failure leaves ``out_dir`` as it was, and takes away the
    directories this call created.  Returns the written paths."""
    return [str(p) for p in publish(pathlib.Path(out_dir), _output_files(exp, formats))]


def _output_files(exp: Exploration, formats) -> List[Tuple[str, Content]]:
    """The files of :func:`write_outputs`: ``(name, content)`` in order."""
    written: List[Tuple[str, Content]] = []

    def put(name, text):
        written.append((name, text))

    put("summary.json", json.dumps(summary(exp), indent=2) + "\n")
    stems = _distinct(f"{v.kind}-{_ident(v.name)}" if v.name != v.kind else v.kind for v in exp.violations)
    for v, stem in zip(exp.violations, stems):
        put(f"{stem}.txt", steps_text(exp, v) + "\n")
        if "itf" in formats:
            put(f"{stem}.itf.json", json.dumps(itf_trace(exp, v), indent=1) + "\n")
        put(f"test_cex_{_ident(exp.scenario.name)}_{_ident(stem)}.py", pytest_source(exp, v))
    witnesses = [r.witness for r in exp.goals if r.witness is not None]
    for w, stem in zip(witnesses, _distinct(f"sometimes-{_ident(w.name)}" for w in witnesses)):
        put(f"{stem}.txt", steps_text(exp, w) + "\n")
        if "itf" in formats:
            put(f"{stem}.itf.json", json.dumps(itf_trace(exp, w), indent=1) + "\n")
        put(f"test_witness_{_ident(exp.scenario.name)}_{_ident(w.name)}.py", pytest_source(exp, w))
    g = graphs.to_networkx(exp)
    if "dot" in formats:
        put("states.dot", graphs.to_dot(g))
    if "graphml" in formats:
        put("states.graphml", lambda path: graphs.write_graphml(g, path))
    if "json" in formats:
        put("states.json", json.dumps(graphs.to_node_link(g)) + "\n")
    if "mermaid" in formats:
        put("states.mmd", graphs.to_mermaid(g))
    handoffs = list(graphs.handoff_keys(exp))
    for h, stem in zip(handoffs, _distinct(_ident(h) for h in handoffs)):
        q = graphs.quotient(exp, h)
        if "dot" in formats:
            put(f"quotient-{stem}.dot", graphs.quotient_to_dot(q))
        if "mermaid" in formats:
            put(f"quotient-{stem}.mmd", graphs.to_mermaid(q, state_diagram=True))
    return written


def print_report(exp: Exploration, console) -> None:
    """MC-40: the summary table, the coverage table and each violation's readable counterexample."""
    from rich.markup import escape
    from rich.table import Table

    s = summary(exp)
    state = "complete" if exp.complete else f"incomplete ({exp.truncated_by})"
    from rich.text import Text

    console.print(Text.assemble(
        (str(s["scenario"]), "bold"),
        f" ({s['engine']}): {s['states']} states, {s['transitions']} transitions, "
        f"depth {s['depth']}, {state}; {s['elapsed_s']} s, {s['states_per_s']} states/s"
        + (f", ~{s['bytes_per_state']} B/state" if s["bytes_per_state"] is not None else "")),
        highlight=False, soft_wrap=True)
    if exp.symmetry is not None:
        full = exp.liveness_graph  # the unreduced run, when liveness or goals needed one (MC-25, MC-34)
        tail = "" if full is None else f"; liveness and goals on the unreduced graph of {full.num_states} states"
        console.print(f"symmetry: classes {s['symmetry']['classes']} (safety checks on the reduced graph{tail})",
                      highlight=False)
    if not exp.liveness_checked:
        console.print("liveness (deadlock, livelock, starvation): not checked (exploration incomplete or disabled)")
    t = Table(title="action coverage")
    for col in ("action", "coop", "enabled", "fired", "rejected", "new states"):
        t.add_column(col)
    for name, c in s["coverage"].items():
        t.add_row(Text(name), "yes" if c["cooperative"] else "no", str(c["enabled"]), str(c["fired"]), str(c["rejected"]),
                  str(c["new_states"]))
    console.print(t)
    for r in exp.goals:
        if r.witness is not None:
            console.print(f"sometimes {r.goal.name}: reached in {r.witness.length} step(s): "
                          + (", ".join(step_names(exp, r.witness)) or "the initial state"),
                          highlight=False, soft_wrap=True, markup=False)
        elif r.reached is False:
            console.print(f"sometimes {escape(r.goal.name)}: [red]never[/] (see the unreachable_goal violation)",
                          highlight=False)
        else:
            console.print(f"sometimes {r.goal.name}: not found in the {s['states']} states reached "
                          "(exploration incomplete)", highlight=False, markup=False)
    for r in exp.eventually:
        verdict = {True: "every fair cooperative run reaches it", False: "[red]avoidable[/] (see the avoidable_goal "
                   "violation)", None: "unknown (exploration incomplete)"}[r.reached]
        console.print(f"eventually {escape(r.goal.name)}: {verdict}", highlight=False)
    if not exp.violations:
        if exp.complete:
            console.print("[green]no violation[/]")
        else:  # a bound stopped the search: what was not reached was not checked
            console.print(f"[yellow]no violation in the {s['states']} states reached[/] (exploration stopped by "
                          f"{exp.truncated_by}; raise the bound to check the rest)", highlight=False)
        return
    for v in exp.violations:
        console.print(f"[red]violation[/] ({v.occurrences} occurrence(s)); shortest counterexample, {v.length} step(s):",
                      highlight=False)
        console.print(steps_text(exp, v), highlight=False, soft_wrap=True, markup=False)
        d = deadlock_diagnosis(exp, v)
        if d is not None:
            console.print(f"  why ({d.cause}): {d.text.split(': ', 1)[1]}", highlight=False, soft_wrap=True,
                          markup=False)
