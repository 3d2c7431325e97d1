"""scripts/fidelity_totals.py: the README's family totals are summed from spec/fidelity.md §2, and
§2's differences are exactly the cases of its FID-7 table."""

from __future__ import annotations

import pytest

from script_loader import ROOT, load_script

FIDELITY = (ROOT / "spec" / "fidelity.md").read_text(encoding="utf-8")

# A file in §2's layout. Sums derived by hand: plain 300 + 200 = 500 cases, 299 + 200 = 499
# identical, 270 + 180 = 450 completed, 25 + 15 = 40 dead ends, 5 + 5 = 10 hangs; the tiny family
# on its own row; all: 700 cases, 699 identical, 550 / 80 / 50 (the missing 20 are TIME-14).
# refusal_fuzz.py: the bad-input and `--odd` families each on their own row; all: 600 cases, 299 +
# 300 = 599 identical, 30 + 200 = 230 completed, 260 + 60 = 320 refusals, 6 + 30 = 36 dead ends,
# 4 + 10 = 14 hangs.
SMALL = """## 2. Figures

| corpus | cases | identical | of which: ok / dead end / hang |
|---|---|---|---|
| shared reference corpus (`shared/refcases`) | 40 | **40** | 40 / 0 / 0 |
| fresh cases, `--seed 5 --count 300 --timeout 20` (extra family) | 300 | 299 | 270 / 25 / 5 |
| fresh cases, `--seed 7 --count 200 --timeout 20` | 200 | **200** | 180 / 15 / 5 |
| edge cases, `--tiny --sessions --seed 9 --count 200 --timeout 15` | 200 | **200** | 100 / 40 / 40, and 20 TIME-14 errors |

| `refusal_fuzz.py` family | cases | identical | completed / refusals / dead ends / hangs |
|---|---|---|---|
| `refusal_fuzz.py --seed 53 --count 300` | 300 | 299 | 30 / 260 / 6 / 4 |
| `refusal_fuzz.py --odd --seed 7 --count 300` | 300 | **300** | 200 / 60 / 30 / 10 |

**Cases of FID-7.** Text.

| case | family | configuration |
|---|---|---|
| gen-5-0001 | `--seed 5` | agg |
| bad-53-0264 | `refusal_fuzz.py --seed 53` | agg |

After the table.
"""


def _run(tmp_path, fidelity_text, *argv):
    mod = load_script("fidelity_totals")
    fidelity = tmp_path / "fidelity.md"
    fidelity.write_text(fidelity_text, encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{mod.BEGIN}\nold\n{mod.END}\noutro\n", encoding="utf-8")
    return mod, mod.main(list(argv), fidelity=fidelity, readme=readme), readme


def test_the_readme_block_is_what_the_spec_sums_to():
    """The committed README matches spec/fidelity.md (else: run the script with --write)."""
    mod = load_script("fidelity_totals")
    assert mod.main(["--check"]) == 0


def test_every_family_difference_is_a_fid7_case_of_the_spec():
    """The real tables agree, and they are not empty: some families differ, all by FID-7 cases."""
    mod = load_script("fidelity_totals")
    families = mod.parse_families(FIDELITY)
    fid7 = mod.parse_fid7_cases(FIDELITY)
    mod.check_tables(families, fid7)
    assert sum(f.cases - f.identical for f in families if f.key[0] == mod.FUZZ) > 0
    assert len(fid7) == sum(f.cases - f.identical for f in families) > 0


def test_totals_are_summed_per_kind(tmp_path):
    mod, rc, readme = _run(tmp_path, SMALL, "--write")
    assert rc == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old" not in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| recorded")]
    assert rows[0] == "| plain: `gen-cases --seed S` | 2 | 500 | 450 / 40 / 10 | 499/500: the difference is FID-7 |"
    assert rows[1].startswith("| `--tiny` edge cases") and rows[1].endswith("| 1 | 200 | 100 / 40 / 40 | **200/200** |")
    assert rows[2] == "| all recorded families | 3 | 700 | 550 / 80 / 50 | 699/700: the difference is FID-7 |"
    assert rows[3].startswith("| bad inputs:") and rows[3].endswith("| 1 | 300 | 30 / 260 / 6 / 4 | 299/300: the difference is FID-7 |")
    assert rows[4].startswith("| edge values") and rows[4].endswith("| 1 | 300 | 200 / 60 / 30 / 10 | **300/300** |")
    assert rows[5] == "| all recorded families | 2 | 600 | 230 / 320 / 36 / 14 | 599/600: the difference is FID-7 |"
    assert len(rows) == 6
    assert "| recorded `refusal_fuzz.py` families | families | cases | completed / refusals / dead ends / reference hangs |" in text
    assert mod.main(["--check"], fidelity=tmp_path / "fidelity.md", readme=readme) == 0


