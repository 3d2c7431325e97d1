"""scripts/scenario_campaign.py: random scenarios are reproducible, and each group's kept scenario
shows the group's violation again with a counterexample of the recorded length."""

from __future__ import annotations

import json
import pathlib

from explorer import explore, scenario_from_dict
from explorer.outputs import deadlock_diagnosis
from script_loader import load_script

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _campaign():
    return load_script("scenario_campaign")


def test_random_scenarios_are_a_function_of_seed_and_index_and_all_load():
    camp = _campaign()
    first = [camp.random_scenario(3, i, 1000) for i in range(30)]
    assert first == [camp.random_scenario(3, i, 1000) for i in range(30)]
    assert first != [camp.random_scenario(4, i, 1000) for i in range(30)]
    for raw in first:  # SCN-1: every generated scenario is valid
        scenario_from_dict(raw)


def test_each_group_keeps_a_scenario_that_shows_its_violation(tmp_path, capsys):
    camp = _campaign()
    assert camp.main(["--seed", "1", "--count", "6", "--max-states", "3000", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["count"] == 6 and summary["groups"]
    for name, g in summary["groups"].items():
        assert 1 <= g["scenarios"] <= 6
        kind, _engine, mode = name.split("-")  # no shape suffix without --by-shape
        raw = json.loads((tmp_path / f"{name}.json").read_text())
        exp = explore(scenario_from_dict(raw))
        v = exp.violation(kind)
        assert v is not None and v.length == g["steps"] == len(g["counterexample"]), name
        # a deadlock group carries the dead-end diagnosis of its kept counterexample (LIVE-6, MC-48)
        if kind == "deadlock":
            assert g["cause"] == deadlock_diagnosis(exp, v).cause, name
        else:
            assert "cause" not in g, name
        # a cooperative group keeps a scenario without adversarial actions; an adversarial one keeps
        # a scenario whose finding disappears when its adversarial flags are removed
        if mode == "cooperative":
            assert not raw["adversarial"], name
        else:
            assert mode == "adversarial" and raw["adversarial"], name
            twin = explore(scenario_from_dict(dict(raw, adversarial={})))
            assert twin.violation(kind) is None, name
    assert {n.split("-")[2] for n in summary["groups"]} == {"cooperative", "adversarial"}
    assert any(n.startswith("deadlock") for n in summary["groups"])


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys):
    camp = _campaign()
    assert camp.main(["--count", "0"]) == 2
    assert "--count must be at least 1, got 0" in capsys.readouterr().err
    not_a_dir = tmp_path / "f"
    not_a_dir.write_text("")
    assert camp.main(["--count", "1", "--out", str(not_a_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a directory" in err
    assert not_a_dir.read_text() == ""


def test_by_shape_splits_groups_by_the_stuck_state_and_each_kept_scenario_stops_in_its_shape(tmp_path):
    camp = _campaign()
    plain, shaped = tmp_path / "plain", tmp_path / "shaped"
    assert camp.main(["--seed", "8", "--count", "10", "--max-states", "1500", "--out", str(plain)]) == 0
    assert camp.main(["--seed", "8", "--count", "10", "--max-states", "1500", "--by-shape",
                      "--out", str(shaped)]) == 0
    by_kind = json.loads((plain / "summary.json").read_text())["groups"]
    summary = json.loads((shaped / "summary.json").read_text())
    assert summary["by_shape"] is True
    groups = summary["groups"]
    # every shaped group refines exactly one plain group, and the refinement loses no scenario
    for name, g in by_kind.items():
        parts = {n: s for n, s in groups.items() if n.rsplit("-", 1)[0] == name}
        assert parts and sum(s["scenarios"] for s in parts.values()) == g["scenarios"], name
        assert min(s["steps"] for s in parts.values()) == g["steps"], name
    assert len(groups) > len(by_kind)  # seed 8's first ten show two properties in two shapes each
    for name, g in groups.items():
        kind = name.split("-")[0]
        assert name == camp.group_name(kind, name.split("-")[1], name.split("-")[2], g["shape"])
        raw = json.loads((shaped / f"{name}.json").read_text())
        exp = explore(scenario_from_dict(raw))
        v = exp.violation(kind)
        assert v is not None and v.length == g["steps"] and camp.shape_of(exp, v) == g["shape"], name
        assert not any(p in g["shape"].split(" | ")[-3].split("+") for p in camp.SETTLED_PHASES), name


def test_shape_of_the_s6_fresh_head_deadlock():
    """By hand from test_s6_shortest_form_is_a_fresh_head_in_front_of_an_activated_destination: F
    (plain, fresh) and the activated destination Y both wait, nothing runs, one block is free."""
    from explorer import load_scenario

    camp = _campaign()
    exp = explore(load_scenario(ROOT / "spec" / "scenarios" / "known-defects" / "s6-vllm-fresh-head-deadlock.json"))
    assert camp.shape_of(exp, exp.violation("deadlock")) == "D_active(waiting)+waiting(fresh) | waiting | pool free"


def test_an_over_committed_sglang_pool_is_exhausted_not_free():
    """Campaign --seed 9: an S9-like livelock whose running destination R1 holds every slot of a
    12-slot pool (3 pages of 4) with output still to reserve. By hand (SG-6): ceil((12 in use + at
    least 1 reserved) / 4) = 4 active pages of 3, so the view's free count is -1, and the shape must
    call that pool exhausted (it said "free" while the check was ``== 0``)."""
    camp = _campaign()
    raw = {"name": "over-committed", "engine": {"engine_type": "sglang", "block_size": 4, "num_gpu_blocks": 3,
                                                "sglang": {"schedule_conservativeness": 0.0}},
           "requests": [{"id": "R0", "role": "source", "handoff": "h1", "prompt_len": 1, "max_output_tokens": 2},
                        {"id": "R1", "role": "destination", "handoff": "h2", "prompt_len": 8, "max_output_tokens": 3}]}
    exp = explore(scenario_from_dict(raw))
    v = exp.violation("livelock")
    assert v is not None and exp.views[v.node][3] == -1
    assert camp.shape_of(exp, v) == "D_active(running)+S_held | running | pool exhausted"


def test_minimize_keeps_the_shape_and_no_single_step_smaller_scenario_shows_it():
    """S6's 3-step form shrinks to a scenario that still deadlocks in the same shape, from which no
    one reduction step keeps that; and it stays an interaction of its two requests: by hand, F alone
    (2 of 3 blocks) and Y alone (2 of 3 blocks) both drain."""
    camp = _campaign()
    raw = json.loads((ROOT / "spec" / "scenarios" / "known-defects" / "s6-vllm-fresh-head-deadlock.json").read_text())
    shape = "D_active(waiting)+waiting(fresh) | waiting | pool free"  # test_shape_of_the_s6_fresh_head_deadlock
    small, exp = camp.minimize(raw, "deadlock", shape)
    assert camp.shape_of(exp, exp.violation("deadlock")) == shape
    assert len(small["requests"]) == 2 and small["engine"]["num_gpu_blocks"] <= raw["engine"]["num_gpu_blocks"]
    steps = exp.violation("deadlock").length
    assert steps <= 3  # the file's counterexample length (its expect.max_steps)
    for cand in camp._smaller(small):
        assert camp._shows(cand, "deadlock", shape, steps) is None, cand
    assert camp.alone(small, "deadlock") == []
    assert camp.alone(raw, "deadlock") == []


def test_minimize_option_writes_minimal_scenarios_that_still_show_their_group(tmp_path):
    camp = _campaign()
    assert camp.main(["--seed", "8", "--count", "10", "--max-states", "1500", "--by-shape", "--minimize",
                      "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["minimized"] is True and summary["groups"]
    for name, g in summary["groups"].items():
        kind = name.split("-")[0]
        raw = json.loads((tmp_path / f"{name}.json").read_text())
        exp = explore(scenario_from_dict(raw))
        v = exp.violation(kind)
        assert v is not None and v.length == g["steps"] and camp.shape_of(exp, v) == g["shape"], name
        assert set(g["alone"]) <= {r["id"] for r in raw["requests"]}, name
        assert ("cause" in g) == (kind == "deadlock"), name


