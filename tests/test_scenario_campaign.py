"""scripts/scenario_campaign.py: random scenarios are reproducible, and each group's kept scenario
shows the group's violation again with a counterexample of the recorded length."""

from __future__ import annotations

import importlib.util
import json
import pathlib

from explorer import explore, scenario_from_dict

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _campaign():
    spec = importlib.util.spec_from_file_location("scenario_campaign", ROOT / "scripts" / "scenario_campaign.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
        kind, _engine, mode = name.split("-")
        raw = json.loads((tmp_path / f"{name}.json").read_text())
        exp = explore(scenario_from_dict(raw))
        v = exp.violation(kind)
        assert v is not None and v.length == g["steps"] == len(g["counterexample"]), name
        # a cooperative group keeps a scenario without adversarial actions; an adversarial one keeps
        # a scenario whose finding disappears when its adversarial flags are removed
        if mode == "cooperative":
            assert not raw["adversarial"], name
        else:
            assert mode == "adversarial" and raw["adversarial"], name
            twin = explore(scenario_from_dict(dict(raw, adversarial={})))
            assert twin.violation(kind) is None, name
    assert {n.split("-")[2] for n in summary["groups"]} == {"cooperative", "adversarial"}


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
