"""scripts/refusal_fuzz.py: seeded bad-input cases (spec/fidelity.md FID-10, ARGS-19)."""

from __future__ import annotations

import json

from script_loader import load_script


def test_spoiled_cases_are_a_pure_function_of_seed_and_index():
    """The same (seed, index) gives the same case, trace and mutations; another seed another
    case; and every case carries between one and three mutations (four with the CLI flag), also
    when a later mutation lands on a line an earlier one replaced by text that is not a row."""
    fuzz = load_script("refusal_fuzz")
    first = [fuzz.spoil(3, i) for i in range(400)]
    assert first == [fuzz.spoil(3, i) for i in range(400)]
    assert [c for c, _, _ in first[:20]] != [c for c, _, _ in (fuzz.spoil(4, i) for i in range(20))]
    for case, lines, done in first:
        spoilt = [m for m in done if m != "from_cli"]
        assert 1 <= len(spoilt) <= 3 and case["spoiled"] == done
        assert ("from_cli" in done) == bool(case.get("from_cli"))
        json.dumps(case)  # a case.json can always be written
    # index 342 of seed 3 replaces line 1 and then sets a field on it (this once crashed the script)
    assert first[342][2] == ["line 1 replaced", "line 1 delay=0"]


def test_written_cases_use_the_refcases_layout(tmp_path):
    """Without --record, the script writes case.json and trace.jsonl per case, named by seed and
    index, for ``mocker-spec gen-cases``-style recording and ``diff --corpus``."""
    fuzz = load_script("refusal_fuzz")
    assert fuzz.main(["--out", str(tmp_path), "--seed", "5", "--count", "3"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["bad-5-0000", "bad-5-0001", "bad-5-0002"]
    case = json.loads((tmp_path / "bad-5-0001" / "case.json").read_text())
    lines = (tmp_path / "bad-5-0001" / "trace.jsonl").read_text().splitlines()
    assert (case, lines, case["spoiled"]) == fuzz.spoil(5, 1)


def test_odd_cases_draw_edge_values_of_the_right_type_from_their_own_stream():
    """--odd: one to three edge values per case, each of the type its field takes (so the build
    parses them), drawn from a stream of their own: the bad-input cases stay as they were."""
    fuzz = load_script("refusal_fuzz")
    odd = [fuzz.spoil(7, i, odd=True) for i in range(200)]
    assert odd == [fuzz.spoil(7, i, odd=True) for i in range(200)]
    assert [c for c, _, _ in odd[:20]] != [c for c, _, _ in (fuzz.spoil(7, i) for i in range(20))]
    for case, lines, done in odd:
        assert 1 <= len(done) <= 3 and "from_cli" not in case
        for line in lines:
            assert isinstance(json.loads(line), dict)  # every row stays a row


def test_text_cases_spoil_the_json_text_from_their_own_stream(tmp_path):
    """--text: one or two spoils of the trace's text (where serde_json and Python's json differ),
    reproducible, from a stream of their own; invalid UTF-8 reaches the file as raw bytes; and no
    case replays output tokens (the model refuses that as outside it, FID-6)."""
    fuzz = load_script("refusal_fuzz")
    text = [fuzz._text(19, i) for i in range(300)]
    assert text == [fuzz._text(19, i) for i in range(300)]
    kinds = {d.split()[-1] for _, _, done in text for d in done if d.startswith("line ")}
    assert {"dup-unknown", "minus-zero", "surrogate", "token-ids", "array", "UTF-8", "CRLF"} <= kinds
    for case, lines, done in text:
        assert 1 <= len([d for d in done if not d.startswith("from_cli")]) <= 2
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("output_token_ids"), list):
                ids = row["output_token_ids"]
                assert len(ids) != row.get("output_length") or any(t < 0 or t >= 2**32 for t in ids)
    assert fuzz.main(["--out", str(tmp_path), "--text", "--seed", "19", "--start", "0", "--count", "40"]) == 0
    raw = b"".join((d / "trace.jsonl").read_bytes() for d in tmp_path.iterdir())
    assert b"\xff" in raw  # a bad-utf8 spoil among the first 40


def test_an_output_that_cannot_be_a_directory_is_one_line_and_writes_nothing(tmp_path, capsys):
    fuzz = load_script("refusal_fuzz")
    f = tmp_path / "f"
    f.write_text("")
    assert fuzz.main(["--out", str(f / "cases"), "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err
    assert f.read_text() == "" and sorted(tmp_path.iterdir()) == [f]


def test_a_token_ids_spoil_after_a_length_past_u64_still_makes_its_case():
    """--text seed 463, case 267 spoils line 1 twice: its `output_length` is first written as
    18446744073709551616 (past u64, so the reference refuses the line already), then the token-ids
    spoil sizes its lists by that length. It used to raise OverflowError and stop the family; the
    case is now made, with the long length kept and a one-token list."""
    fuzz = load_script("refusal_fuzz")
    case, lines, done = fuzz._text(463, 267)
    assert done == ["line 1 number", "line 1 token-ids"]
    row = json.loads(lines[0])
    assert row["output_length"] == 2**64 and len(row["output_token_ids"]) == 1
