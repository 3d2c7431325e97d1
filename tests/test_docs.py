"""The documentation generated from the model (docs/generated, ``mocker-spec docs``).

The committed pages must equal what the model generates now; changing a transition table entry or
a command guard in a copy of the project must change the generated table or lifecycle diagram and
make ``--check`` fail; the CLI reference lists every subcommand of the real parser.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from mocker_spec import docs_gen
from mocker_spec.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
GEN = ROOT / "docs" / "generated"
PACKAGES = ("model", "invariants", "explorer", "mocker_spec")


def test_committed_generated_docs_are_current():
    """`mocker-spec docs --check` passes on the committed tree (exit 0, nothing stale)."""
    stale = docs_gen.check(ROOT)
    assert stale == [], "docs/generated is stale; run `mocker-spec docs`:\n" + "\n".join(
        f"  {p}: {why}" for p, why in stale)


def test_generation_is_deterministic():
    """Two generations in one process give the same text, and a process with another hash seed
    finds the committed files current (no timestamps, timings or set-iteration order)."""
    parts = ("transitions", "commands", "invariants", "cli", "lifecycle:s7-vllm-zero-time-livelock")
    assert docs_gen.generate(ROOT, parts) == docs_gen.generate(ROOT, parts)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-m", "mocker_spec.cli", "docs", "--check", "--root", str(ROOT),
                           "--only", "lifecycle:s7-vllm-zero-time-livelock", "--only", "transitions"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _subcommands():
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    raise AssertionError("the parser has no subcommands")


def test_cli_reference_lists_every_subcommand_and_option():
    text = (GEN / "cli.md").read_text(encoding="utf-8")
    subs = _subcommands()
    assert {"transitions", "invariants", "replay", "diff", "gen-cases", "explore", "docs"} <= set(subs)
    for name, sub in subs.items():
        assert f"\n## {name}\n" in text, f"subcommand {name} missing from docs/generated/cli.md"
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"`{opt}`" in section, f"{name} {opt} missing from the CLI reference"


def test_rule_index_and_quirks_cover_the_spec():
    """Every rule id a spec file defines has an anchor in the rule index; every VLLM-Qn and PEND-Qn
    quirk is in the quirks table, linked to its spec section."""
    index = (GEN / "rule-index.md").read_text(encoding="utf-8")
    quirks = (GEN / "quirks.md").read_text(encoding="utf-8")
    defs = docs_gen.rule_definitions(ROOT)
    assert len(defs) > 300
    for rule in ("PEND-Q1", "VLLM-13", "CMD-8", "RETRY-4", "MC-45", "TIME-9", "SCN-4"):
        assert rule in defs
    for rule in defs:
        assert f'<a id="{rule.lower()}"></a>' in index, rule
    spec_quirks = re.findall(r"\*\*((?:VLLM|PEND)-Q\d+) —", (ROOT / "spec" / "vllm-core.md").read_text()
                             + (ROOT / "spec" / "handoff-lifecycle.md").read_text())
    assert len(spec_quirks) >= 9
    for q in spec_quirks:
        assert f"[{q}](rule-index.md#{q.lower()})" in quirks
        assert re.search(rf"\[{q}\]\(rule-index.md#{q.lower()}\) \| [^|]+ \| \[spec/", quirks), q


def _anchors(page: pathlib.Path) -> set:
    seen: dict = {}
    text = page.read_text(encoding="utf-8")
    found = {docs_gen.slug(m.group(2), seen) for m in map(docs_gen.HEADING_RE.match, text.splitlines()) if m}
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


def test_links_into_generated_pages_resolve():
    """Hand-written pages link into docs/generated (pages, diagrams, gallery anchors); those links
    must survive regeneration, e.g. a renamed scenario or defect."""
    checked = 0
    for page in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]*generated/[^)\s]*)\)", page.read_text(encoding="utf-8")):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve()
            if dest.suffix == ".svg" and not docs_gen.have_dot() and not dest.exists():
                continue
            assert dest.exists(), f"{page.name}: {target} does not exist"
            if anchor:
                assert anchor in _anchors(dest), f"{page.name}: no anchor #{anchor} in {path}"
            checked += 1
    assert checked >= 20


def test_slug_follows_the_markdown_heading_rule():
    assert docs_gen.slug("6. Reproduced quirks") == "6-reproduced-quirks"
    assert docs_gen.slug("4. ActiveHandoffRequests (`model/active_handoffs.py`)") == \
        "4-activehandoffrequests-modelactive_handoffspy"
    assert docs_gen.slug("The vLLM / TRT-LLM engine core") == "the-vllm--trt-llm-engine-core"
    seen = {}
    assert [docs_gen.slug("Notes", seen), docs_gen.slug("Notes", seen)] == ["notes", "notes-1"]


# ------------------------------------------------------------------------------------------------
# a changed model changes the generated documentation
# ------------------------------------------------------------------------------------------------


def _project_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "project"
    for d in PACKAGES + ("spec",):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(GEN, root / "docs" / "generated")
    return root


def _docs(root: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "mocker_spec.cli", "docs", "--root", str(root), *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _edit(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path.name}: expected exactly one {old!r}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_changed_transition_entry_changes_the_generated_table(tmp_path):
    root = _project_copy(tmp_path)
    before = (root / "docs/generated/transitions.md").read_text(encoding="utf-8")
    proc = _docs(root, "--check", "--only", "transitions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _edit(root / "model" / "pending_destinations.py",
          'change="pop tombstones off the FIFO front"', 'change="pop tombstones and duplicates off the FIFO front"')
    proc = _docs(root, "--check", "--only", "transitions")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "docs/generated/transitions.md: differs" in proc.stdout
    proc = _docs(root, "--only", "transitions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = (root / "docs/generated/transitions.md").read_text(encoding="utf-8")
    assert "pop tombstones off the FIFO front" in before
    assert "pop tombstones and duplicates off the FIFO front" in after
    assert "pop tombstones off the FIFO front" not in after


def test_changed_guard_changes_the_lifecycle_diagram(tmp_path):
    """CMD-8 with the reserved stage removed from its guard: a reserved destination can no longer be
    cancelled, so the D_reserved -> D_absent edge leaves the quotient diagram."""
    root = _project_copy(tmp_path)
    stem = "docs/generated/lifecycle/vllm-decode-three-handoffs--hA-hB-hC"
    before = (root / f"{stem}.mmd").read_text(encoding="utf-8")
    assert re.search(r"s\d+ --> s\d+: cancel_destination \[adv\]", before)
    reserved = re.search(r'state "D_reserved" as (s\d+)', before).group(1)
    absent = re.search(r'state "D_absent" as (s\d+)', before).group(1)
    assert f"{reserved} --> {absent}: cancel_destination [adv]" in before
    _edit(root / "model" / "handoff_commands.py",
          "        holds, entry = txn.ledger.destination_holds.remove(h)\n",
          "        holds, entry = txn.ledger.destination_holds, None\n")
    part = "lifecycle:vllm-decode-three-handoffs"
    proc = _docs(root, "--check", "--only", part)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{stem}.mmd: differs" in proc.stdout
    assert f"{stem}.dot: differs" in proc.stdout
    proc = _docs(root, "--only", part)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = (root / f"{stem}.mmd").read_text(encoding="utf-8")
    r2 = re.search(r'state "D_reserved" as (s\d+)', after).group(1)
    a2 = re.search(r'state "D_absent" as (s\d+)', after).group(1)
    assert f"{r2} --> {a2}: cancel_destination [adv]" not in after
    assert "activate" in after
    proc = _docs(root, "--check", "--only", part)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stale_and_unexpected_files_are_reported(tmp_path):
    root = _project_copy(tmp_path)
    (root / "docs/generated/invariants.md").write_text("edited by hand\n", encoding="utf-8")
    (root / "docs/generated/orphan.md").write_text("left over\n", encoding="utf-8")
    stale = dict(docs_gen.check(root, files=docs_gen.generate(ROOT, ("invariants",))))
    assert stale["docs/generated/invariants.md"] == "differs"
    assert stale["docs/generated/orphan.md"] == "not generated any more"


@pytest.mark.skipif(not docs_gen.have_dot(), reason="graphviz dot is not installed")
def test_svg_records_its_dot_source():
    dot = (GEN / "lifecycle" / "s7-vllm-zero-time-livelock--hX-hY.dot").read_text(encoding="utf-8")
    svg = docs_gen.render_svg(dot)
    assert "<svg" in svg and "Generated by graphviz" not in svg
    assert docs_gen._svg_hash(svg) == docs_gen._dot_hash(dot)
    assert docs_gen._svg_hash(svg) != docs_gen._dot_hash(dot.replace("pass", "step"))


def test_lifecycle_page_shows_each_goal_with_its_shortest_run():
    """MC-34 in the docs: the lifecycle page follows each scenario's diagrams with its goals'
    shortest runs; a run's table has one row per step after the initial state (none folded here:
    every step changes the view) and its length is the witness the explorer finds."""
    from explorer import explore, load_scenario

    page = (ROOT / "docs" / "generated" / "lifecycle.md").read_text(encoding="utf-8")
    exp = explore(load_scenario(ROOT / "spec" / "scenarios" / "clean" / "vllm-decode-three-handoffs.json"))
    for r in exp.goals:
        head = f'### vllm-decode-three-handoffs: shortest run to "{r.goal.name}"'
        assert head in page
        section = page.split(head, 1)[1].split("\n### ", 1)[0]
        assert f"{r.witness.length} steps." in section
        rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| step")]
        assert len(rows) == r.witness.length + 1 and rows[-1].startswith(f"| {r.witness.length} |")


def test_fold_steps_merges_repeats_but_not_across_the_loop_start():
    """MC-40: a counterexample table folds consecutive steps with the same action, outcome and
    view into one row ``first–last (count×)``; a changed view, outcome or action starts a new row,
    and the lasso's loop start (0-based ``loop_index``) always starts its own row, marked ``↻``."""
    fold = docs_gen._fold_steps
    a, b = ("v", "a"), ("v", "b")
    steps = [(1, "pass", False, "progress", a), (2, "pass", False, "progress", a),
             (3, "pass", False, "progress", a), (4, "pass", False, "progress", b),
             (5, "pass", False, "noop", b), (6, "cancel", True, "noop", b)]
    assert [r[0] for r in fold(steps, None)] == ["1–3 (3×)", "4", "5", "6"]
    assert [r[1:] for r in fold(steps, None)][0] == ("pass", False, "progress", a)
    # the loop starts at step 2 (index 1): steps 1 and 2-3 are separate rows
    assert [r[0] for r in fold(steps, 1)] == ["1", "↻ 2–3 (2×)", "4", "5", "6"]
    assert [r[0] for r in fold(steps, 0)] == ["↻ 1–3 (3×)", "4", "5", "6"]
    assert list(fold([], None)) == []


