"""The model checker on the scenario library (spec/model-checking.md, spec/scenarios.md).

Known-defect scenarios must produce their violation with a shortest counterexample in under
10 s (MC-21); clean scenarios must explore completely with no violation (MC-20).  SGLang
scenarios run once the SGLang core exists.
"""

from __future__ import annotations

import json
import pathlib
import time

import pytest

from explorer import explore, load_scenario, scenario_from_dict
from explorer.outputs import step_names
from explorer.replay import reproduce

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIB = ROOT / "spec" / "scenarios"
KNOWN = sorted((LIB / "known-defects").glob("*.json"))
CLEAN = sorted(p for p in LIB.rglob("*.json") if p.parent.name != "known-defects")

def _stop_kind(scenario):
    """Safety kinds can stop the search at the first hit (still shortest: BFS, MC-21)."""
    kind = scenario.expect.kind
    return None if kind in ("deadlock", "livelock", "starvation") else kind


@pytest.mark.parametrize("path", KNOWN, ids=[p.stem for p in KNOWN])
def test_known_defect_is_found_with_a_shortest_counterexample(path):
    """MC-21 / SCN-9: each known-defect scenario finds its violation in under 10 s."""
    sc = load_scenario(path)
    assert sc.expect.verdict == "violation"
    t0 = time.perf_counter()
    exp = explore(sc, stop_on=_stop_kind(sc))
    elapsed = time.perf_counter() - t0
    v = exp.violation(sc.expect.kind)
    assert v is not None, f"{sc.name}: no {sc.expect.kind}; found {[x.kind for x in exp.violations]}"
    assert elapsed < 10.0, f"{sc.name}: {elapsed:.1f} s"
    if sc.expect.max_steps is not None:
        assert v.length <= sc.expect.max_steps, f"{sc.name}: {v.length} steps"
    # MC-46: the counterexample replays against the model, independently of the graph
    rep = reproduce(sc, step_names(exp, v), v.kind, v.name, v.loop_index)
    assert rep.reproduced, rep.message


def test_s7_livelock_is_the_self_preemption_lasso():
    """MC-31 / S7: a lasso of at most 6 steps whose loop is a zero-time pass that admits a request."""
    sc = load_scenario(LIB / "known-defects" / "s7-vllm-zero-time-livelock.json")
    exp = explore(sc)
    v = exp.violation("livelock")
    assert v.length <= 6 and v.cycle
    loop_edges = [exp.edges[e] for e in v.cycle]
    assert all(sc.actions[e.action].kind == "pass" for e in loop_edges)
    assert all(e.outcome.zero_time and e.outcome.progress for e in loop_edges)
    assert "admit" in loop_edges[0].outcome.label
    # MC-15: the same pass is also flagged as progress that changes nothing
    assert exp.violation("progress_without_change").length <= 6


def test_s7_exact_command_order_from_the_notes_replays():
    """MC-46 / S7: reserve X (32), reserve Y (16), activate Y, then passes loop at zero time."""
    sc = load_scenario(LIB / "known-defects" / "s7-vllm-zero-time-livelock.json")
    steps = ["reserve(hX,X)", "reserve(hY,Y)", "activate(hY)", "pass", "pass"]
    assert reproduce(sc, steps, "livelock", "livelock", 4).reproduced
    assert reproduce(sc, steps, "progress_without_change", "pass").reproduced
    # a step list the scenario cannot run is refused at the step that fails, counted from 1
    for bad, why in ((["pass", "pass", "teleport"], "step 3: unknown action 'teleport'"),
                     (["reserve(hX,X)", "pass", "reserve(hX,X)"], "step 3: reserve(hX,X) already fired"),
                     (["pass", "pass", "activate(hY)"], "step 3: activate(hY) is not enabled")):
        rep = reproduce(sc, bad, "livelock", "livelock", 0)
        assert not rep.reproduced and rep.message == why
    # a lasso whose last state is not its loop state: states are counted from 0 (the empty core)
    open_loop = reproduce(sc, steps[:4], "livelock", "livelock", 0)
    assert not open_loop.reproduced
    assert open_loop.message == "state 4 is not state 0: the loop does not close"


