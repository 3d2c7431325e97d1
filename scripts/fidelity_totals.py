#!/usr/bin/env python3
"""The README's totals of the recorded case families, computed from spec/fidelity.md.

spec/fidelity.md §2 has one table row per recorded family, of `mocker-spec gen-cases` or of
`scripts/refusal_fuzz.py` (its command, cases, identical cases, outcomes); its *Cases of FID-7*
table names every divergent case with its family. This script reads both, checks that they
agree -- each family's differences are exactly the FID-7 cases the table gives for it, and each
FID-7 case belongs to a recorded family -- and prints the README's totals: one row per kind of
family (plain, the widening variants, `--large`, `--tight`, `--tiny`; bad inputs, `--odd`,
`--text`), with the families, cases, identical cases and outcomes summed.

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

#: the command of a `scripts/refusal_fuzz.py` family starts with this word
FUZZ = "refusal_fuzz.py"

#: a family's identity: its tool (`gen-cases` or FUZZ), drawing flags and seed
FamilyKey = Tuple[str, FrozenSet[str], int]


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
    refusals: int = 0  # refusal_fuzz.py families only (a gen-cases row counts TIME-14 errors apart)
    requests: Optional[int] = None  # as the row gives it ("(6,803 requests")

    @property
    def kind(self) -> str:
        return family_kind(self.key[0], self.key[1])


def family_key(command: str) -> FamilyKey:
    """`--large --sessions --seed 223 --count 60` -> ("gen-cases", {--large, --sessions}, 223);
    `refusal_fuzz.py --odd --seed 7` -> ("refusal_fuzz.py", {--odd}, 7)."""
    words = command.split()
    tool = "gen-cases"
    if words[:1] == [FUZZ]:
        tool, words = FUZZ, words[1:]
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
    return tool, frozenset(flags), seed


#: the kinds, in the README's order, with the text of their row
KINDS = (
    ("plain", "plain: `gen-cases --seed S`"),
    ("variants", "with `--concurrency`, `--extra-args` or `--sessions` (one or more)"),
    ("large", "`--large` ({requests} requests a family), with or without those"),
    ("tight", "`--tight` (every pool cut to the largest request's need plus 0-50%), with any of those"),
    ("tiny", "`--tiny` edge cases (pools of 1-8 blocks, 1-4 requests), with any of those"),
)

#: the kinds of `refusal_fuzz.py` family, in the README's order, with the text of their row
FUZZ_KINDS = (
    ("bad", "bad inputs: one to three spoiled engine arguments, replay arguments or trace rows, "
            "one case in four a CLI job (`refusal_fuzz.py --seed S`)"),
    ("odd", "edge values of the right type: block sizes of 1 to 2,048, one GPU block, zero or huge "
            "speed-ups, empty hash lists, zero outputs (`--odd`)"),
    ("text", "the trace's JSON text where serde_json and Python's `json` differ: repeated keys, `-0`, "
             "long fractions, escaped surrogates, odd blank lines, CRLF, invalid UTF-8, numbers past "
             "u64, array rows, the build's `request_id` / `output_token_ids`; CLI jobs with 17-digit "
             "engine floats (`--text`)"),
)


def family_kind(tool: str, flags: FrozenSet[str]) -> str:
    if tool == FUZZ:
        if len(flags) > 1 or not flags <= {"--odd", "--text"}:
            raise TablesError(f"{FUZZ} flags {sorted(flags)}: not a known kind")
        return next(iter(flags))[2:] if flags else "bad"
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
_FUZZ_OUTCOMES = re.compile(r"^(\d+) / (\d+) / (\d+) / (\d+)$")
_REQUESTS = re.compile(r"\(([\d,]+) requests")
_FID7_ROW = re.compile(r"^\| (?P<case>[a-z]+-\d+-\d+) \| `(?P<family>[^`]*)` \|")


def _section(text: str, start: str, stop: str) -> str:
    try:
        head = text.index(start)
        return text[head:text.index(stop, head)]
    except ValueError:
        raise TablesError(f"spec/fidelity.md: no section from {start!r} to {stop!r}") from None


def parse_families(text: str) -> List[Family]:
    """Every family row of §2's tables (rows whose command has a `--count`): a `gen-cases` row's
    outcomes are `ok / dead end / hang` (more may follow), a `refusal_fuzz.py` row's exactly
    `completed / refusals / dead ends / hangs`."""
    out: List[Family] = []
    for line in _section(text, "## 2. Figures", "**Cases of FID-7.**").splitlines():
        if not line.startswith("|") or "--count" not in line:
            continue
        m = _FAMILY_ROW.match(line)
        if m is None:
            raise TablesError(f"spec/fidelity.md §2: cannot parse the row {line[:80]!r}")
        command = m["command"]
        key = family_key(command)
        family_kind(*key[:2])  # refuses an unknown combination of flags
        head = (key, command, int(m["cases"]), int(m["identical"]))
        if key[0] == FUZZ:
            outcomes = _FUZZ_OUTCOMES.match(m["outcomes"].strip())
            if outcomes is None:
                raise TablesError(f"spec/fidelity.md §2: no 'completed / refusals / dead ends / hangs' "
                                  f"figures in {line[:80]!r}")
            completed, refusals, dead_ends, hangs = (int(g) for g in outcomes.groups())
            if completed + refusals + dead_ends + hangs != head[2]:
                raise TablesError(f"spec/fidelity.md §2: the family {command!r}: its outcomes do not "
                                  f"add up to its {head[2]} cases")
            out.append(Family(*head, completed, dead_ends, hangs, refusals=refusals))
            continue
        outcomes = _OUTCOMES.match(m["outcomes"].strip())
        if outcomes is None:
            raise TablesError(f"spec/fidelity.md §2: no 'ok / dead end / hang' figures in {line[:80]!r}")
        requests = _REQUESTS.search(line)
        out.append(Family(*head, *(int(g) for g in outcomes.groups()),
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
    """Each family's differences are its FID-7 cases, and each FID-7 case is in a recorded family."""
    by_key: Dict[FamilyKey, Family] = {f.key: f for f in families}
    named: Counter = Counter()
    for case, command in fid7:
        key = family_key(command)
        if key not in by_key:
            raise TablesError(f"FID-7 case {case}: its family {command!r} has no row in §2")
        named[key] += 1
    for f in families:
        if f.cases - f.identical != named[f.key]:
            n = f.cases - f.identical
            raise TablesError(f"family {f.command!r}: {n} difference{'' if n == 1 else 's'} in §2, "
                              f"{named[f.key]} in the FID-7 table")


