"""Bad input and user text on the command line: one line on stderr, exit status 2, nothing written
(README "Bad input"); text from files and flags is printed as is, never read as rich markup
(mocker_spec/messages.py); explore's file names never overwrite one another (MC-47)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mocker_spec.cli import main

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "spec" / "scenarios"
S7 = LIB / "known-defects" / "s7-vllm-zero-time-livelock.json"
TRACE = ROOT / "tests" / "goldens" / "refcases" / "case-1-000" / "trace.jsonl"


def _one_error_line(capsys, *fragments):
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if line.strip()]
    assert len(lines) == 1, cap.err
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "Traceback" not in cap.err and "error" not in cap.out.lower()
    return lines[0]


@pytest.mark.parametrize("value", ["[/x]", "[bold]"])
def test_markup_like_engine_arg_is_reported_literally(capsys, value):
    # before: "[/x]" raised rich's MarkupError (a traceback, exit 1) and "[bold]" vanished
    args = json.dumps({"block_size": value})
    assert main(["replay", str(TRACE), "--extra-engine-args", args, "--no-progress"]) == 2
    _one_error_line(capsys, "block_size", value)


def test_markup_like_scenario_text_is_reported_literally(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "[/n]", "engine": {"engine_type": "[/e]"}}))
    assert main(["explore", str(bad), "--no-progress"]) == 2
    assert _one_error_line(capsys, "[/e]").startswith("bad scenario: ")


def test_markup_like_ids_are_printed_literally(tmp_path, capsys):
    """S7 with ids spelt like markup: the same 5-step livelock, every id printed as written."""
    doc = json.loads(S7.read_text())
    doc["name"] = "[/n]"
    doc["requests"][0].update(id="[/x]", handoff="[b]h")
    doc["requests"][1]["id"] = "[bold]Y"
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(doc))
    assert main(["explore", str(sc), "--no-progress"]) == 1
    out = capsys.readouterr().out
    for text in ("[/n] (vllm)", "reserve([b]h,[/x])", "reserve(hY,[bold]Y)", "pass -> admit [/x] [zero-time]"):
        assert text in out


def test_quotients_of_ids_spelling_the_same_file_name_are_all_written(tmp_path, capsys):
    """MC-47: handoffs ``hX`` and ``hx`` both lower-case to ``hx``; the second gets ``hx-2``."""
    doc = json.loads(S7.read_text())
    doc["requests"][1]["handoff"] = "hx"  # the other is "hX"
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["explore", str(sc), "--no-progress", "--out", str(out), "--format", "dot"]) == 1
    capsys.readouterr()
    dots = sorted(p.name for p in out.glob("quotient-*.dot"))
    assert dots == ["quotient-hx-2.dot", "quotient-hx.dot"]
    # each is its own handoff's diagram: the first names hX, the second hx
    assert "hX" in (out / "quotient-hx.dot").read_text() and "hx" in (out / "quotient-hx-2.dot").read_text()


def test_distinct_stems_count_up_past_every_taken_name():
    """MC-47: repeats get -2, -3, ... in order, skipping a suffixed name that is already taken."""
    from explorer.outputs import _distinct

    assert _distinct(["a", "a", "a", "b", "a"]) == ["a", "a-2", "a-3", "b", "a-4"]
    assert _distinct(["a-2", "a", "a"]) == ["a-2", "a", "a-3"]


@pytest.mark.parametrize("flag", ["--summary-json", "--report-jsonl"])
def test_replay_output_that_is_a_directory_is_refused_before_the_run(tmp_path, capsys, flag):
    # before: the replay ran, then os.replace failed with a traceback, leaving a temp file beside it
    before = sorted(tmp_path.iterdir())
    assert main(["replay", str(TRACE), flag, str(tmp_path), "--no-progress"]) == 2
    _one_error_line(capsys, flag, "is a directory")
    assert sorted(tmp_path.iterdir()) == before


def test_replay_outputs_that_would_overwrite_each_other_or_the_trace_are_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(TRACE.read_bytes())
    same = str(tmp_path / "x.json")
    assert main(["replay", str(trace), "--report-jsonl", same, "--summary-json", same, "--no-progress"]) == 2
    _one_error_line(capsys, "--summary-json", "the same file as --report-jsonl")
    for flag in ("--report-jsonl", "--summary-json"):
        assert main(["replay", str(trace), flag, str(trace), "--no-progress"]) == 2
        _one_error_line(capsys, flag, "the trace file itself")
    assert trace.read_bytes() == TRACE.read_bytes() and sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
    assert main(["diff-161", "--corpus", str(TRACE.parents[1]), "--out", same, "--json", same,
                 "--python", str(tmp_path / "python")]) == 2
    _one_error_line(capsys, "--json", "the same file as --out")


def test_replay_output_under_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["replay", str(TRACE), "--summary-json", str(f / "s.json"), "--no-progress"]) == 2
    _one_error_line(capsys, "--summary-json", "is not a directory")


def test_explore_flags_are_checked(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["explore", str(S7), "--no-progress", "--out", str(f)]) == 2
    _one_error_line(capsys, "--out", "not a directory")
    assert f.read_text() == "x"
    for n in ("0", "-5"):
        assert main(["explore", str(S7), "--no-progress", "--max-states", n]) == 2
        _one_error_line(capsys, f"--max-states={n}", "at least 1")
    for flag in ("--max-states", "--max-depth"):  # 1 is the smallest bound, and a valid one
        assert main(["explore", str(S7), "--no-progress", flag, "1"]) == 0
        capsys.readouterr()
    assert main(["explore", str(S7), "--no-progress", "--format", "dot,png"]) == 2
    _one_error_line(capsys, "--format='png'")


def test_gen_cases_flags_are_checked(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["gen-cases", "--out", str(f), "--count", "1"]) == 2
    _one_error_line(capsys, "--out", "not a directory")
    for flags, fragment in ((["--start", "-1"], "--start=-1"), (["--timeout", "0"], "--timeout=0.0"),
                            (["--timeout", "nan"], "--timeout=nan"), (["--count", "0"], "--count=0"),
                            (["--tiny", "--large"], "--tiny and --large"), (["--tiny", "--tight"], "--tiny and --tight"),
                            (["--jobs", "0"], "--jobs=0")):
        assert main(["gen-cases", "--out", str(tmp_path / "cases"), *flags]) == 2
        _one_error_line(capsys, fragment)
    assert not (tmp_path / "cases").exists()


def test_gen_cases_without_record_writes_the_cases_and_exits_0(tmp_path, capsys):
    """Without ``--record`` the cases are written (case.json and trace.jsonl, no recorded outcome)
    exactly as ``write_cases`` makes them, and the run succeeds."""
    from mocker_spec.casegen import write_cases

    out = tmp_path / "cases"
    assert main(["gen-cases", "--out", str(out), "--seed", "5", "--count", "3", "--start", "7"]) == 0
    assert "wrote 3 cases" in capsys.readouterr().out
    same = write_cases(tmp_path / "direct", 5, 3, 7, False, False, False, False, False)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in same)
    for d in same:
        assert sorted(p.name for p in (out / d.name).iterdir()) == ["case.json", "trace.jsonl"]
        for name in ("case.json", "trace.jsonl"):
            assert (out / d.name / name).read_bytes() == (d / name).read_bytes()


def test_diff_timeout_is_checked(capsys):
    assert main(["diff", str(TRACE), "--timeout", "-1"]) == 2
    _one_error_line(capsys, "--timeout=-1.0")


def test_docs_unknown_part_is_one_line(capsys):
    assert main(["docs", "--check", "--only", "[/p]"]) == 2
    _one_error_line(capsys, "--only='[/p]'", "unknown part")


def test_empty_trace_names_the_file(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main(["replay", str(empty), "--no-progress"]) == 2
    _one_error_line(capsys, f"trace_file={str(empty)!r}", "did not contain any requests")


def test_speedup_ratio_is_ignored_in_concurrency_mode(tmp_path, capsys):
    """WL-20: with --replay-concurrency the ratio is neither applied nor checked (the compiled
    build runs a trace and a synthetic workload with ratio 0, -1 or NaN in concurrency mode);
    without it, 0 is refused."""
    summ = tmp_path / "s.json"
    assert main(["replay", str(TRACE), "--replay-concurrency", "2", "--arrival-speedup-ratio", "0",
                 "--summary-json", str(summ), "--no-progress"]) == 0
    capsys.readouterr()
    assert json.loads(summ.read_text())["num_requests"] > 0
    assert main(["replay", str(TRACE), "--arrival-speedup-ratio", "0", "--no-progress"]) == 2
    _one_error_line(capsys, "--arrival-speedup-ratio=0.0")


def test_max_sim_time_flag_is_checked(capsys):
    """DRV-18: only with a trace file, and finite and >= 0 (the binding's own message)."""
    assert main(["replay", "--num-requests", "2", "--input-tokens", "4", "--output-tokens", "2",
                 "--max-sim-time-ms", "10"]) == 2
    _one_error_line(capsys, "--max-sim-time-ms=10.0", "trace-file")
    for bad in ("-1", "nan", "inf"):
        assert main(["replay", str(TRACE), "--max-sim-time-ms", bad, "--no-progress"]) == 2
        _one_error_line(capsys, "max_sim_time_ms must be a finite, non-negative value")


def test_sla_flags_reach_the_summary(tmp_path, capsys):
    """REP-12: --sla-*-ms add the goodput keys; a negative threshold is bad input."""
    summ = tmp_path / "s.json"
    assert main(["replay", str(TRACE), "--sla-ttft-ms", "1e9", "--summary-json", str(summ), "--no-progress"]) == 0
    capsys.readouterr()
    s = json.loads(summ.read_text())
    assert s["goodput_completed_requests"] == s["completed_requests"] > 0  # nobody misses a 1e9 ms TTFT
    assert main(["replay", str(TRACE), "--sla-e2e-ms", "-1", "--no-progress"]) == 2
    _one_error_line(capsys, "sla_e2e_ms must be a finite, non-negative value, got -1")


def test_replay_runs_a_multi_turn_trace(tmp_path, capsys):
    """DRV-17 through the CLI (the golden mt-disagg-trace, recorded from the compiled build): every
    turn gets a report row with its session and turn."""
    case = ROOT / "tests" / "goldens" / "refcases" / "mt-disagg-trace"
    spec = json.loads((case / "case.json").read_text())
    report = tmp_path / "r.jsonl"
    argv = ["replay", str(case / "trace.jsonl"), "--prefill-engine-args", json.dumps(spec["prefill_engine_args"]),
            "--decode-engine-args", json.dumps(spec["decode_engine_args"]),
            "--num-prefill-workers", str(spec["num_prefill_workers"]),
            "--num-decode-workers", str(spec["num_decode_workers"]),
            "--trace-block-size", str(spec["trace_block_size"]), "--report-jsonl", str(report), "--no-progress"]
    if "arrival_speedup_ratio" in spec:
        argv += ["--arrival-speedup-ratio", str(spec["arrival_speedup_ratio"])]
    assert main(argv) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    expected = [json.loads(line) for line in (case / "expected.report.jsonl").read_text().splitlines()]
    key = lambda r: (r["session_id"], r["turn_index"])
    assert sorted(map(key, rows)) == sorted(map(key, expected))
    assert len(rows) == len((case / "trace.jsonl").read_text().splitlines())


def test_a_core_that_refuses_its_block_size_is_bad_input(capsys):
    """SEQ-3: a vLLM core cannot run with block_size 1 (the compiled build panics on the first
    request); the CLI says so in one line with exit status 2 instead of a traceback."""
    assert main(["replay", str(TRACE), "--extra-engine-args", '{"block_size": 1}', "--no-progress"]) == 2
    _one_error_line(capsys, "block_size=1", "needs block_size >= 2")


def test_an_input_that_makes_upstream_panic_is_bad_input(capsys):
    """TIME-1: a speed-up ratio of 1e-300 overflows the first prefill's duration, where upstream
    panics; the CLI says so in one line, with Rust's text, and exit status 2."""
    args = '{"block_size": 16, "num_gpu_blocks": 64, "speedup_ratio": 1e-300}'
    assert main(["replay", str(TRACE), "--extra-engine-args", args, "--no-progress"]) == 2
    _one_error_line(capsys, "upstream panics on this input (TIME-1)", "value is either too big or NaN")


def test_pools_the_model_cannot_build_are_bad_input(tmp_path, capsys):
    """POOL-1, KV-1: an SGLang pool beyond 2^28 slots is refused in one line (it used to fill the
    memory); a vLLM pool is built lazily and runs, up to the 2^59 blocks past which upstream's
    eviction index cannot be reserved ("capacity overflow", also one line)."""
    big = '{"num_gpu_blocks": 1000000000, "block_size": 16, "engine_type": "sglang"}'
    assert main(["replay", str(TRACE), "--extra-engine-args", big, "--no-progress"]) == 2
    _one_error_line(capsys, "total_tokens=16000000000", "more than the model builds")
    doc = json.loads(S7.read_text())
    doc["engine"].update(engine_type="sglang", num_gpu_blocks=10**9)
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(doc))
    assert main(["explore", str(sc), "--no-progress"]) == 2
    assert _one_error_line(capsys, "more than the model builds").startswith("bad scenario: ")
    huge_vllm = '{"num_gpu_blocks": 9223372036854775807, "block_size": 16}'
    assert main(["replay", str(TRACE), "--extra-engine-args", huge_vllm, "--no-progress"]) == 2
    _one_error_line(capsys, "num_gpu_blocks=9223372036854775807", "capacity overflow")
    large_vllm = '{"num_gpu_blocks": 1099511627776, "block_size": 16}'  # 2^40 blocks
    assert main(["replay", str(TRACE), "--extra-engine-args", large_vllm, "--no-progress"]) == 0
    capsys.readouterr()