def test_s6_deadlock_is_the_activated_fifo_head_of_line_block():
    """MC-30 / S6: R waits at the head (preempted, cannot fit) with the activated Y and X behind it."""
    sc = load_scenario(LIB / "known-defects" / "s6-vllm-activated-fifo-deadlock.json")
    exp = explore(sc)
    v = exp.violation("deadlock")
    phases, waiting, running, _free = exp.views[v.node]
    assert waiting[0] == "R" and not running
    assert dict(phases) == {"hR": "D_active(preempted)", "hY": "D_active(waiting)", "hX": "D_active(waiting)"}
    assert exp.violation("starvation") is not None


def test_s6_shortest_form_is_a_fresh_head_in_front_of_an_activated_destination():
    """MC-30 / S6 (VLLM-11..VLLM-13): reserve Y, submit F, activate Y: the fresh F (2 blocks) waits at
    the head with 1 block free and Y behind it holds the other 2. The SGLang core, which promotes
    activated requests first (SG-8), explores the same scenario clean, and so does the vLLM core with
    a fourth block."""
    path = LIB / "known-defects" / "s6-vllm-fresh-head-deadlock.json"
    exp = explore(load_scenario(path))
    v = exp.violation("deadlock")
    assert step_names(exp, v) == ["reserve(hY,Y)", "submit(F)", "activate(hY)"]
    phases, waiting, running, free = exp.views[v.node]
    assert list(waiting) == ["F", "Y"] and not running and free == 1
    raw = json.loads(path.read_text())
    # SGLang: conservativeness 0 keeps the ratio constant, so the graph is small (MC-2)
    raw["engine"] = dict(raw["engine"], engine_type="sglang", sglang={"schedule_conservativeness": 0.0})
    sg = explore(scenario_from_dict(raw))
    assert sg.complete and sg.clean, [(x.kind, x.message) for x in sg.violations]
    # one more block and F fits next to Y: every interleaving drains
    raw = json.loads(path.read_text())
    raw["engine"]["num_gpu_blocks"] = 4
    roomy = explore(scenario_from_dict(raw))
    assert roomy.complete and roomy.clean, [(x.kind, x.message) for x in roomy.violations]


#: S11's defect is its oversize request itself (SG-25 checks no size), so that request fails alone
_ALONE_FAILS = {"s11-sglang-oversize-source-deadlock": {"P"}}


@pytest.mark.parametrize("path", [p for p in KNOWN if json.loads(p.read_text())["expect"]["kind"] in
                                  ("deadlock", "livelock", "starvation", "drained_pool_free")],
                         ids=lambda p: p.stem)
def test_known_defect_needs_its_requests_together(path):
    """A known defect of liveness or leak kind is an interaction: each of its requests alone explores
    without the scenario's violation (S11 excepted, by design), so the scenario cannot pass for a
    configuration that never serves one request (what the 16-slot S8 scenario did)."""
    raw = json.loads(path.read_text())
    kind = raw["expect"]["kind"]
    for req in raw["requests"]:
        alone = explore(scenario_from_dict(dict(raw, requests=[req], expect={"verdict": "clean"})))
        fails = alone.violation(kind) is not None
        assert fails == (req["id"] in _ALONE_FAILS.get(path.stem, set())), (req["id"], kind)


def test_s8_needs_the_pending_destination():
    """MC-30 / S8 (SG-28): on the 18-slot pool P's first chunk (8) runs, D (12) cannot reserve the 10
    slots left and stays pending, and no prefill batch runs behind it. Each request alone drains (by
    hand: P's last chunk 8 + 1 output reserve < 10 free; D's 12 fit 18); the deadlock state gets
    LIVE-6's half-prefilled-head cause (MC-48). On 16 slots P alone stops after its first chunk."""
    from explorer.outputs import deadlock_diagnosis

    path = LIB / "known-defects" / "s8-sglang-half-prefill-deadlock.json"
    exp = explore(load_scenario(path))
    v = exp.violation("deadlock")
    assert step_names(exp, v) == ["submit(P)", "pass", "reserve(hD,D)"]
    assert deadlock_diagnosis(exp, v).cause == "half_prefilled_head"
    # each request alone drains: test_known_defect_needs_its_requests_together
    raw = json.loads(path.read_text())
    raw["engine"]["num_gpu_blocks"] = 16
    p_alone = explore(scenario_from_dict(dict(raw, requests=[raw["requests"][0]], expect={"verdict": "clean"})))
    assert p_alone.violation("deadlock") is not None


