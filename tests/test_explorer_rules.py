"""Rule-level tests of the explorer (spec/model-checking.md MC-n, spec/scenarios.md SCN-n)."""

from __future__ import annotations

import json
import pathlib

import attrs
import pytest

from explorer import explore, load_scenario, scenario_from_dict
from explorer.scenario import ScenarioError
from explorer import actions as A
from explorer import outputs
from explorer import properties as P
from explorer.canon import canonical_key, symmetry_for
from model import core as C

LIB = pathlib.Path(__file__).resolve().parent.parent / "spec" / "scenarios"
S7 = LIB / "known-defects" / "s7-vllm-zero-time-livelock.json"
S6 = LIB / "known-defects" / "s6-vllm-activated-fifo-deadlock.json"


def _raw(path):
    return json.loads(path.read_text())


def test_scn2_defaults():
    """SCN-2: defaults of the optional top-level fields."""
    sc = scenario_from_dict({"name": "x", "engine": {"engine_type": "vllm", "num_gpu_blocks": 4}})
    assert sc.now_ms == 0.0 and sc.max_states == 200_000 and sc.max_depth == 10_000
    assert not sc.symmetry and sc.expect.verdict == "clean" and sc.requests == ()
    assert [a.name for a in sc.actions] == ["pass", "retry"]
    assert set(sc.checks) == {"invariants", "fifo_order", "drained_pool_free", "transitions", "deadlock",
                              "livelock", "starvation"}


def test_scn4_scn5_cooperative_alphabet_and_guards():
    """SCN-4 / SCN-5: each role's cooperative driver, its once flags and guards."""
    sc = load_scenario(LIB / "clean" / "vllm-mixed-three-handoffs.json")
    by = {a.name: a for a in sc.actions}
    assert by["submit_prefill(h1,S)"].once and by["submit_prefill(h1,S)"].cooperative
    assert by["release(h1)"].guard == "source_held"
    assert by["reserve(h2,D1)"].kind == "reserve" and by["activate(h2)"].guard == "destination_reserved"
    assert by["submit(P)"].once and by["pass"].cooperative and not by["pass"].once
    assert not by["cancel_destination(h2)"].cooperative and not by["cancel_destination(h2)"].once
    core = C.new_core(sc.args)
    assert not A.guard_holds(core, by["activate(h2)"])
    core, _o = A.fire(core, by["reserve(h2,D1)"], 0.0)
    assert A.guard_holds(core, by["activate(h2)"])
    # SCN-5: a fired once action is disabled even when the core rejected it
    exp = explore(sc, max_states=200)
    fired_twice = [e for e in exp.edges if sc.actions[e.action].once
                   and exp.fired[e.src] >> e.action & 1]
    assert not fired_twice


def test_scn6_generated_adversarial_actions():
    """SCN-6: cancel / out_of_order / reuse_ids / unknown_ids generate their actions."""
    raw = _raw(S7)
    raw["adversarial"] = {"cancel": True, "out_of_order": True, "reuse_ids": True, "unknown_ids": True}
    names = {a.name: a for a in scenario_from_dict(raw).actions}
    for n in ("cancel_destination(hX)", "early_activate(hX)", "reserve(hX,X')", "activate(unknown)",
              "release(unknown)", "cancel_source(unknown)", "cancel_destination(unknown)"):
        assert n in names and not names[n].cooperative
    assert names["reserve(hX,X')"].once and names["reserve(hX,X')"].request.tokens == names["reserve(hX,X)"].request.tokens


def test_scn7_checks_can_be_switched_off():
    """SCN-7: a switched-off check reports nothing."""
    raw = _raw(S6)
    raw["checks"] = {"deadlock": False, "starvation": False, "livelock": False, "transitions": False}
    exp = explore(scenario_from_dict(raw))
    assert exp.clean


def test_scn8_symmetry_classes():
    """SCN-8: classes group same-shaped requests; explicitly named ones stay out."""
    sc = load_scenario(LIB / "known-defects" / "s1-fifo-tombstone-revival.json")
    sym = symmetry_for(sc)
    assert sym is not None and sym.classes == (("P", "A", "B"),)
    assert symmetry_for(load_scenario(S7)) is None  # X and Y differ in prompt length