def test_scenario_prompts_are_bounded(tmp_path, capsys):
    """SCN-3: a prompt_len or segments beyond 100,000 tokens is refused (a 2^70-token prompt
    used to exhaust the memory while loading)."""
    doc = json.loads(S7.read_text())
    doc["requests"][0]["prompt_len"] = 2**70
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(doc))
    assert main(["explore", str(sc), "--no-progress"]) == 2
    _one_error_line(capsys, f"prompt_len={2**70}", "at most 100000 tokens")
    del doc["requests"][0]["prompt_len"]
    doc["requests"][0]["segments"] = [["a", 60000], ["b", 60000]]
    sc.write_text(json.dumps(doc))
    assert main(["explore", str(sc), "--no-progress"]) == 2
    _one_error_line(capsys, "at most 100000 tokens")


def test_trace_format_flag_is_checked(capsys):
    """WL-18/WL-19: an unknown format, delta on disaggregated pools, or a format without a trace file."""
    assert main(["replay", str(TRACE), "--trace-format", "csv", "--no-progress"]) == 2
    _one_error_line(capsys, "trace_format='csv'", "got 'csv'")
    assert main(["replay", str(TRACE), "--trace-format", "mooncake-delta", "--prefill-engine-args",
                 '{"worker_type": "prefill"}', "--decode-engine-args", '{"worker_type": "decode"}',
                 "--no-progress"]) == 2
    _one_error_line(capsys, "not supported for disaggregated replay")
    assert main(["replay", "--num-requests", "2", "--input-tokens", "3", "--output-tokens", "2",
                 "--trace-format", "mooncake-delta"]) == 2
    _one_error_line(capsys, "only used with a trace file")