def test_s9_retracted_destination_never_passes_the_fresh_admission_check():
    """MC-30 / S9 second half (SG-17, SG-12): A is retracted in the pass that promotes A and B, B
    finishes, and A waits as a fresh request whose prompt plus output reserve (3 + 2) never fits the
    5-slot pool. Controls: A alone drains; with a sixth slot no deadlock is left."""
    path = LIB / "known-defects" / "s9-sglang-retracted-destination-deadlock.json"
    exp = explore(load_scenario(path))
    v = exp.violation("deadlock")
    assert step_names(exp, v) == ["reserve(hA,A)", "activate(hA)", "reserve(hB,B)", "activate(hB)", "pass", "pass"]
    phases, waiting, running, _free = exp.views[v.node]
    assert list(waiting) == ["A"] and not running
    assert dict(phases) == {"hA": "D_active(waiting(fresh))", "hB": "D_absent"}
    raw = json.loads(path.read_text())
    raw["requests"] = raw["requests"][:1]
    alone = explore(scenario_from_dict(raw))
    assert alone.complete and alone.clean, [(x.kind, x.message) for x in alone.violations]
    raw = json.loads(path.read_text())
    raw["engine"]["num_gpu_blocks"] = 6
    six = explore(scenario_from_dict(raw))
    assert six.complete and six.violation("deadlock") is None and six.violation("livelock") is not None


def test_s10_leaks_under_a_correct_driver_through_a_retraction():
    """MC-12 / S10 (SGQ-3, SG-17): every step of the leak is cooperative; the reservation must come
    before the source's release (then activation collides with the cached prefix), and private
    prompts do not leak."""
    path = LIB / "known-defects" / "s10-sglang-retraction-leak.json"
    sc = load_scenario(path)
    assert not any(a.name.startswith(("cancel", "early", "unknown")) for a in sc.actions)
    exp = explore(sc)
    v = exp.violation("drained_pool_free")
    steps = step_names(exp, v)
    assert steps == ["submit_prefill(hS,S)", "pass", "reserve(hD,D)", "release(hS)", "activate(hD)",
                     "reserve(hE,E)", "activate(hE)", "pass", "pass", "pass"]
    assert all(exp.scenario.actions[exp.edges[e].action].cooperative for e in v.steps())
    swapped = steps[:2] + ["release(hS)", "reserve(hD,D)"] + steps[4:]
    miss = reproduce(sc, swapped, "drained_pool_free", "drained_pool_free", None)
    assert not miss.reproduced and miss.message == "the final state is not a drained core holding KV"
    hit = reproduce(sc, steps, "drained_pool_free", "drained_pool_free", None)
    assert hit.reproduced and "drained" in hit.message and hit.message != miss.message
    raw = json.loads(path.read_text())
    raw["requests"][1]["segments"] = [["private", 2], ["d", 2]]
    private = explore(scenario_from_dict(raw), stop_on="drained_pool_free")
    assert private.complete and private.violation("drained_pool_free") is None


def test_s1_fifo_revival_needs_the_adversarial_reuse():
    """MC-11 / S1: without the cancel and the reused handoff id the FIFO order holds."""
    raw = json.loads((LIB / "known-defects" / "s1-fifo-tombstone-revival.json").read_text())
    raw["actions"] = []
    exp = explore(scenario_from_dict(raw), stop_on="fifo_order")
    assert exp.complete and exp.violation("fifo_order") is None


def test_s1_in_five_steps_when_admission_is_withheld_instead_of_a_full_pool():
    """MC-11 / S1 (PEND-Q1, CMD-6): without the filler P, reservations that withhold admission
    (`allow_destination_admission: false`) stay pending on their own, so reserve A, H, B; cancel H;
    reserve H again breaks the acceptance order in 5 steps (found by the scenario campaign)."""
    raw = json.loads((LIB / "known-defects" / "s1-fifo-tombstone-revival.json").read_text())
    raw["requests"] = [dict(r, allow_destination_admission=False) for r in raw["requests"] if r["id"] != "P"]
    exp = explore(scenario_from_dict(raw), stop_on="fifo_order")
    v = exp.violation("fifo_order")
    assert step_names(exp, v) == ["reserve(hA,A)", "reserve(hH,H)", "reserve(hB,B)", "cancel_destination(hH)",
                                  "reserve(hH,H2)"]


