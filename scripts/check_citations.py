#!/usr/bin/env python3
"""Check that every upstream citation in spec/ points into an existing file and range.

The spec cites upstream as ``path:line`` or ``path:first-last`` at the pinned commit
(spec/README.md). This script reads every ``*.md`` under the spec folder, resolves each cited path
in the tree of that commit and reports a citation whose file is not there, or whose range is
reversed or runs past the file's last line. It checks where a citation points, not what the cited
lines say: that part stays a reader's job.

A cited path is resolved in this order:
1. a short name the spec file declares: `kvbm.rs` = lib/... or `handoff.rs` is `lib/...`, or an
   abbreviation it declares (`RC` = `lib/...rs`, or `SB:n` cites `lib/...rs`), cited as ``RC:12``;
2. the path itself;
3. ``mocker/...`` as ``lib/mocker/src/...``;
4. any file whose path ends with ``/`` + the cited path (the citation holds when one of them, the
   ones under ``lib/mocker/src/`` first, holds the range).
Bare line numbers (``(817-830)`` in the core specs, which name their default file in prose) are not
checked.

The tables of ported upstream tests are checked too: under a heading ``### lib/...rs`` (one or more
paths), a row ``| module::test_name (LINE) | ...`` must give the line of ``fn test_name`` in one of
the heading's files or of an attribute line (``#[test]``...) just above it; so must a row
``| `test_name` (FILE:LINE) | ...`` anywhere, FILE being a cited path or a declared abbreviation.

Usage: python scripts/check_citations.py UPSTREAM [--commit REV] [--spec DIR]

UPSTREAM is a clone (or bare git directory) of ai-dynamo/dynamo that holds the commit. Exit
status: 0 when every citation resolves, 1 when some do not (one line each), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

PINNED_COMMIT = "a822423412a0"
ROOT = pathlib.Path(__file__).resolve().parent.parent

#: ``name.rs:12`` or ``name.rs:12-40``
CITATION = re.compile(r"(?<![\w./-])([A-Za-z0-9_][\w./-]*\.(?:rs|py|toml)):(\d+)(?:-(\d+))?")
#: a heading over a table of upstream tests, and one row of it
TEST_TABLE_HEADING = re.compile(r"^### .*?((?:lib|components)/\S+\.rs)")
TEST_TABLE_PATHS = re.compile(r"(?:lib|components)/[\w./-]+\.rs")
TEST_ROW = re.compile(r"^\| (?:\w+::)*(\w+)(?:, \d+ cases)? \((\d+)\) \|")
TEST_ROW_CITED = re.compile(r"^\| `(\w+)` \(([A-Z]{2,}|[\w./-]+\.rs):(\d+)(?:, [^)]*)?\) \|")
#: a declared abbreviation: `RC` = `lib/...rs`, or `SB:n` cites `lib/...rs`
ABBREVIATION = re.compile(r"`([A-Z]{2,})(?::n)?`\s*(?:=|cites)\s*`((?:lib|components)/[\w./-]+\.rs)`")
#: a declared short name: `kvbm.rs` = lib/... or `handoff.rs` is `lib/...`
SHORT_NAME = re.compile(r"`([\w./-]+\.(?:rs|py))`\s*(?:=|is)\s*`?((?:lib|components)/[\w./-]+\.(?:rs|py))")


class UpstreamTree:
    """The files of one upstream commit, read through git."""

    def __init__(self, upstream: str, commit: str) -> None:
        self.upstream = upstream
        self.commit = commit
        listing = self._git("ls-tree", "-r", "--name-only", commit)
        self.paths: List[str] = listing.split("\n") if listing else []
        self._lines: Dict[str, int] = {}
        self._text: Dict[str, List[str]] = {}

    def _git(self, *args: str) -> str:
        proc = subprocess.run(["git", "-C", self.upstream, *args], capture_output=True, text=True)
        if proc.returncode != 0:
            msg = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"git {args[0]} failed"
            raise RuntimeError(msg)
        return proc.stdout.strip("\n")

    def line_count(self, path: str) -> int:
        if path not in self._lines:
            self._lines[path] = len(self.lines(path))
        return self._lines[path]

    def lines(self, path: str) -> List[str]:
        if path not in self._text:
            text = self._git("show", f"{self.commit}:{path}")
            self._text[path] = text.split("\n") if text else []
        return self._text[path]

    def test_lines(self, path: str, name: str) -> List[int]:
        """The lines a test table may give for ``fn name`` in ``path``: the ``fn`` line and the
        attribute lines right above it (doc comments between them are skipped)."""
        lines = self.lines(path)
        fn = re.compile(r"\bfn %s\b" % re.escape(name))
        out: List[int] = []
        for i, text in enumerate(lines):
            if fn.search(text):
                out.append(i + 1)
                j = i - 1
                while j >= 0:
                    text_j = lines[j].strip()
                    if text_j.startswith("#["):
                        out.append(j + 1)
                    elif text_j.endswith("]") and not text_j.startswith("//"):
                        # the last line of an attribute written over several lines
                        while j > 0 and not lines[j].strip().startswith("#["):
                            j -= 1
                        out.append(j + 1)
                    elif not text_j.startswith("//"):
                        break
                    j -= 1
        return out

    def candidates(self, cited: str, short_names: Dict[str, str]) -> List[str]:
        """Files the cited path may name, best first (see the module docstring)."""
        if cited in short_names:
            return [short_names[cited]] if short_names[cited] in self.paths else []
        if cited in self.paths:
            return [cited]
        if cited.startswith("mocker/"):
            full = "lib/mocker/src/" + cited[len("mocker/"):]
            if full in self.paths:
                return [full]
        found = [p for p in self.paths if p.endswith("/" + cited)]
        return sorted(found, key=lambda p: (not p.startswith("lib/mocker/src/"), p))


def short_names_of(text: str) -> Dict[str, str]:
    names = {name: path for name, path in SHORT_NAME.findall(text)}
    names.update(ABBREVIATION.findall(text))
    return names


def _citations(line: str, names: Dict[str, str]):
    """``(text, cited path, first, last)`` of each citation on ``line``."""
    for m in CITATION.finditer(line):
        yield m.group(0), m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else int(m.group(2))
    abbrevs = [n for n in names if re.fullmatch(r"[A-Z]{2,}", n)]
    if abbrevs:
        pattern = r"(?<![\w./-])(%s):(\d+)(?:-(\d+))?" % "|".join(map(re.escape, abbrevs))
        for m in re.finditer(pattern, line):
            yield m.group(0), m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else int(m.group(2))


def check_file(tree: UpstreamTree, md: pathlib.Path) -> Tuple[int, int, List[str]]:
    """``(citations checked, test-table rows checked, problem lines)`` for one spec file."""
    text = md.read_text(encoding="utf-8")
    names = short_names_of(text)
    checked = rows = 0
    problems: List[str] = []
    table: List[str] = []  # the files of the test table under the current heading
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            table = TEST_TABLE_PATHS.findall(line) if TEST_TABLE_HEADING.match(line) else []
        row = TEST_ROW.match(line) if table else None
        if row:
            rows += 1
            problem = _row_problem(tree, table, row.group(1), int(row.group(2)))
            if problem is not None:
                problems.append(f"{md.name}:{lineno}: {row.group(1)} ({row.group(2)}): {problem}")
        cited_row = TEST_ROW_CITED.match(line)
        if cited_row:
            rows += 1
            name, cited = cited_row.group(1), cited_row.group(2)
            paths = tree.candidates(cited, names)[:1] or [names.get(cited, cited)]
            problem = _row_problem(tree, paths, name, int(cited_row.group(3)))
            if problem is not None:
                problems.append(f"{md.name}:{lineno}: {name} ({cited}:{cited_row.group(3)}): {problem}")
        for text_, cited, first, last in _citations(line, names):
            checked += 1
            where = f"{md.name}:{lineno}: {text_}"
            problem = _problem(tree, cited, first, last, names)
            if problem is not None:
                problems.append(f"{where}: {problem}")
    return checked, rows, problems


def _row_problem(tree: UpstreamTree, paths: List[str], name: str, line: int) -> Optional[str]:
    found = [p for p in paths if p in tree.paths]
    if not found:
        return f"no file {' or '.join(paths)} at {tree.commit}"
    places = {p: tree.test_lines(p, name) for p in found}
    if any(line in ls for ls in places.values()):
        return None
    at = [f"{p}:{min(ls)}-{max(ls)}" for p, ls in places.items() if ls]
    return f"fn {name} is at {', '.join(at)}" if at else f"no fn {name} in {', '.join(found)}"


def _problem(tree: UpstreamTree, cited: str, first: int, last: int, names: Dict[str, str]) -> Optional[str]:
    if first < 1 or last < first:
        return f"range {first}-{last} is empty or reversed"
    cands = tree.candidates(cited, names)
    if not cands:
        return f"no file {cited} at {tree.commit}"
    if any(tree.line_count(p) >= last for p in cands):
        return None
    sizes = ", ".join(f"{p} has {tree.line_count(p)} lines" for p in cands[:3])
    return f"line {last} is past the end ({sizes})"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Check the spec's upstream citations against the pinned commit.")
    parser.add_argument("upstream", help="a clone or bare git directory of ai-dynamo/dynamo")
    parser.add_argument("--commit", default=PINNED_COMMIT, help=f"the pinned commit (default {PINNED_COMMIT})")
    parser.add_argument("--spec", default=str(ROOT / "spec"), help="the folder of spec Markdown files")
    args = parser.parse_args(argv)
    spec = pathlib.Path(args.spec)
    files = sorted(spec.glob("*.md"))
    if not files:
        print(f"error: --spec: no Markdown files under {spec}", file=sys.stderr)
        return 2
    try:
        tree = UpstreamTree(args.upstream, args.commit)
    except (RuntimeError, OSError) as exc:
        print(f"error: upstream: {args.upstream}: {exc}", file=sys.stderr)
        return 2
    total = rows = 0
    problems: List[str] = []
    for md in files:
        n, r, found = check_file(tree, md)
        total += n
        rows += r
        problems.extend(found)
    for p in problems:
        print(p)
    print(f"{total} citations and {rows} test-table rows in {len(files)} files checked against {args.commit}: "
          f"{len(problems)} problem{'s' if len(problems) != 1 else ''}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