def test_mc5_mc6_firing_outcomes():
    """MC-5 / MC-6: passes, retries and commands; a rejected command returns the same core."""
    sc = load_scenario(S7)
    core = C.new_core(sc.args)
    reserve = sc.action("reserve(hY,Y)")
    core, out = A.fire(core, reserve, 0.0)
    assert out.label.startswith("DestinationAccepted") and out.events == ("DestinationReserved(hY)",)
    again, out = A.fire(core, reserve, 0.0)
    assert again is core and out.rejected == "RequestAlreadyActive"
    _c, out = A.fire(core, sc.action("retry"), 0.0)
    assert out.zero_time and not out.progress and out.label == "-"
    _c, out = A.fire(core, sc.action("pass"), 0.0)
    assert out.label == "idle" and out.zero_time and not out.progress


def test_mc7_progress_is_the_offline_driver_test():
    """MC-7: an admitting pass reports progress; an idle one does not."""
    sc = load_scenario(S7)
    core = C.new_core(sc.args)
    for n in ("reserve(hY,Y)", "activate(hY)"):
        core, _o = A.fire(core, sc.action(n), 0.0)
    new, res = C.execute_pass(core, 0.0)
    assert A.reports_progress(res) and res.admissions
    _n, res = C.execute_pass(C.new_core(sc.args), 0.0)
    assert not A.reports_progress(res)


def test_mc10_registered_invariants_match_the_registry():
    """MC-10: the memoised walk finds exactly what ``invariants.violations`` finds."""
    import invariants

    sc = load_scenario(S7)
    core = C.new_core(sc.args)
    core, _o = A.fire(core, sc.action("reserve(hY,Y)"), 0.0)
    assert P.registered_invariants(core) == []
    led = core.ledger
    broken = attrs.evolve(core, ledger=attrs.evolve(led, destination_holds=attrs.evolve(
        led.destination_holds, by_request=led.destination_holds.by_request.remove(
            next(iter(led.destination_holds.by_request))))))
    found = {n for n, _m in P.registered_invariants(broken)}
    assert found == {v.invariant.name for v in invariants.violations(broken)} and "dst_bijective" in found


def test_mc12_drained_pool_free(monkeypatch):
    """MC-12: a drained core holding KV is reported; an empty core is fine."""
    core = C.new_core(load_scenario(S7).args)
    assert P.drained_pool_free(core) is None
    monkeypatch.setattr(P, "leaked_kv", lambda c: 2)
    assert "2 KV unit" in P.drained_pool_free(core)


def test_mc13_mc14_transition_checks_hold_on_the_library():
    """MC-13 / MC-14: rejected commands never change the key, passes never end before they start."""
    raw = _raw(S7)
    raw["adversarial"] = {"reuse_ids": True, "cancel": True}
    exp = explore(scenario_from_dict(raw))
    assert sum(c.rejected for c in exp.coverage) > 0
    assert exp.violation("rejected_changed_state") is None and exp.violation("time_went_backwards") is None
    assert all(e.outcome.end_ms >= e.outcome.now_ms for e in exp.edges)


@pytest.mark.parametrize("symmetry", [False, True])
def test_mc13_catches_a_rejection_that_changed_the_core_in_place(monkeypatch, symmetry):
    """MC-13: a command that changes its input core in place and then raises is reported, although
    the runner hands the (changed) input core back and the memo of sub-keys by identity still holds
    the old ones: the rejected core is keyed again from scratch."""
    from model.errors import ModelError

    real = C.apply_command_effects

    def changes_then_raises(core, command, allow=True):
        try:
            return real(core, command, allow)
        except ModelError:
            req = next(iter(core.requests.values()), None)
            if req is not None:  # a broken transaction: it wrote into the shared request, then raised
                object.__setattr__(req, "num_computed_tokens", req.num_computed_tokens + 1)
            raise

    raw = _raw(S7)
    raw["adversarial"] = {"reuse_ids": True}
    sc = scenario_from_dict(raw)
    clean = explore(sc, symmetry=symmetry)
    assert clean.violation("rejected_changed_state") is None and sum(c.rejected for c in clean.coverage) > 0
    monkeypatch.setattr(C, "apply_command_effects", changes_then_raises)
    exp = explore(sc, symmetry=symmetry, stop_on="rejected_changed_state")
    v = exp.violation("rejected_changed_state")
    assert v is not None and "was rejected (" in v.message and "but the core changed" in v.message
    # MC-46: the counterexample reproduces (as its generated pytest module checks), and only with
    # the broken command
    from explorer.outputs import step_names
    from explorer.replay import reproduce

    steps = step_names(exp, v)
    assert reproduce(sc, steps, "rejected_changed_state").reproduced
    monkeypatch.setattr(C, "apply_command_effects", real)
    assert not reproduce(sc, steps, "rejected_changed_state").reproduced