@pytest.mark.parametrize("path", CLEAN, ids=[p.stem for p in CLEAN])
def test_clean_scenario_passes_exhaustively(path):
    """MC-20 / SCN-9: a clean scenario explores completely (liveness included) with no violation."""
    sc = load_scenario(path)
    assert sc.expect.verdict in ("clean", "unreachable")
    exp = explore(sc)
    assert exp.complete and exp.liveness_checked
    if sc.expect.verdict == "unreachable":  # SCN-9: no violation of that kind anywhere
        assert exp.violation(sc.expect.kind) is None, sc.expect.kind
    else:
        assert exp.clean, [(v.kind, v.message) for v in exp.violations]


def test_symmetry_reduces_and_agrees():
    """MC-4 / MC-25: symmetry shrinks the graph, finds the same (absence of) violations, and liveness
    still runs on the unreduced graph."""
    sc = load_scenario(LIB / "clean" / "vllm-decode-three-handoffs.json")
    plain = explore(sc, symmetry=False)
    reduced = explore(sc, symmetry=True)
    assert reduced.symmetry is not None and reduced.num_states < plain.num_states
    assert reduced.liveness_checked and reduced.liveness_states == plain.num_states
    assert plain.clean and reduced.clean
    s6 = load_scenario(LIB / "known-defects" / "s6-vllm-activated-fifo-deadlock.json")
    r6 = explore(s6, symmetry=True)
    assert r6.violation("deadlock").length == explore(s6).violation("deadlock").length


@pytest.mark.parametrize("name", ["clean/vllm-prefill-three-sources", "known-defects/s6-vllm-activated-fifo-deadlock",
                                  "known-defects/s1-fifo-tombstone-revival", "known-defects/s10-sglang-slot-leak",
                                  "sglang/sglang-decode-three-handoffs"])
def test_outcome_reuse_gives_the_same_graph(name, monkeypatch):
    """MC-23: taking a core's outcomes, checks and view from an earlier node with the same core gives
    exactly the graph (nodes, numbered edges, outcomes, views, violations and their occurrence
    counts) of firing every action and checking every node, with fewer firings."""
    from explorer import search

    sc = load_scenario(LIB / f"{name}.json")
    calls = []
    real_fire = search.fire

    def counting(core, spec, now):
        calls.append(spec.kind)
        return real_fire(core, spec, now)

    monkeypatch.setattr(search, "fire", counting)
    reused = search._run(sc, None, None, None, False, None, safety=True, liveness=True)
    n_reused = len(calls)
    full = search._run(sc, None, None, None, False, None, safety=True, liveness=True, reuse=False)
    # the shortcut was taken (the SGLang decode scenario reaches each core along one fired set only)
    assert n_reused < len(calls) - n_reused if "sglang" not in name else n_reused <= len(calls) - n_reused
    assert reused.num_states == full.num_states and reused.views == full.views
    assert [(e.src, e.dst, e.action, e.outcome) for e in reused.edges] == \
        [(e.src, e.dst, e.action, e.outcome) for e in full.edges]
    assert [(v.kind, v.name, v.node, v.steps(), v.occurrences) for v in reused.violations] == \
        [(v.kind, v.name, v.node, v.steps(), v.occurrences) for v in full.violations]


@pytest.mark.parametrize("name", ["known-defects/s1-fifo-tombstone-revival", "known-defects/s10-sglang-slot-leak",
                                  "clean/vllm-decode-three-handoffs"])