def test_unreadable_files_are_one_line_errors(tmp_path, capsys):
    """Non-UTF-8 scenario, engine-args and corpus files, and a corpus case missing its recorded
    outcome, are bad input (they raised UnicodeDecodeError or FileNotFoundError tracebacks)."""
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\xff\xfe{}")
    assert main(["explore", str(junk), "--no-progress"]) == 2
    _one_error_line(capsys, "not UTF-8")
    assert main(["replay", str(TRACE), "--extra-engine-args", str(junk), "--no-progress"]) == 2
    _one_error_line(capsys, "--extra-engine-args", "not UTF-8")
    case = tmp_path / "corpus" / "c1"
    case.mkdir(parents=True)
    (case / "case.json").write_bytes(b"\xff")
    assert main(["diff", "--corpus", str(tmp_path / "corpus")]) == 2
    _one_error_line(capsys, "case.json: not UTF-8")
    (case / "case.json").write_text('{"mode": "agg"}')
    assert main(["diff", "--corpus", str(tmp_path / "corpus")]) == 2
    _one_error_line(capsys, "expected.summary.json: cannot read")


def test_a_corpus_case_with_a_malformed_recorded_outcome_is_bad_input(tmp_path, capsys):
    """A recorded outcome of the wrong shape is named in one line with exit 2, before any case
    runs: a summary that is not an object (a list crashed the comparison with a traceback, and
    ``null`` skipped the summary silently, so the case read as identical), a report row that is
    not an object (it counted as a row), and a status that is not one of the three forms of the
    corpus layout (tests/goldens/refcases/README.md; it was taken for an error message)."""
    import shutil

    good = ROOT / "tests" / "goldens" / "refcases" / "case-1-037"
    bad = {
        "expected.summary.json": ("[1]", "expected.summary.json: not a JSON object"),
        "expected.report.jsonl": ('{"a": 1}\n\n[1, 2]\n', "expected.report.jsonl: row 2 is not a JSON object"),
        "expected.status": ("finished\n", "expected.status: 'finished' is not 'ok', 'timeout' or"),
    }
    for name, (text, message) in bad.items():
        corpus = tmp_path / name
        shutil.copytree(good, corpus / "c1")
        (corpus / "c1" / name).write_text(text)
        assert main(["diff", "--corpus", str(corpus)]) == 2
        _one_error_line(capsys, message)
    corpus = tmp_path / "null-summary"
    shutil.copytree(good, corpus / "c1")
    (corpus / "c1" / "expected.summary.json").write_text("null")
    assert main(["diff", "--corpus", str(corpus)]) == 2
    _one_error_line(capsys, "expected.summary.json: not a JSON object")