def test_check_reports_a_stale_block(tmp_path, capsys):
    _, rc, readme = _run(tmp_path, SMALL, "--check")
    assert rc == 1
    assert "out of date" in capsys.readouterr().err
    assert "old" in readme.read_text(encoding="utf-8")


#: (what is spoiled, its replacement, exit status, what the one-line error says)
SPOILED = [
    pytest.param("| 200 | **200** | 180 / 15 / 5 |", "| 200 | 198 | 180 / 15 / 5 |", 1,
                 "'--seed 7 --count 200 --timeout 20': 2 differences in §2, 0 in the FID-7 table",
                 id="difference-without-its-fid7-case"),
    pytest.param("| gen-5-0001 | `--seed 5` |", "| gen-5-0001 | `--seed 5` |\n| gen-11-0002 | `--seed 11` |", 1,
                 "FID-7 case gen-11-0002: its family '--seed 11' has no row in §2",
                 id="fid7-case-of-an-unrecorded-family"),
    # the same seed and drawing flags twice (the run flags aside) is one family recorded twice
    pytest.param("| fresh cases, `--seed 7 --count 200 --timeout 20` |",
                 "| fresh cases, `--seed 5 --count 200 --timeout 45` |", 2, "has more than one row",
                 id="family-with-two-rows"),
    pytest.param("| 300 | 299 | 270 / 25 / 5 |", "| 300 | most | 270 / 25 / 5 |", 2, "cannot parse the row",
                 id="unparseable-row"),
    # the two tools' families are apart: `refusal_fuzz.py --odd --seed 7` is not `--seed 7`
    pytest.param("| 300 | **300** | 200 / 60 / 30 / 10 |", "| 300 | 299 | 200 / 60 / 30 / 10 |", 1,
                 "'refusal_fuzz.py --odd --seed 7 --count 300': 1 difference in §2, 0 in the FID-7 table",
                 id="refusal-fuzz-difference-without-its-fid7-case"),
    pytest.param("| 30 / 260 / 6 / 4 |", "| 30 / 260 / 6 / 5 |", 2, "do not add up to its 300 cases",
                 id="refusal-fuzz-outcomes-not-adding-up"),
    pytest.param("| 30 / 260 / 6 / 4 |", "| 30 / 266 / 4 |", 2, "completed / refusals / dead ends / hangs",
                 id="refusal-fuzz-row-with-three-outcomes"),
    pytest.param("`refusal_fuzz.py --odd --seed 7", "`refusal_fuzz.py --odd --text --seed 7", 2, "not a known kind",
                 id="refusal-fuzz-row-of-no-known-kind"),
]


@pytest.mark.parametrize("old, new, status, message", SPOILED)
def test_tables_that_disagree_or_do_not_parse_are_refused(tmp_path, capsys, old, new, status, message):
    """Exit 1 when the tables disagree, 2 when a row cannot be read; the error names the row or
    case, and README.md is not written."""
    assert SMALL.count(old) == 1
    _, rc, readme = _run(tmp_path, SMALL.replace(old, new), "--write")
    assert rc == status
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert "old" in readme.read_text(encoding="utf-8")


def test_large_families_give_their_range_of_requests(tmp_path):
    """Two `--large` rows of 6,100 and 7,200 requests: the row of the kind spans them (the capped
    count after the requests is not read as requests)."""
    large = SMALL.replace(
        "| edge cases, `--tiny",
        "| fresh cases, `--large --seed 11 --count 60 --timeout 30` (6,100 requests) | 60 | **60** | 50 / 5 / 5 |\n"
        "| fresh cases, `--large --sessions --seed 13 --count 60 --timeout 30` (7,200 requests, 40 capped) | 60 | **60** | 50 / 5 / 5 |\n"
        "| edge cases, `--tiny")
    _, rc, readme = _run(tmp_path, large, "--write")
    assert rc == 0
    rows = [line for line in readme.read_text(encoding="utf-8").splitlines() if line.startswith("| `--large`")]
    assert rows == ["| `--large` (6,100-7,200 requests a family), with or without those | 2 | 120 | 100 / 10 / 10 | **120/120** |"]
