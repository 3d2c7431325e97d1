#!/usr/bin/env python3
"""The README's totals of the recorded `gen-cases` families, computed from spec/fidelity.md.

spec/fidelity.md §2 has one table row per recorded family (its command, cases, identical cases,
outcomes); its *Cases of FID-7* table names every divergent case with its family. This script
reads both, checks that they agree -- each family's differences are exactly the FID-7 cases the
table gives for it, and each FID-7 case of a `gen-cases` family belongs to a recorded family --
and prints the README's totals: one row per kind of family (plain, the widening variants,
`--large`, `--tight`, `--tiny`), with the families, cases, identical cases and outcomes summed.

Usage: python scripts/fidelity_totals.py [--check | --write]

With no option it prints the rows. `--check` exits 1 when README.md's block (between the
`fidelity-totals` markers) is not what it would print, `--write` rewrites that block. Either
exits 1, naming the family, when the two tables of spec/fidelity.md disagree, and 2 when a file
cannot be read or a row of the tables cannot be parsed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import attrs

from mocker_spec.formats import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
FIDELITY = ROOT / "spec" / "fidelity.md"
README = ROOT / "README.md"
BEGIN = "<!-- fidelity-totals: begin (scripts/fidelity_totals.py --write) -->"
END = "<!-- fidelity-totals: end -->"

#: gen-cases flags that only say how the family was run, not what it draws
_RUN_FLAGS = ("--count", "--timeout", "--jobs", "--start")
_VARIANTS = ("--concurrency", "--extra-args", "--sessions")

#: a family's identity: its drawing flags and its seed
FamilyKey = Tuple[FrozenSet[str], int]


class TablesError(ValueError):
    """A row of spec/fidelity.md that cannot be parsed, or the two tables disagree."""


@attrs.frozen
class Family:
    key: FamilyKey
    command: str
    cases: int
    identical: int
    completed: int
    dead_ends: int
    hangs: int
    requests: Optional[int] = None  # as the row gives it ("(6,803 requests")

    @property
    def kind(self) -> str:
        return family_kind(self.key[0])


def family_key(command: str) -> FamilyKey:
    """`--large --sessions --seed 223 --count 60` -> ({--large, --sessions}, 223)."""
    words = command.split()
    flags, seed, i = set(), None, 0
    while i < len(words):
        word = words[i]
        if word == "--seed":
            seed = int(words[i + 1])
            i += 2
        elif word in _RUN_FLAGS:
            i += 2
        elif word.startswith("--"):
            flags.add(word)
            i += 1
        else:
            raise TablesError(f"family command {command!r}: unexpected word {word!r}")
    if seed is None:
        raise TablesError(f"family command {command!r}: no --seed")
    return frozenset(flags), seed


#: the kinds, in the README's order, with the text of their row
KINDS = (
    ("plain", "plain: `gen-cases --seed S`"),
    ("variants", "with `--concurrency`, `--extra-args` or `--sessions` (one or more)"),
    ("large", "`--large` ({requests} requests a family), with or without those"),
    ("tight", "`--tight` (every pool cut to the largest request's need plus 0-50%), with any of those"),
    ("tiny", "`--tiny` edge cases (pools of 1-8 blocks, 1-4 requests), with any of those"),
)


def family_kind(flags: FrozenSet[str]) -> str:
    if "--tiny" in flags:
        return "tiny"
    if "--tight" in flags:
        return "tight"
    if "--large" in flags:
        return "large"
    if flags & set(_VARIANTS):
        return "variants"
    if flags:
        raise TablesError(f"family flags {sorted(flags)}: not a known kind")
    return "plain"


_FAMILY_ROW = re.compile(r"^\| [^|`]*`(?P<command>[^`]*--count[^`]*)`[^|]* \| (?P<cases>\d+) \| (?:\*\*)?(?P<identical>\d+)(?:\*\*)? \| (?P<outcomes>[^|]*) \|$")
_OUTCOMES = re.compile(r"^(\d+) / (\d+) / (\d+)")
_REQUESTS = re.compile(r"\(([\d,]+) requests")
_FID7_ROW = re.compile(r"^\| (?P<case>[a-z]+-\d+-\d+) \| `(?P<family>[^`]*)` \|")


def _section(text: str, start: str, stop: str) -> str:
    try:
        head = text.index(start)
        return text[head:text.index(stop, head)]
    except ValueError:
        raise TablesError(f"spec/fidelity.md: no section from {start!r} to {stop!r}") from None


def parse_families(text: str) -> List[Family]:
    """Every family row of §2's table (rows whose command has a `--count`)."""
    out: List[Family] = []
    for line in _section(text, "## 2. Figures", "**Cases of FID-7.**").splitlines():
        if not line.startswith("|") or "--count" not in line:
            continue
        m = _FAMILY_ROW.match(line)
        if m is None:
            raise TablesError(f"spec/fidelity.md §2: cannot parse the row {line[:80]!r}")
        outcomes = _OUTCOMES.match(m["outcomes"].strip())
        if outcomes is None:
            raise TablesError(f"spec/fidelity.md §2: no 'ok / dead end / hang' figures in {line[:80]!r}")
        command = m["command"]
        requests = _REQUESTS.search(line)
        out.append(Family(family_key(command), command, int(m["cases"]), int(m["identical"]),
                          *(int(g) for g in outcomes.groups()),
                          requests=int(requests[1].replace(",", "")) if requests else None))
    keys = Counter(f.key for f in out)
    twice = [f.command for f in out if keys[f.key] > 1]
    if twice:
        raise TablesError(f"spec/fidelity.md §2: the family {twice[0]!r} has more than one row")
    return out