def test_a_corpus_case_with_an_unknown_mode_or_a_missing_pool_is_bad_input(tmp_path, capsys):
    """The layout's ``mode`` is ``agg`` or ``disagg``, and a disagg case names both pools' engine
    args: anything else is named in one line with exit 2 (an unknown mode ran the model as an
    aggregated replay while the runners, which treat every other mode as disagg, failed on the
    missing prefill args)."""
    import json
    import shutil

    good = ROOT / "tests" / "goldens" / "refcases"
    edits = [
        ("case-1-037", {"mode": "aggregated"}, "case.json: mode='aggregated': must be 'agg' or 'disagg'"),
        ("case-1-037", {"mode": None}, "case.json: mode=None: must be 'agg' or 'disagg'"),
        ("case-1-000", {"decode_engine_args": None}, "case.json: decode_engine_args=None: a disagg case needs it"),
    ]
    for i, (src, change, message) in enumerate(edits):
        corpus = tmp_path / f"corpus{i}"
        shutil.copytree(good / src, corpus / "c1")
        case = json.loads((corpus / "c1" / "case.json").read_text())
        case.update(change)
        (corpus / "c1" / "case.json").write_text(json.dumps(case))
        assert main(["diff", "--corpus", str(corpus)]) == 2
        _one_error_line(capsys, message)