def test_mc14_catches_a_pass_that_ends_before_it_starts(monkeypatch):
    """MC-14: a pass whose result ends before the time it was given is reported at the first pass
    (one step), although every state it leads to is an ordinary one."""
    real = C.execute_pass

    def early(core, now_ms):
        new, res = real(core, now_ms)
        return new, attrs.evolve(res, end_ms=now_ms - 1.0)

    monkeypatch.setattr(C, "execute_pass", early)
    exp = explore(load_scenario(S7), stop_on="time_went_backwards")
    v = exp.violation("time_went_backwards")
    assert v is not None and v.length == 1 and v.message.startswith("end_ms ") and "< now_ms" in v.message


def test_mc16_internal_errors_are_violations(monkeypatch):
    """MC-16: an InternalInvariantBroken raised by an action is a violation with no successor."""
    from model.errors import InternalInvariantBroken

    def boom(core, now_ms):
        raise InternalInvariantBroken("boom", rule="VLLM-4")

    monkeypatch.setattr(C, "execute_pass", boom)
    exp = explore(load_scenario(S7))
    v = exp.violation("internal_error")
    assert v is not None and v.length == 1 and exp.edges[v.edge].dst == -1


def test_mc32_mc33_mc41_starvation_lasso_and_phases():
    """MC-32 / MC-33 / MC-41: the S6 starvation lasso closes on its entry; phases name §6 states."""
    sc = load_scenario(S6)
    exp = explore(sc)
    v = exp.violation("starvation")
    assert v.cycle and exp.edges[v.cycle[0]].src == v.node == exp.edges[v.cycle[-1]].dst
    assert all(sc.actions[exp.edges[e].action].cooperative for e in v.cycle)
    phases = {p for n in range(exp.num_states) for _h, p in exp.views[n][0]}
    assert {"D_unissued", "D_reserved", "D_active(running)", "D_active(preempted)", "D_absent"} <= phases


def test_mc43_readable_steps_mark_the_loop():
    """MC-43: numbered steps with the loop start marked."""
    exp = explore(load_scenario(S7))
    text = outputs.steps_text(exp, exp.violation("livelock"))
    assert "  1. " in text and "-- loop starts here --" in text and "back to the state after step" in text


def test_mc47_summary_lists_every_violation(tmp_path):
    """MC-47 / MC-40: the summary file carries figures, coverage and each counterexample's steps."""
    exp = explore(load_scenario(S7))
    outputs.write_outputs(exp, tmp_path, ["itf"])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["states"] == exp.num_states and s["coverage"]["pass"]["enabled"] == exp.num_states
    assert {v["kind"] for v in s["violations"]} == {v.kind for v in exp.violations}
    assert not (tmp_path / "states.dot").exists()


def test_generic_key_abstracts_only_the_generation():
    """MC-2: cores without a dedicated key keep every field except the generation marks."""
    from explorer.canon import _generic_key

    core = C.new_core(load_scenario(S7).args)
    bumped = attrs.evolve(core, ledger=core.ledger.bump_generation())
    assert _generic_key(core) == _generic_key(bumped)
    assert canonical_key(core) == canonical_key(bumped)


@pytest.mark.parametrize("symmetry", [False, True])
def test_goals_are_answered_when_the_search_stops_at_a_violation(symmetry):
    """MC-4, MC-34, MC-36: a search that stops at its first violation still answers the goals, with
    symmetry as without it: B's destination is reserved one step in, so the never goal is a
    forbidden_state violation and the sometimes goal is reached."""
    raw = _raw(LIB / "known-defects" / "s1-fifo-tombstone-revival.json")
    raw["never"] = [{"name": "b-reserved", "phases": {"B": "D_reserved"}}]
    raw["sometimes"] = [{"name": "b-reserved-too", "phases": {"B": "D_reserved"}}]
    exp = explore(scenario_from_dict(raw), symmetry=symmetry, stop_at_first=True)
    assert exp.truncated_by == "stop"
    forbidden = exp.violation("forbidden_state")
    assert forbidden is not None and forbidden.length == 1
    assert [r.reached for r in exp.goals] == [True]