def test_doc_body_is_everything_after_the_first_paragraph():
    """The CLI reference prints a module's docstring less its first paragraph, on one line."""
    assert docs_gen._doc_body("Title.\n\nSecond\n  para.\n\nThird.") == "Second para. Third."
    assert docs_gen._doc_body("Only a title.") == ""
    assert docs_gen._doc_body(None) == ""


def test_looks_like_rule_needs_a_known_area_or_three_ids_of_a_new_one():
    """The rule index lists an id cited in code but defined nowhere when its area is a spec area,
    or when code cites at least three distinct ids of the same unknown area (a new area). The ids
    are built at run time so this file cites none of them."""
    known, new = "Q" * 2, "Z" * 2
    defs = {f"{known}-1": None}
    code = {f"{known}-1": {}, f"{known}-99": {}, f"{new}-1": {}, f"{new}-2": {}}
    assert docs_gen._looks_like_rule(f"{known}-99", defs, code)
    assert not docs_gen._looks_like_rule(f"{new}-1", defs, code)
    code[f"{new}-3"] = {}
    assert docs_gen._looks_like_rule(f"{new}-1", defs, code)


def test_model_errors_table_follows_subclasses_across_modules(tmp_path):
    """The error table lists every class of ``model/`` that derives from ``ModelError`` (directly,
    through another error, or by an attribute base), with its ``rule``, in module then name order;
    ``ModelError`` itself is listed only where ``model/`` defines it."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "b.py").write_text(
        "from . import a\n"
        "class Zed(a.Alpha):\n    '''Last.'''\n    rule = 'X-2'\n"
        "class Beta(Exception):\n    pass\n"
        "class Gamma(Zed):\n    rule: str = 'X-3'\n")
    (tmp_path / "model" / "a.py").write_text(
        "from elsewhere import ModelError\n"
        "class Alpha(ModelError):\n    '''First.'''\n    rule = 'X-1'\n")
    rows = docs_gen._model_errors(tmp_path)
    assert rows == [("Alpha", "model.a", "ModelError", "X-1", "First."),
                    ("Gamma", "model.b", "Zed", "X-3", ""),
                    ("Zed", "model.b", "Alpha", "X-2", "Last.")]
    (tmp_path / "model" / "errors.py").write_text("class ModelError(Exception):\n    '''Base.'''\n")
    assert docs_gen._model_errors(tmp_path)[-1] == ("ModelError", "model.errors", "Exception", "", "Base.")