def test_views_and_checks_match_each_nodes_own_core(name, monkeypatch):
    """MC-23 (c): every node's view and every state check, recomputed from the node's own core (rebuilt
    by firing its BFS-tree path from the empty core) without any per-core memo, equal what the
    explorer reports: the view node by node, each check's node count as the violation's occurrences.
    A probe invariant that holds on every core with no request left is added, so that findings on
    cores shared by several nodes are counted too."""
    from model import core as C
    from explorer import properties as P
    from explorer.actions import fire
    from explorer.canon import canonical_key

    real = P.registered_invariants

    def with_probe(core):
        found = list(real(core))
        if C.num_requests(core) == 0:
            found.append(("probe", "probe: no request left"))
        return found

    monkeypatch.setattr(P, "registered_invariants", with_probe)
    sc = load_scenario(LIB / f"{name}.json")
    exp = explore(sc, symmetry=False)  # the memos are kept only without symmetry
    actions = sc.actions
    bit = {a.name: 1 << i for i, a in enumerate(actions) if a.once}
    cores = [C.new_core(sc.args)]
    for node in range(1, exp.num_states):
        e = exp.edges[exp.parent_edge[node]]
        assert e.src < node  # BFS: a node's parent was found first
        new, _out = fire(cores[e.src], actions[e.action], sc.now_ms)
        cores.append(new)
    counts = {}
    for node, core in enumerate(cores):
        fired = exp.fired[node]
        phases = []
        for r in sc.requests:
            if r.role == "plain":
                phases.append((r.id, P.request_phase(core, r.id, bool(fired & bit[f"submit({r.id})"]))))
            elif r.role == "source":
                issued = bool(fired & bit[f"submit_prefill({r.handoff},{r.id})"])
                phases.append((r.handoff, P.source_phase(core, r.handoff, r.id, issued)))
            else:
                issued = bool(fired & bit[f"reserve({r.handoff},{r.id})"])
                phases.append((r.handoff, P.destination_phase(core, r.handoff, r.id, issued)))
        waiting, running = P.queue_view(core)
        assert exp.views[node] == (tuple(phases), waiting, running, P.free_units(core)), node
        found = [("invariant", n) for n, _m in P.registered_invariants(core)]
        if "fifo_order" in sc.checks and P.fifo_acceptance_order(core):
            found.append(("fifo_order", "fifo_acceptance_order"))
        if "drained_pool_free" in sc.checks and P.drained_pool_free(core):
            found.append(("drained_pool_free", "drained_pool_free"))
        for k in found:
            counts[k] = counts.get(k, 0) + 1
    reported = {(v.kind, v.name): v.occurrences for v in exp.violations
                if v.kind in ("invariant", "fifo_order", "drained_pool_free")}
    assert reported == counts
    # some probed cores are shared by several nodes (more probed nodes than distinct probed cores)
    assert counts[("invariant", "probe")] > len({canonical_key(c) for c in cores if C.num_requests(c) == 0}) > 0
    if name.startswith("known-defects/s1") or name.startswith("known-defects/s10"):
        assert counts  # the defect is found on some nodes


@pytest.mark.parametrize("name", ["s6-vllm-fresh-head-deadlock", "s8-sglang-half-prefill-deadlock",
                                  "s9-sglang-retracted-destination-deadlock"])
def test_deadlock_occurrences_count_every_deadlocked_state(name):
    """MC-30: a deadlock's occurrences are the explored states that are not drained and that no
    cooperative action changes or reports progress from.  Each state's verdict is recomputed by
    replaying its BFS-tree path on a fresh core and firing every enabled action (MC-46's check)."""
    sc = load_scenario(LIB / "known-defects" / f"{name}.json")
    exp = explore(sc, symmetry=False)
    names = [a.name for a in sc.actions]
    expected = sum(
        1 for node in range(exp.num_states)
        if reproduce(sc, [names[exp.edges[e].action] for e in exp.path_to(node)], "deadlock").reproduced
    )
    v = exp.violation("deadlock")
    assert expected > 0 and v is not None and v.occurrences == expected


def test_bounds_make_the_run_incomplete_and_skip_liveness():
    """MC-20: a state bound truncates the search; liveness is then not claimed."""
    sc = load_scenario(LIB / "clean" / "vllm-decode-three-handoffs.json")
    exp = explore(sc, max_states=50)
    assert exp.num_states == 50 and not exp.complete and exp.truncated_by == "max_states"
    assert not exp.liveness_checked


def test_coverage_counts_every_action():
    """MC-22: enabled >= fired + rejected; new states sum to states - 1."""
    sc = load_scenario(LIB / "clean" / "vllm-prefill-three-sources.json")
    exp = explore(sc)
    assert sum(c.new_states for c in exp.coverage) == exp.num_states - 1
    for a, c in zip(sc.actions, exp.coverage):
        assert c.enabled >= c.fired + c.rejected, a.name
        assert c.enabled > 0, f"{a.name} never enabled"
    # unknown handoff ids only ever give Noop (a self-loop on the core)
    unknown = [i for i, a in enumerate(sc.actions) if a.handoff == "unknown"]
    assert all(e.src == e.dst for e in exp.edges if e.action in unknown)
