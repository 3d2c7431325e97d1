"""scripts/check_citations.py: a spec citation that names no file of the pinned commit, a reversed
range or a range past the file's end is reported, with exit status 1; declared short names,
``mocker/`` paths and unique suffixes resolve."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from script_loader import load_script


def _checker():
    return load_script("check_citations")


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


@pytest.fixture()
def upstream(tmp_path):
    """A three-file upstream: handoff.rs of 10 lines, core.rs of 3, and tests.rs with two tests."""
    repo = tmp_path / "up"
    (repo / "lib/mocker/src/common").mkdir(parents=True)
    (repo / "lib/mocker/src/scheduler").mkdir(parents=True)
    (repo / "lib/mocker/src/common/handoff.rs").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (repo / "lib/mocker/src/scheduler/core.rs").write_text("a\nb\nc\n")
    (repo / "lib/mocker/src/scheduler/tests.rs").write_text(
        "mod t {\n"                        # 1
        "    #[test]\n"                    # 2
        "    fn first() {}\n"              # 3
        "    /// Documented.\n"            # 4
        "    #[test]\n"                    # 5
        "    #[should_panic]\n"            # 6
        "    fn second() {}\n"             # 7
        "    #[test]\n"                    # 8
        "    #[should_panic(\n"            # 9
        "        expected = \"x\"\n"       # 10
        "    )]\n"                         # 11
        "    fn third() {}\n"              # 12
        "}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "upstream")
    return repo, _git(repo, "rev-parse", "HEAD")


def _spec(tmp_path, text: str) -> pathlib.Path:
    d = tmp_path / "spec"
    d.mkdir()
    (d / "x.md").write_text(text)
    return d


def _check(upstream, tmp_path, capsys, text: str):
    """Run the checker on one spec file holding ``text``: ``(exit status, output lines)``."""
    repo, commit = upstream
    status = _checker().main([str(repo), "--commit", commit, "--spec", str(_spec(tmp_path, text))])
    return status, capsys.readouterr().out.splitlines()


def test_resolvable_citations_pass(upstream, tmp_path, capsys):
    repo, commit = upstream
    spec = _spec(tmp_path, "`h.rs` = lib/mocker/src/common/handoff.rs\n"
                           "h.rs:10, mocker/common/handoff.rs:1-10, core.rs:3, lib/mocker/src/scheduler/core.rs:2-3\n")
    assert _checker().main([str(repo), "--commit", commit, "--spec", str(spec)]) == 0
    assert capsys.readouterr().out.strip() == f"4 citations and 0 test-table rows in 1 files checked against {commit}: 0 problems"


def test_each_kind_of_broken_citation_is_one_line(upstream, tmp_path, capsys):
    repo, commit = upstream
    # core.rs has 3 lines, so :4 runs past its end; 9-2 is reversed; gone.rs is not in the tree
    spec = _spec(tmp_path, "ok handoff.rs:5\ncore.rs:2-4 and handoff.rs:9-2\nsee gone.rs:1\n")
    assert _checker().main([str(repo), "--commit", commit, "--spec", str(spec)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "x.md:2: core.rs:2-4: line 4 is past the end (lib/mocker/src/scheduler/core.rs has 3 lines)",
        "x.md:2: handoff.rs:9-2: range 9-2 is empty or reversed",
        f"x.md:3: gone.rs:1: no file gone.rs at {commit}",
        f"4 citations and 0 test-table rows in 1 files checked against {commit}: 3 problems",
    ]


def test_a_declared_short_name_wins_over_a_suffix(upstream, tmp_path, capsys):
    repo, commit = upstream
    # core.rs alone would resolve to scheduler/core.rs (3 lines); declared as handoff.rs, 8 is in range
    spec = _spec(tmp_path, "`core.rs` = lib/mocker/src/common/handoff.rs\ncore.rs:8\n")
    assert _checker().main([str(repo), "--commit", commit, "--spec", str(spec)]) == 0


def test_bad_arguments_exit_2_with_one_line(upstream, tmp_path, capsys):
    repo, commit = upstream
    spec = _spec(tmp_path, "core.rs:1\n")
    assert _checker().main([str(tmp_path / "nowhere"), "--spec", str(spec)]) == 2
    assert capsys.readouterr().err.startswith(f"error: upstream: {tmp_path / 'nowhere'}: ")
    assert _checker().main([str(repo), "--commit", "0" * 40, "--spec", str(spec)]) == 2
    assert _checker().main([str(repo), "--commit", commit, "--spec", str(tmp_path / "empty")]) == 2
    assert "error: --spec: no Markdown files under" in capsys.readouterr().err


def test_test_table_rows_must_give_the_test_line(upstream, tmp_path, capsys):
    """A ported-test table row gives the line of its test's ``fn`` or of an attribute right above
    it; another line, or a test the heading's file lacks, is one problem line each."""
    commit = upstream[1]
    assert _check(upstream, tmp_path, capsys,
                  "### lib/mocker/src/scheduler/tests.rs\n\n| upstream test (line) | port |\n|---|---|\n"
                  "| t::first (2) | ok |\n| t::second (6) | ok |\n| second, 2 cases (7) | ok |\n"
                  "| t::first (4) | wrong |\n| t::gone (1) | missing |\n\n## next\n| t::first (9) | not a table |\n") == (1, [
        "x.md:8: first (4): fn first is at lib/mocker/src/scheduler/tests.rs:2-3",
        "x.md:9: gone (1): no fn gone in lib/mocker/src/scheduler/tests.rs",
        f"0 citations and 5 test-table rows in 1 files checked against {commit}: 2 problems",
    ])


def test_abbreviations_and_cited_test_rows(upstream, tmp_path, capsys):
    """An abbreviation the file declares (`HO` = `path`, or `TS:n` cites `path`) resolves like a
    short name, and a row ``| `test` (ABBR:LINE, note) |`` must give its test's line."""
    commit = upstream[1]
    assert _check(upstream, tmp_path, capsys,
                  "* `HO` = `lib/mocker/src/common/handoff.rs`\n`TS:n` cites\n`lib/mocker/src/scheduler/tests.rs`\n"
                  "HO:10 and HO:9-11 and TS:7\n"
                  "| `first` (TS:3) | ok |\n| `second` (TS:5, should_panic) | ok |\n| `second` (TS:4) | doc line |\n"
                  "| `third` (TS:8) | ok |\n| `third` (TS:10) | inside the attribute |\n") == (1, [
        "x.md:4: HO:9-11: line 11 is past the end (lib/mocker/src/common/handoff.rs has 10 lines)",
        "x.md:7: second (TS:4): fn second is at lib/mocker/src/scheduler/tests.rs:5-7",
        "x.md:9: third (TS:10): fn third is at lib/mocker/src/scheduler/tests.rs:8-12",
        f"8 citations and 5 test-table rows in 1 files checked against {commit}: 3 problems",
    ])
