"""Conformance vectors (spec/oracle-kit.md §2, VEC-1..VEC-8) and the offline parts of the 1.6.1
behaviour diff (§4, DIFF161-1..DIFF161-7; running the 1.6.1 build itself stays out of the suite).

The corpus here is the full pipeline on a few library scenarios (every engine) and short
sequences, to keep the suite fast; `mocker-spec vectors` with its defaults builds the whole one.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

from explorer import scenario_from_dict
from explorer.replay import replay_steps
from mocker_spec import steptrace as S
from mocker_spec import upstream161 as U
from mocker_spec import vectors as V
from mocker_spec.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCENARIOS = ("vllm-decode-two-handoffs-roomy", "s7-vllm-zero-time-livelock", "s10-sglang-slot-leak")
SMALL = dict(scenarios=SCENARIOS, max_states=400, sequences=2, seed=3, sequence_steps=(12, 30))


@pytest.fixture(scope="module")
def corpus():
    return V.build_corpus(V.ENGINES, **SMALL)


def _vectors(corpus):
    return {p: t for p, t in corpus.files.items() if p.endswith(".jsonl")}


# ---------------------------------------------------------------------------------------------
# the corpus
# ---------------------------------------------------------------------------------------------


def test_every_vector_conforms(corpus):
    """VEC-5 (acceptance): `check` passes every generated vector, on all three engines."""
    vecs = _vectors(corpus)
    engines = {p.split("/")[0] for p in vecs}
    assert engines == {"vllm", "trtllm", "sglang"}
    for path, text in vecs.items():
        report = S.check_trace(S.parse_trace_text(text))
        assert report.conforms, f"{path}: {report.lines()}"
    kinds = {json.loads(line)["op"] for text in vecs.values() for line in text.splitlines()[1:]}
    assert {"pass", "retry", "reserve_destination", "activate_destination", "cancel_destination"} <= kinds


@pytest.mark.parametrize("engine", V.ENGINES)
def test_one_altered_effect_fails_at_its_step(corpus, engine):
    """VEC-5 (acceptance): change one recorded effect; `check` names that step."""
    path = sorted(p for p in _vectors(corpus) if p.startswith(engine + "/scenarios/"))[-1]
    objs = [json.loads(line) for line in corpus.files[path].splitlines()]
    target = next(i for i in range(len(objs) - 1, 0, -1) if objs[i]["effects"].get("result") or
                  objs[i]["effects"].get("metrics"))
    eff = objs[target]["effects"]
    if "metrics" in eff:
        eff["metrics"]["total_blocks"] += 1
        field = "metrics.total_blocks"
    else:
        eff["result"] = {"kind": "noop"} if eff["result"]["kind"] != "noop" else {"kind": "applied"}
        field = "result.kind"
    report = S.check_trace(S.parse_trace_text(S.dumps_trace(objs)))
    assert not report.conforms
    assert report.divergence.step.number == target and report.divergence.mismatch.field == field


def test_every_phase_action_pair_is_covered(corpus):
    """VEC-3: per scenario and engine, every (phase, action) pair of the exploration is fired."""
    assert len(corpus.coverage) == len(V.ENGINES) * len(SCENARIOS)
    for c in corpus.coverage:
        assert c.error is None
        assert c.pairs > 0 and c.covered == c.pairs, c
        assert 1 <= c.vectors <= c.pairs


def test_explorer_vectors_are_explorer_paths(corpus):
    """VEC-2 / VEC-4: each vector's notes are enabled actions of the retargeted scenario, in order,
    and its operations are those actions."""
    lib = dict((obj["name"], obj) for _, obj in V.library(V.default_scenario_root()))
    for path, text in _vectors(corpus).items():
        if "/scenarios/" not in path:
            continue
        objs = [json.loads(line) for line in text.splitlines()]
        meta = objs[0]["meta"]
        sc = scenario_from_dict(V.retarget(lib[meta["scenario"]], meta["engine"]))
        names = [o["note"] for o in objs[1:]]
        assert len(names) <= V.MAX_VECTOR_STEPS
        rep = replay_steps(sc, names)
        assert rep.error is None, f"{path}: {rep.error}"
        for o, name in zip(objs[1:], names):
            op = V.action_op(sc.action(name))
            assert o["op"] == op["op"] and o.get("handoff_id") == op.get("handoff_id")


def test_retarget_switches_engine_and_sglang_arguments():
    """VEC-2."""
    lib = dict((obj["name"], obj) for _, obj in V.library(V.default_scenario_root()))
    sg = lib["sglang-decode-three-handoffs"]
    assert "sglang" not in V.retarget(sg, "vllm")["engine"]
    assert V.retarget(sg, "sglang")["engine"]["sglang"] == sg["engine"]["sglang"]
    vl = V.retarget(lib["vllm-decode-three-handoffs"], "sglang")
    assert vl["engine"]["engine_type"] == "sglang" and vl["engine"]["sglang"] == {"schedule_conservativeness": 0.0}
    assert "$schema" not in vl and lib["vllm-decode-three-handoffs"]["engine"]["engine_type"] == "vllm"


def test_headers_notes_and_recording(corpus):
    """VEC-5 / VEC-6: headers say who recorded the vector and where it comes from; every effect is there."""
    for path, text in _vectors(corpus).items():
        objs = [json.loads(line) for line in text.splitlines()]
        h = objs[0]
        assert h["recorded_by"] == V.RECORDED_BY and h["capture_kv_events"] is True
        assert h["name"] + ".jsonl" == path
        assert h["meta"]["origin"] in ("explorer", "hypothesis")
        for o in objs[1:]:
            if o["op"] in ("pass", "hidden_pass") and "error" not in o["effects"]:
                assert {"end_ms", "metrics", "fpm", "kv_events", "output_signals"} <= set(o["effects"])
            if h["meta"]["origin"] == "explorer":
                assert o["note"]


def test_sequences_are_long_seeded_and_differ_by_seed(corpus):
    """VEC-6."""
    seqs = {p: t for p, t in _vectors(corpus).items() if "/sequences/" in p}
    assert len(seqs) == 2 * len(V.ENGINES)
    lengths = [len(t.splitlines()) - 1 for t in seqs.values()]
    assert all(12 <= n <= 30 for n in lengths)
    other = V.sequence_vectors("vllm", seed=4, count=2, steps=(12, 30))
    assert [S.dumps_trace(o) for _, o in other] != [seqs[p] for p in sorted(seqs) if p.startswith("vllm/")]


def test_the_corpus_is_deterministic(corpus):
    """VEC-8: a second build writes byte-identical files."""
    again = V.build_corpus(V.ENGINES, **SMALL)
    assert again.files == corpus.files


def test_manifest_and_readme(corpus):
    """VEC-1 / VEC-7."""
    manifest = json.loads(corpus.files["MANIFEST.json"])
    assert manifest["vectors"] == sorted(_vectors(corpus)) and manifest["model_version"] == "1.3.0"
    readme = corpus.files["README.md"]
    for phrase in ("Replaying a vector on an engine", "mocker-spec check", "allow_destination_admission",
                   "now_ms", "| vllm | s7-vllm-zero-time-livelock |"):
        assert phrase in readme


def test_write_corpus_is_all_or_nothing(corpus, tmp_path, monkeypatch):
    """VEC-1: refuses a non-empty target; a failure half-way leaves nothing behind."""
    out = tmp_path / "vectors"
    assert V.write_corpus(out, corpus) == len(corpus.files)
    assert (out / "MANIFEST.json").exists()
    with pytest.raises(FileExistsError):
        V.write_corpus(out, corpus)
    calls = {"n": 0}
    real = pathlib.Path.write_text

    def failing(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full")
        return real(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", failing)
    target = tmp_path / "second"
    with pytest.raises(OSError):
        V.write_corpus(target, corpus)
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vectors"]
    calls["n"] = 0  # parents the write created go too (they used to stay behind)
    with pytest.raises(OSError):
        V.write_corpus(tmp_path / "new" / "deeper" / "third", corpus)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vectors"]


def test_cli_vectors(tmp_path, capsys):
    """VEC-1: the command writes a corpus `check` accepts; bad arguments exit 2 and write nothing."""
    out = tmp_path / "v"
    assert main(["vectors", "--out", str(out), "--engine", "trtllm", "--scenario", "s10-sglang-slot-leak",
                 "--sequences", "1", "--max-states", "50", "--no-progress"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["check", str(out)]) == 0
    assert (out / "trtllm" / "sequences").is_dir()
    none = tmp_path / "v0"  # no random sequences is a valid request: only the scenario vectors
    assert main(["vectors", "--out", str(none), "--engine", "trtllm", "--scenario", "s10-sglang-slot-leak",
                 "--sequences", "0", "--max-states", "50", "--no-progress"]) == 0
    assert (none / "trtllm" / "scenarios").is_dir() and not (none / "trtllm" / "sequences").exists()
    for bad in (["--engine", "tgi"], ["--max-states", "0"], ["--sequences", "-1"], ["--scenario", "nope"]):
        target = tmp_path / "bad"
        assert main(["vectors", "--out", str(target), *bad]) == 2
        assert not target.exists()
    assert main(["vectors", "--out", str(out)]) == 2


# ---------------------------------------------------------------------------------------------
# the 1.6.1 behaviour diff, without the 1.6.1 build
# ---------------------------------------------------------------------------------------------


def test_canonical_engine_args():
    """DIFF161-2."""
    got = U.canonical_engine_args({"engine_type": "sglang", "block_size": 8, "num_gpu_blocks": 40, "dp_size": 2,
                                   "kv_bytes_per_token": 64, "handoff_session_timeout_ms": 5,
                                   "sglang": {"chunked_prefill_size": 64}, "worker_type": "decode"})
    assert got == {"engine": {"backend": "sglang", "block_size": 8, "num_gpu_blocks": 40,
                              "kv_transfer_bytes_per_token": 64, "sglang": {"chunked_prefill_size": 64},
                              "worker_type": "decode"},
                   "dp_size": 2, "dynamo": {"handoff_session_timeout_ms": 5}}
    assert U.canonical_engine_args({"is_prefill": True}) == {"engine": {"backend": "vllm", "worker_type": "prefill"}}


def _row(t, admit, first, n=10):
    return {"arrival_time_ms": t, "input_length": n, "output_length": 2, "first_admit_ms": admit,
            "first_token_ms": first, "terminal_status": "completed"}


def test_classification_kinds():
    """DIFF161-5 / DIFF161-6."""
    ok = lambda rows: U.Side("ok", records=rows)  # noqa: E731
    base = [_row(0.0, 1.0, 5.0), _row(1.0, 2.0, 6.0)]
    assert U.classify(ok(base), ok([dict(r) for r in reversed(base)]))[0] == "identical"
    later = [_row(0.0, 1.0, 5.5), _row(1.0, 2.0, 6.0)]
    kind, detail = U.classify(ok(base), ok(later))
    assert kind == "timing" and "first_token_ms 1.3.0 5.0, 1.6.1 5.5" in detail
    swapped = [_row(0.0, 3.0, 5.0), _row(1.0, 2.0, 6.0)]
    assert U.classify(ok(base), ok(swapped))[0] == "admission order"
    assert U.classify(U.Side("hang", "livelock"), ok(base))[0] == "hang"
    assert U.classify(ok(base), U.Side("hang"))[0] == "hang"
    assert U.classify(U.Side("dead_end", "x"), ok(base))[0] == "dead end vs completion"
    assert U.classify(U.Side("dead_end", "a"), U.Side("dead_end", "b")) == ("identical", "both dead end")
    assert U.classify(U.Side("error", "bad"), ok(base))[0] == "error"
    assert U.classify(ok(base), ok(base[:1]))[0] == "other"
    unfinished = [dict(base[0]), dict(base[1], terminal_status="rejected")]
    assert U.classify(ok(base), ok(unfinished))[0] == "dead end vs completion"
    assert U._looks_like_dead_end("replay invariant violated: offline replay detected an effect-free "
                                  "zero-duration pass with 23 in-flight requests remaining")


def test_model_side_and_recorded_agreement(tmp_path):
    """DIFF161-4: the model replays a case; a case's recorded 1.3.0 outputs are compared with it."""
    from mocker_spec.casegen import write_cases
    from mocker_spec.formats import dumps_compact

    case = write_cases(tmp_path, seed=2, count=1, start=3)[0]
    job = json.loads((case / "case.json").read_text())
    job["trace_file"] = str(case / "trace.jsonl")
    side = U.run_model_side(job)
    assert side.status in ("ok", "dead_end", "hang")
    assert U.recorded_agreement(case, side) is None  # nothing recorded yet
    if side.status != "ok":
        pytest.skip("this generated case does not complete")
    summary = {k: v for k, v in side.summary.items() if k != "wall_time_ms"}
    (case / "expected.status").write_text("ok\n")
    (case / "expected.summary.json").write_text(json.dumps(summary))
    (case / "expected.report.jsonl").write_text("".join(dumps_compact(r) + "\n" for r in side.records))
    assert U.recorded_agreement(case, side) is True
    (case / "expected.summary.json").write_text(json.dumps(dict(summary, duration_ms=summary["duration_ms"] + 1)))
    assert U.recorded_agreement(case, side) is False