def test_vectors_refuses_a_library_with_a_bad_scenario(tmp_path, capsys):
    """VEC-2: a scenario file that is not valid for its own engine is named, exit 2, nothing
    written (a non-UTF-8 file raised a traceback; an invalid one was only noted in the README)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    doc = json.loads(S7.read_text())
    doc["requests"][0]["prompt_len"] = 2_000_000
    (lib / "x.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["vectors", "--out", str(out), "--scenarios", str(lib), "--no-progress"]) == 2
    _one_error_line(capsys, "x.json", "at most 100000 tokens")
    (lib / "x.json").write_bytes(b"\xff")
    assert main(["vectors", "--out", str(out), "--scenarios", str(lib), "--no-progress"]) == 2
    _one_error_line(capsys, "x.json: not UTF-8")
    assert not out.exists()


def test_gen_cases_record_without_the_reference_is_refused_before_recording(tmp_path, capsys, monkeypatch):
    """``gen-cases --record`` checks that the compiled reference can be imported before it records
    anything (worker processes could not stop each other): exit 2, one line, nothing written."""
    import mocker_spec.reference as R

    monkeypatch.setattr(R, "reference_available", lambda python=None: False)
    out = tmp_path / "cases"
    assert main(["gen-cases", "--out", str(out), "--count", "2", "--record", "--jobs", "2"]) == 2
    assert "compiled reference is not installed" in capsys.readouterr().err
    assert not out.exists()


def _unwritable(monkeypatch):
    """Every new file fails as on a mount that refuses writes although ``os.access`` allows them
    (root on ``/proc`` or a read-only mount): the probe must create a file to find out."""
    import tempfile

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


@pytest.mark.parametrize("argv", [
    ["explore", str(S7), "--no-progress", "--out", "{d}/out"],
    ["replay", str(TRACE), "--no-progress", "--summary-json", "{d}/s.json"],
    ["replay", str(TRACE), "--no-progress", "--report-jsonl", "{d}/r.jsonl"],
    ["gen-cases", "--out", "{d}/cases", "--count", "1"],
    ["vectors", "--out", "{d}/vec", "--no-progress"],
    ["diff-161", "--corpus", str(TRACE.parents[1]), "--out", "{d}/r.md", "--python", "{d}/python"],
])
def test_an_output_path_that_cannot_take_a_file_is_refused_before_the_run(tmp_path, capsys, monkeypatch, argv):
    # before: os.access said yes (as it does to root), the run went ahead and its first write
    # ended in a traceback with exit status 1
    _unwritable(monkeypatch)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    _one_error_line(capsys, "is not writable (Read-only file system)")
    assert list(tmp_path.iterdir()) == []


def test_explore_outputs_are_all_or_nothing(tmp_path, capsys, monkeypatch):
    """MC-47: a write that fails part-way leaves neither the files already written nor the
    directories the run created; the failure is one line with exit status 2."""
    import pathlib

    real = pathlib.Path.write_text

    def broken(self, *a, **k):  # the disk fills up at the state graph's Mermaid file
        if self.name == "states.mmd":
            raise OSError(28, "No space left on device", "states.mmd")
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", broken)
    out = tmp_path / "new" / "out"
    assert main(["explore", str(S7), "--no-progress", "--out", str(out)]) == 2
    _one_error_line(capsys, "'states.mmd': No space left on device")
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"  # an existing directory keeps what it held, and gets nothing new
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    assert main(["explore", str(S7), "--no-progress", "--out", str(kept)]) == 2
    capsys.readouterr()
    assert [p.name for p in kept.iterdir()] == ["mine.txt"]


def test_gen_cases_writes_each_case_whole_and_keeps_a_recorded_outcome(tmp_path, monkeypatch):
    """A write that fails inside a case leaves no half case (a case.json without its trace would
    stop ``diff --corpus``); writing a case again replaces its two files and keeps what was
    recorded beside them."""
    import pathlib

    from mocker_spec.casegen import write_cases

    out = tmp_path / "cases"
    (first,) = write_cases(out, 5, 1, 0)
    (first / "expected.status").write_text("ok\n")
    real = pathlib.Path.write_text

    def failing(self, text, *a, **k):
        if self.name == "trace.jsonl" and "0001" in self.parent.name:
            raise OSError(28, "No space left on device")
        return real(self, text, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", failing)
    with pytest.raises(OSError):
        write_cases(out, 5, 2, 0)
    assert sorted(p.name for p in out.iterdir()) == [first.name]
    assert sorted(p.name for p in first.iterdir()) == ["case.json", "expected.status", "trace.jsonl"]