def parse_fid7_cases(text: str) -> List[Tuple[str, str]]:
    """The (case, family command) pairs of the *Cases of FID-7* table."""
    table = _section(text, "| case | family |", "\n\n")
    return [(m["case"], m["family"]) for m in map(_FID7_ROW.match, table.splitlines()) if m]


def check_tables(families: Sequence[Family], fid7: Sequence[Tuple[str, str]]) -> None:
    """Each family's differences are its FID-7 cases, and each FID-7 case of a `gen-cases` family
    (the others come from scripts/refusal_fuzz.py) is in a recorded family."""
    by_key: Dict[FamilyKey, Family] = {f.key: f for f in families}
    named: Counter = Counter()
    for case, command in fid7:
        if command.startswith("refusal_fuzz.py"):
            continue
        key = family_key(command)
        if key not in by_key:
            raise TablesError(f"FID-7 case {case}: its family {command!r} has no row in §2")
        named[key] += 1
    for f in families:
        if f.cases - f.identical != named[f.key]:
            raise TablesError(f"family {f.command!r}: {f.cases - f.identical} differences in §2, "
                              f"{named[f.key]} in the FID-7 table")


def _count(n: int) -> str:
    return f"{n:,}"


def totals_rows(families: Sequence[Family]) -> List[str]:
    """The README rows: one per kind present, then the sum."""
    rows = []
    groups = [(text, [f for f in families if f.kind == kind]) for kind, text in KINDS]
    groups.append(("all recorded families", list(families)))
    for text, members in groups:
        if not members:
            continue
        if "{requests}" in text:
            sizes = [f.requests for f in members if f.requests is not None]
            text = text.format(requests=f"{_count(min(sizes))}-{_count(max(sizes))}" if sizes else "many")
        cases = sum(f.cases for f in members)
        identical = sum(f.identical for f in members)
        differences = cases - identical
        verdict = f"{_count(identical)}/{_count(cases)}"
        if differences:
            verdict += (": the difference is FID-7" if differences == 1
                        else f": the {_count(differences)} differences are FID-7")
        else:
            verdict = f"**{verdict}**"
        outcomes = "{} / {} / {}".format(*(_count(sum(getattr(f, a) for f in members))
                                           for a in ("completed", "dead_ends", "hangs")))
        rows.append(f"| {text} | {len(members)} | {_count(cases)} | {outcomes} | {verdict} |")
    return rows


def block(families: Sequence[Family]) -> str:
    head = ["| recorded `gen-cases` families | families | cases | completed / dead ends / reference hangs | identical |",
            "|---|---|---|---|---|"]
    return "\n".join([BEGIN, *head, *totals_rows(families), END])


def readme_with_block(readme: str, new_block: str) -> str:
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        raise TablesError("README.md: no fidelity-totals block (its begin and end markers)")
    return readme[:start] + new_block + readme[stop + len(END):]


def main(argv: Optional[Sequence[str]] = None, *, fidelity: Path = FIDELITY, readme: Path = README) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when README.md's block is out of date")
    mode.add_argument("--write", action="store_true", help="rewrite README.md's block")
    args = parser.parse_args(argv)
    try:
        text = fidelity.read_text(encoding="utf-8")
        current = readme.read_text(encoding="utf-8") if (args.check or args.write) else ""
        families = parse_families(text)
        fid7 = parse_fid7_cases(text)
    except (OSError, TablesError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        check_tables(families, fid7)
        new_block = block(families)
        updated = readme_with_block(current, new_block) if (args.check or args.write) else None
    except TablesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if updated is None:
        print(new_block)
        return 0
    if updated == current:
        return 0
    if args.check:
        print(f"README.md: the fidelity totals are out of date (run {Path(__file__).name} --write)", file=sys.stderr)
        return 1
    atomic_write_text(readme, updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