def test_running_the_other_build_in_a_subprocess():
    """DIFF161-3: a run over the timeout is a hang; an interpreter without the build is reported."""
    job = {"mode": "agg", "engine_args": {}, "trace_file": "missing.jsonl"}
    side, _ = U.run_161(job, sys.executable, 0.001)
    assert side.status == "hang"
    side, _ = U.run_161(job, sys.executable, 60.0)
    assert side.status in ("error", "missing", "dead_end")


def test_report_has_no_machine_paths_and_groups_by_kind():
    """DIFF161-7."""
    diffs = [U.CaseDiff("c1", "refcases", "agg", "vllm", 3, "timing", "x", "ok", "ok", 0.9, True),
             U.CaseDiff("c2", "gen2", "disagg", "sglang", 4, "hang", "y", "hang", "ok", None, None)]
    text = U.render(diffs, [("refcases", 1), ("gen2", 1)], "1.6.1", 60.0)
    assert "## timing (1)" in text and "## hang (1)" in text and "| total | 2 |" in text
    assert "median 0.900" in text and "reproduces 1 of them" in text
    assert not re.search(r"/(work|tmp|home)/", text)


def test_cli_diff161_bad_input_writes_nothing(tmp_path):
    """DIFF161-1: missing corpus or interpreter: exit 2, no report."""
    out = tmp_path / "r.md"
    assert main(["diff-161", "--corpus", str(tmp_path / "none"), "--out", str(out), "--python", sys.executable]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["diff-161", "--corpus", str(empty), "--out", str(out), "--python", sys.executable]) == 2
    case = tmp_path / "c" / "case-0"
    case.mkdir(parents=True)
    (case / "case.json").write_text("{}")
    assert main(["diff-161", "--corpus", str(case.parent), "--out", str(out), "--python",
                 str(tmp_path / "no-python")]) == 2
    assert main(["diff-161", "--corpus", str(case.parent), "--out", str(out), "--python", sys.executable,
                 "--timeout", "0"]) == 2
    assert not out.exists()


def test_diff161_rule_ids_are_cited():
    """DIFF161-1..DIFF161-7 in code and tests (the generic link check reads only letter prefixes)."""
    spec = (ROOT / "spec" / "oracle-kit.md").read_text()
    prefix = "DIFF" + "161-"
    ids = sorted(set(re.findall(prefix + r"\d+", spec)))
    assert len(ids) >= 7
    code = (ROOT / "mocker_spec" / "upstream161.py").read_text() + (ROOT / "mocker_spec" / "oracle_cli.py").read_text()
    tests = pathlib.Path(__file__).read_text()
    for rule in ids:
        pat = re.escape(rule) + r"(?![0-9])"
        assert re.search(pat, code), f"{rule} not cited in the code"
        assert len(re.findall(pat, tests)) >= 1, f"{rule} not cited in the tests"
