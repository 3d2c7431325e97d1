"""scripts/fid7_rows.py: the rows of spec/fidelity.md's FID-7 case table, computed from a recorded
case (the figures below are the reference's, as recorded in tests/goldens/divergent/README.md)."""

from __future__ import annotations

import shutil

from script_loader import ROOT, load_script

DIVERGENT = ROOT / "tests" / "goldens" / "divergent"


def test_a_divergent_golden_gives_its_row(tmp_path, capsys):
    """Case 139 of `gen-cases --seed 113`, kept as generated: the 238-token request arriving at
    499.347 ms reuses 192 tokens in the model and 144 in the reference (blocks of 16: three more);
    the family comes from the case's name."""
    rows = load_script("fid7_rows")
    case = tmp_path / "gen-113-0139"
    shutil.copytree(DIVERGENT / "fid-7-gen-113-0139", case)
    assert rows.main([str(case)]) == 0
    out = capsys.readouterr().out.strip()
    cells = [c.strip() for c in out.strip("|").split("|")]
    assert cells[:5] == ["gen-113-0139", "`--seed 113`", "agg; 1 worker, 80×16 blocks, budget 128, ≤32 seqs, decode speed-up 2",
                         "238-token request at 499.35 ms", "192 / 144 (+3 blocks)"]
    assert cells[5].startswith("`last_token_ms` of the 562-token request at 488.26 ms") and "later in the reference" in cells[5]
    assert cells[-1] == "?"


def test_a_decode_side_difference_names_the_decode_pool(capsys):
    """fid-7-decode-side: the 121-token request's reuse on its decode worker, 112 in the model and
    72 in the reference (blocks of 8: four more); that field is the only difference."""
    rows = load_script("fid7_rows")
    assert rows.main([str(DIVERGENT / "fid-7-decode-side")]) == 0
    cells = [c.strip() for c in capsys.readouterr().out.strip().strip("|").split("|")]
    assert cells[2].startswith("disagg, decode: 1 worker, 127×8 blocks, budget 128, ≤2 seqs")
    assert cells[4:7] == ["112 / 72 on decode (+5 blocks)", "the reuse itself", "1 of 15"]


def test_cases_without_the_signature_are_named_and_fail(capsys):
    """An identical golden and FID-9's divergent one (the model reuses less there) are no FID-7
    rows: exit status 1, each named on standard error; an unreadable directory is status 2."""
    rows = load_script("fid7_rows")
    assert rows.main([str(ROOT / "tests" / "goldens" / "refcases" / "args-kwargs-booleans"),
                      str(DIVERGENT / "fid-9-delta-generated-tokens")]) == 1
    err = capsys.readouterr().err
    assert "args-kwargs-booleans: no FID-7 signature (identical)" in err
    assert "fid-9-delta-generated-tokens: no FID-7 signature (first divergence:" in err
    assert rows.main([str(ROOT / "tests" / "no-such-case")]) == 2


def test_family_commands_follow_the_generators_names():
    rows = load_script("fid7_rows")
    assert rows.family("genxsl-223-0009") == "`--large --sessions --extra-args --seed 223`"
    assert rows.family("genxsp-1109-0149") == "`--tight --sessions --extra-args --seed 1109`"
    assert rows.family("gen-3-0104") == "`--seed 3`"
    assert rows.family("odd-101-0231") == "`refusal_fuzz.py --odd --seed 101`"
    assert rows.family("bad-53-0264") == "`refusal_fuzz.py --seed 53`"
    assert rows.family("fid-7-minimal") == "?"
    assert rows.family("reduced") == "?" and rows.family("gen-x-0001") == "?"