def test_scn1_bad_input_the_loader_used_to_let_through():
    """SCN-1, SCN-2, SCN-4, SCN-9: each of these is an error naming the field, not silently dropped."""
    base = {"name": "x", "engine": {"engine_type": "vllm", "num_gpu_blocks": 4},
            "requests": [{"id": "A", "prompt_len": 4, "max_output_tokens": 1}]}
    bad = [
        (dict(base, **{"$schema": 5}), r"\$schema must be a string"),
        (dict(base, actions=[{"kind": "submit", "request": {"id": "B", "like": "A", "prompt_len": 3}}]),
         "like takes its prompt from 'A'"),
        # a list once reached a dict lookup and failed with "unhashable type" (a traceback)
        (dict(base, actions=[{"kind": "submit", "request": {"id": "B", "like": [1]}}]),
         r"request.like names unknown request \[1\]"),
        (dict(base, actions=[{"kind": "pass", "request": "A"}]), "a pass action issues no request"),
        (dict(base, actions=[{"kind": "cancel_source", "handoff": "h", "request": "Z"}]),
         "a cancel_source action issues no request"),
        (dict(base, actions=[{"kind": "retry", "handoff": "h"}]), "a retry action takes no handoff id"),
        (dict(base, expect={"verdict": "clean", "kind": "deadlock"}), "expect.kind is only for"),
        (dict(base, expect={"verdict": "unreachable"}), "expect.kind is required when expect.verdict is unreachable"),
    ]
    for raw, message in bad:
        with pytest.raises(ScenarioError, match=message):
            scenario_from_dict(raw)


def test_scn1_a_key_given_twice_is_refused(tmp_path):
    """SCN-1: ``json`` would keep the second ``num_gpu_blocks`` without a word."""
    f = tmp_path / "twice.json"
    f.write_text('{"name": "x", "engine": {"engine_type": "vllm", "num_gpu_blocks": 4, "num_gpu_blocks": 8},'
                 ' "requests": [{"id": "A", "prompt_len": 4, "max_output_tokens": 1}]}')
    with pytest.raises(ScenarioError, match=r"^twice.json: key 'num_gpu_blocks' is given twice in one object$"):
        load_scenario(f)


def test_scn1_nan_and_infinity_are_not_json(tmp_path):
    """SCN-1: ``json`` reads NaN and +-Infinity; a scenario file is JSON, so they are refused at
    the syntax, before the engine args' own checks would name a field."""
    for literal in ("NaN", "Infinity", "-Infinity"):
        f = tmp_path / "odd.json"
        f.write_text('{"name": "x", "engine": {"engine_type": "vllm", "speedup_ratio": %s},'
                     ' "requests": [{"id": "A", "prompt_len": 4, "max_output_tokens": 1}]}' % literal)
        with pytest.raises(ScenarioError, match=rf"^odd.json: not valid json: {literal} is not JSON$"):
            load_scenario(f)


def test_scn3_segment_names_and_private_prompts_never_share_tokens():
    """SCN-3: "fx" and "jc" fall in the same crc32 bucket; within a scenario the later name takes
    the next free one. Private prompts stay below the segment range."""
    import zlib

    assert zlib.crc32(b"fx") % 20_000 == zlib.crc32(b"jc") % 20_000
    sc = scenario_from_dict({"name": "x", "engine": {"engine_type": "vllm", "num_gpu_blocks": 4},
                             "requests": [{"id": "A", "segments": [["fx", 4]], "max_output_tokens": 1},
                                          {"id": "B", "segments": [["jc", 4]], "max_output_tokens": 1},
                                          {"id": "C", "segments": [["fx", 2]], "max_output_tokens": 1}]})
    a, b, c = (r.tokens for r in sc.requests)
    assert not set(a) & set(b) and c == a[:2]
    from explorer.scenario import MAX_PROMPT_TOKENS, MAX_REQUESTS

    assert MAX_REQUESTS * 1_000_000 + MAX_PROMPT_TOKENS <= 2_100_000_000 < min(a)