def _count(n: int) -> str:
    return f"{n:,}"


#: the outcome columns of each tool's README table
_COLUMNS = {
    "gen-cases": ("completed / dead ends / reference hangs", ("completed", "dead_ends", "hangs")),
    FUZZ: ("completed / refusals / dead ends / reference hangs", ("completed", "refusals", "dead_ends", "hangs")),
}


def totals_rows(families: Sequence[Family], tool: str = "gen-cases") -> List[str]:
    """The README rows of one tool's families: one per kind present, then the sum."""
    rows = []
    families = [f for f in families if f.key[0] == tool]
    groups = [(text, [f for f in families if f.kind == kind]) for kind, text in (FUZZ_KINDS if tool == FUZZ else KINDS)]
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
        outcomes = " / ".join(_count(sum(getattr(f, a) for f in members)) for a in _COLUMNS[tool][1])
        rows.append(f"| {text} | {len(members)} | {_count(cases)} | {outcomes} | {verdict} |")
    return rows


def block(families: Sequence[Family]) -> str:
    """The README's block: a table per tool that has families."""
    lines = [BEGIN]
    for tool in ("gen-cases", FUZZ):
        rows = totals_rows(families, tool)
        if rows:
            if len(lines) > 1:
                lines.append("")
            lines += [f"| recorded `{tool}` families | families | cases | {_COLUMNS[tool][0]} | identical |",
                      "|---|---|---|---|---|", *rows]
    return "\n".join([*lines, END])


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
