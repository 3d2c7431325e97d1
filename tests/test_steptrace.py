"""Step traces: format, encodings, replay on the model, the first divergence, `mocker-spec check`
(spec/step-trace.md, STEP-1..STEP-19)."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import sys

import pytest

from mocker_spec import steptrace as S
from mocker_spec.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent

DECODE = {"engine_type": "vllm", "worker_type": "decode", "block_size": 4, "num_gpu_blocks": 6}
AGG = {"engine_type": "vllm", "block_size": 4, "num_gpu_blocks": 12, "max_num_seqs": 2}
PREFILL = {"engine_type": "vllm", "worker_type": "prefill", "block_size": 4, "num_gpu_blocks": 12,
           "kv_bytes_per_token": 1024, "kv_transfer_bandwidth": 1.5}


def req(uuid, n, out=2, base=0):
    return {"uuid": uuid, "tokens": list(range(base, base + n)), "max_output_tokens": out}


def decode_ops():
    """Two destinations, the second waits for KV; a pass; a cancel frees the pool; a rejected id."""
    return [
        {"op": "reserve_destination", "handoff_id": "h0", "request": req("r0", 16)},
        {"op": "reserve_destination", "handoff_id": "h1", "request": req("r1", 12, base=100)},
        {"op": "activate_destination", "handoff_id": "h0"},
        {"op": "pass"},
        {"op": "pass"},
        {"op": "cancel_destination", "handoff_id": "h0"},
        {"op": "retry"},
        {"op": "submit", "request": req("r1", 3)},
        {"op": "hidden_pass"},
    ]


def agg_ops():
    return [
        {"op": "submit", "request": req("a", 9)},
        {"op": "submit", "request": req("b", 9)},
        {"op": "pass"},
        {"op": "pass"},
        {"op": "pass"},
        {"op": "pass"},
    ]


def prefill_ops():
    return [
        {"op": "submit_prefill", "handoff_id": "h", "request": req("p", 10, out=1)},
        {"op": "pass"},
        {"op": "pass"},
        {"op": "release_source", "handoff_id": "h"},
        {"op": "release_source", "handoff_id": "h"},
    ]


def recorded(args=DECODE, ops=None, **kw):
    header = S.make_header(args, recorded_by="unit test", name="t", **kw)
    return S.record(header, ops if ops is not None else decode_ops())


def check(objs, rel_tol=0.0):
    return S.check_trace(S.parse_trace_text(S.dumps_trace(objs)), rel_tol=rel_tol)


# ---------------------------------------------------------------------------------------------
# recording and conformance
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,ops", [(DECODE, decode_ops()), (AGG, agg_ops()), (PREFILL, prefill_ops())],
                         ids=["decode", "aggregated", "prefill"])
def test_a_recorded_trace_conforms(args, ops):
    """STEP-19 then STEP-16: what the model records, the model accepts step by step."""
    objs = recorded(args, ops)
    assert len(objs) == len(ops) + 1
    report = check(objs)
    assert report.conforms and report.steps_checked == len(ops)
    assert report.lines()[0].startswith(f"conforms: {len(ops)} step(s)")


def test_recorder_clock_and_concrete_now():
    """STEP-19: a pass without now_ms runs at the largest end_ms so far and the value is written."""
    objs = recorded(AGG, agg_ops())
    passes = [o for o in objs[1:] if o["op"] == "pass"]
    assert passes[0]["now_ms"] == 0.0
    for prev, nxt in zip(passes, passes[1:]):
        assert nxt["now_ms"] == max(p["effects"]["end_ms"] for p in passes[: passes.index(nxt)])
    assert passes[-1]["now_ms"] > 0


def test_header_fields_and_start_state():
    """STEP-2 / STEP-3: the header repeats the worker role and names the model version."""
    h = recorded()[0]
    assert h["format"] == "mocker-spec/step-trace" and h["version"] == 1 and h["model_version"] == "1.3.0"
    assert h["worker_role"] == "decode" and h["dp_rank"] == 0 and h["capture_kv_events"] is True
    trace = S.parse_trace_text(S.dumps_trace([h]))
    core = S.new_model_core(trace.header)
    from model import core as C

    assert C.is_empty(core) and trace.steps == ()


def test_effect_encodings_of_every_operation():
    """STEP-5, STEP-10, STEP-11, STEP-12, STEP-13: results, lifecycle events, admissions, signals, KV
    events, metrics, FPM."""
    objs = recorded(PREFILL, prefill_ops())
    sub, p1, p2, rel, rel2 = objs[1:]
    assert sub["effects"] == {"result": {"kind": "submitted", "request_id": "p"}, "lifecycle_events": [],
                              "kv_events": []}
    held = [e for p in (p1, p2) for e in p["effects"]["lifecycle_events"]]
    assert held == [{"kind": "source_held", "handoff_id": "h", "request_id": "p",
                     "transfer_timing": {"mode": "full_prompt", "full_prompt_tokens": 10, "kv_bytes_per_token": 1024,
                                         "bandwidth_gb_s": 1.5}}]
    assert p1["effects"]["admissions"] == [{"uuid": "p", "reused_input_tokens": 0}]
    sig = p1["effects"]["output_signals"][0]
    assert set(sig) == {"uuid", "completed", "rejected", "handoff_delay_ms"}
    assert set(p1["effects"]["metrics"]) == {"dp_rank", "active_decode_blocks", "total_blocks", "gpu_cache_usage_perc",
                                             "running_requests", "waiting_requests", "vllm_preemptions_total",
                                             "sglang_cache_hit_tokens", "sglang_cache_total_tokens"}
    assert p1["effects"]["fpm"]["num_prefill_requests"] == 1
    assert p1["effects"]["router_event_visibility"] == "pass_start"
    assert len(p1["effects"]["accept_length"]) == 2
    stored = p1["effects"]["kv_events"]
    assert stored and stored[0]["kind"] == "stored" and stored[0]["event_id"] == 0
    assert set(stored[0]["blocks"][0]) == {"block_hash", "tokens_hash"}
    assert rel["effects"]["result"] == {"kind": "applied"}
    assert rel2["effects"]["result"] == {"kind": "noop"}
    dec = recorded()
    reserve = dec[1]["effects"]["lifecycle_events"]
    assert reserve == [{"kind": "destination_reserved", "handoff_id": "h0", "request_id": "r0",
                        "transferable_prompt_tokens": 16}]


def test_command_encoding_reads_back_as_the_same_command():
    """STEP-5 / STEP-6: ``encode_command`` is the inverse of the step reader for all seven commands,
    with and without the request's optional fields."""
    full = dict(req("r0", 5), dp_rank=1, arrival_timestamp_ms=2.5)
    for n, op in enumerate(S.COMMAND_OPS, 1):
        for request in (req("r0", 5), full):
            obj = {"step": n, "op": op}
            if op != "submit":
                obj["handoff_id"] = "h0"
            if op in ("submit", "submit_prefill", "reserve_destination"):
                obj["request"] = request
            command = S.parse_step(obj, n, n).command
            encoded = S.encode_command(command)
            assert encoded == {k: v for k, v in obj.items() if k != "step"}
            assert S.parse_step(dict(encoded, step=1), 1, 1).command == command
    with pytest.raises(TypeError, match="not a protocol command"):
        S.encode_command("submit")


def test_sglang_pass_ends_with_router_events_at_pass_end():
    """STEP-13 on the SGLang core."""
    objs = recorded({"engine_type": "sglang", "block_size": 2, "num_gpu_blocks": 40}, agg_ops()[:3])
    assert objs[3]["effects"]["router_event_visibility"] == "pass_end"
    assert check(objs).conforms


def test_rejected_command_keeps_the_core_and_its_message_is_not_compared():
    """STEP-8: an error kind, an informative message; the model core is unchanged."""
    objs = recorded()
    bad = objs[8]
    assert bad["op"] == "submit" and bad["effects"]["error"] == "RequestAlreadyActive"
    changed = copy.deepcopy(objs)
    changed[8]["effects"]["error_message"] = "a different wording"
    assert check(changed).conforms
    changed[8]["effects"]["error"] = "SourceHandoffActive"
    rep = check(changed)
    assert rep.divergence.step.number == 8 and rep.divergence.mismatch.field == "error"


def test_a_missing_request_id_is_an_error_kind():
    """STEP-6 / CMD-1: a null uuid is accepted by the format and rejected by the model."""
    objs = recorded(AGG, [{"op": "submit", "request": {"uuid": None, "tokens": [1], "max_output_tokens": 1}}])
    assert objs[1]["effects"]["error"] == "MissingRequestId"


def test_a_panic_ends_the_trace(monkeypatch):
    """STEP-8: after an InternalInvariantBroken the model has no core; a further step is a bad trace."""
    from model.errors import InternalInvariantBroken

    def boom(core, now_ms):
        raise InternalInvariantBroken("upstream would panic here")

    monkeypatch.setattr(S.C, "execute_pass", boom)
    objs = recorded(AGG, agg_ops()[:4])
    assert len(objs) == 4 and objs[3]["effects"]["error"] == "InternalInvariantBroken"  # recording stopped
    assert check(objs).conforms
    objs.append({"step": 4, "op": "retry", "effects": {}})
    with pytest.raises(S.BadTrace, match="line 5: op='retry': the trace goes on after an InternalInvariantBroken"):
        check(objs)


# ---------------------------------------------------------------------------------------------
# divergences
# ---------------------------------------------------------------------------------------------


def _set(objs, step, path, value):
    out = copy.deepcopy(objs)
    node = out[step]["effects"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


ALTERATIONS = [
    (1, ("result", "kind"), "noop", "result.kind"),
    (1, ("lifecycle_events", 0, "transferable_prompt_tokens"), 12, "lifecycle_events[0].transferable_prompt_tokens"),
    (2, ("lifecycle_events",), [{"kind": "destination_reserved", "handoff_id": "h1", "request_id": "r1",
                                  "transferable_prompt_tokens": 12}], "lifecycle_events (length)"),
    (3, ("kv_events", 0, "blocks", 1, "block_hash"), 1, "kv_events[0].blocks[1].block_hash"),
    (4, ("admissions", 0, "uuid"), "r1", "admissions[0].uuid"),
    (4, ("end_ms",), 1.5, "end_ms"),
    (4, ("metrics", "waiting_requests"), 7, "metrics.waiting_requests"),
    (4, ("fpm", "num_decode_requests"), 9, "fpm.num_decode_requests"),
    (4, ("accept_length",), [5, 5], "accept_length[0]"),
    (4, ("router_event_visibility",), "pass_end", "router_event_visibility"),
    (9, ("completed_requests",), 3, "completed_requests"),
]


@pytest.mark.parametrize("step,path,value,field", ALTERATIONS, ids=[a[3] for a in ALTERATIONS])
def test_one_altered_effect_is_found_at_its_step(step, path, value, field):
    """STEP-14 / STEP-15 / STEP-16: the report names the altered step and the field's path."""
    objs = recorded()
    altered = _set(objs, step, path, value)
    rep = check(altered)
    assert not rep.conforms
    assert rep.divergence.step.number == step
    assert rep.divergence.mismatch.field == field
    assert rep.steps_checked == step - 1


def test_result_versus_error():
    """STEP-14: a recorded result where the model rejects, and the reverse."""
    objs = recorded()
    a = _set(objs, 8, ("result",), {"kind": "submitted", "request_id": "r1"})
    del a[8]["effects"]["error"]
    rep = check(a)
    assert rep.divergence.mismatch.field == "error" and rep.divergence.mismatch.expected == "RequestAlreadyActive"
    b = copy.deepcopy(objs)
    b[1]["effects"] = {"error": "DestinationPromptTooLarge"}
    rep = check(b)
    assert rep.divergence.step.number == 1 and rep.divergence.mismatch.observed == "DestinationPromptTooLarge"


def test_unobserved_fields_are_not_compared():
    """STEP-14: a trace that records only results still conforms; nested keys may be left out too."""
    objs = recorded()
    sparse = [objs[0]] + [{k: v for k, v in o.items() if k != "effects"} | {"effects": {
        k: v for k, v in o["effects"].items() if k in ("result", "error")}} for o in objs[1:]]
    assert check(sparse).conforms
    partial = copy.deepcopy(objs)
    for o in partial[1:]:
        for s in o["effects"].get("output_signals", []):
            s.pop("handoff_delay_ms")
        o["effects"].pop("fpm", None)
    assert check(partial).conforms
    extra = _set(objs, 4, ("metrics", "bogus"), 1)
    assert check(extra).divergence.mismatch.field == "metrics.bogus"


def test_number_comparison_rules():
    """STEP-15: 1 equals 1.0, booleans are not numbers, floats are exact unless a tolerance is given."""
    assert S.compare_values(1, 1.0, "x") is None
    assert S.compare_values(True, 1, "x") is not None
    assert S.compare_values(0, False, "x") is not None
    assert S.compare_values(1.0, 1.0 + 1e-12, "x") is not None
    assert S.compare_values(1.0, 1.0 + 1e-12, "x", rel_tol=1e-9) is None
    # the tolerance is relative to the larger magnitude and includes its bound: |1 - 2| = 0.5 * 2
    assert S.compare_values(1.0, 2.0, "x", rel_tol=0.5) is None
    assert S.compare_values(-1.0, -2.0, "x", rel_tol=0.5) is None
    assert S.compare_values(1.0, 2.0, "x", rel_tol=0.4999) is not None
    assert S.compare_values([1, 2], [1, 2, 3], "l").field == "l (length)"
    assert S.compare_values({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}, "o").field == "o.a[1].b"
    objs = recorded()
    nudged = _set(objs, 4, ("end_ms",), objs[4]["effects"]["end_ms"] * (1 + 1e-12))
    assert not check(nudged).conforms and check(nudged, rel_tol=1e-9).conforms


def test_report_shows_the_model_state_before_the_step_and_recorded_by():
    """STEP-17."""
    objs = recorded()
    rep = check(_set(objs, 7, ("lifecycle_events",), []))
    text = "\n".join(rep.lines())
    assert "diverges at step 7 of 9 (line 8, retry) in trace t" in text
    assert "recorded by: unit test" in text
    assert "model state before step 7:" in text
    assert "pending destinations (FIFO): [h1:r1 tried@" in text
    assert "waiting: [" in text and "capacity generation:" in text


# ---------------------------------------------------------------------------------------------
# malformed traces
# ---------------------------------------------------------------------------------------------


def _lines(objs):
    return S.dumps_trace(objs)


BAD = [
    (lambda o: o[0].update(model_version="1.6.1"), "line 1: header.model_version='1.6.1'"),
    (lambda o: o[0].update(worker_role="prefill"), "line 1: header.worker_role='prefill': disagrees"),
    (lambda o: o[0]["engine_args"].update(block_size=-1), "line 1: header.engine_args.block_size=-1"),
    (lambda o: o[0].update(colour="red"), "line 1: header.colour='red': unknown header field"),
    (lambda o: o[2].update(op="frob"), "line 3: op='frob': unknown operation"),
    (lambda o: o[2].update(step=5), "line 3: step=5: steps are numbered"),
    (lambda o: o[4].pop("now_ms"), "line 5: now_ms=null: a pass needs a finite now_ms"),
    (lambda o: o[4].update(handoff_id="h0"), "line 5: handoff_id='h0': pass takes no handoff id"),
    (lambda o: o[1]["request"].update(tokens=[-1]), "line 2: request.tokens=[-1]: must be a list of u32"),
    (lambda o: o[1]["request"].update(tokens=[2**32]), "line 2: request.tokens=[4294967296]: must be a list of u32"),
    (lambda o: o[1]["effects"].update(end_ms=1.0), "line 2: effects.end_ms=1.0: not an effect of reserve_destination"),
    (lambda o: o[3].update(request=req("x", 1)), "line 4: request="),
    (lambda o: o[1]["effects"].update(error="X"), "line 2: effects.error='X': a step has a result or an error"),
    # an error effect is the error kind, a non-empty string (a number or "" passed before)
    (lambda o: (o[1]["effects"].pop("result"), o[1]["effects"].update(error=5)),
     "line 2: effects.error=5: must be the error kind"),
    (lambda o: (o[1]["effects"].pop("result"), o[1]["effects"].update(error="")),
     "line 2: effects.error='': must be the error kind"),
    # the request's uuid is required (it may be null), as the schema says
    (lambda o: o[1]["request"].pop("uuid"), "line 2: request.uuid=null: missing"),
]


@pytest.mark.parametrize("mutate,message", BAD, ids=[b[1].split(":")[1].strip() for b in BAD])
def test_malformed_traces_name_line_field_and_value(mutate, message):
    """STEP-3 / STEP-4 / STEP-6 / STEP-7 / STEP-9: one line naming the line, the field and the value."""
    objs = recorded()
    mutate(objs)
    with pytest.raises(S.BadTrace) as err:
        S.parse_trace_text(_lines(objs))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_not_json_and_empty():
    """STEP-1 / STEP-9: NaN and Infinity are not JSON either."""
    with pytest.raises(S.BadTrace, match=r"^line 2: json="):
        S.parse_trace_text(_lines(recorded()[:1]) + "{nope\n")
    objs = recorded()
    text = _lines(objs).replace('"now_ms":0.0', '"now_ms":NaN', 1)
    assert "NaN" in text
    with pytest.raises(S.BadTrace, match=r"json=.*NaN is not JSON"):
        S.parse_trace_text(text)
    with pytest.raises(S.BadTrace, match="the trace is empty"):
        S.parse_trace_text("\n\n")


def test_a_key_given_twice_is_refused():
    """STEP-1 / STEP-9: ``json`` would keep the second ``now_ms`` and replay a different pass."""
    text = _lines(recorded()).replace('"now_ms":0.0', '"now_ms":0.0,"now_ms":5.0', 1)
    line = next(i for i, t in enumerate(text.splitlines(), start=1) if '"now_ms":5.0' in t)
    with pytest.raises(S.BadTrace, match=rf"^line {line}: key 'now_ms' is given twice in one object$"):
        S.parse_trace_text(text)


def test_blank_lines_are_skipped_and_line_numbers_kept():
    """STEP-1."""
    objs = recorded()
    text = _lines(objs[:2]) + "\n\n" + _lines(objs[2:])
    assert S.check_trace(S.parse_trace_text(text)).conforms
    objs[2]["op"] = "nope"
    text = _lines(objs[:2]) + "\n\n" + _lines(objs[2:])
    with pytest.raises(S.BadTrace, match="^line 5: op='nope'"):
        S.parse_trace_text(text)


def test_every_written_line_matches_the_json_schema():
    """STEP-1..STEP-13 as spec/step-trace.schema.json states them."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "spec" / "step-trace.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for objs in (recorded(), recorded(AGG, agg_ops()), recorded(PREFILL, prefill_ops())):
        for o in objs:
            jsonschema.validate(o, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"step": 1, "op": "pass"}, schema)


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------


def test_cli_check_exit_codes(tmp_path, capsys):
    """STEP-18: 0 conforms, 1 diverges (naming the step), 2 malformed; directories are walked."""
    good = tmp_path / "good.jsonl"
    S.write_trace(good, recorded())
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "conforms: 9 step(s)" in out and "recorded by: unit test" in out

    bad = tmp_path / "sub" / "altered.jsonl"
    S.write_trace(bad, _set(recorded(), 5, ("output_signals",), []))
    assert main(["check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "diverges at step 5 of 9" in out and "field: output_signals (length)" in out

    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "1/2 traces conform, 1 diverge" in out

    broken = tmp_path / "broken.jsonl"
    broken.write_text(good.read_text().replace('"op":"retry"', '"op":"frob"'))
    assert main(["check", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "bad trace: line 8: op='frob'" in err and len(err.strip().splitlines()) == 1
    assert main(["check", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["check", str(good), "--rel-tol", "-1"]) == 2
    assert main(["check", str(good), "--rel-tol", "nan"]) == 2  # was taken, and silently meant exact (0)


def test_cli_check_runs_as_a_program(tmp_path):
    """STEP-18 through the installed entry point."""
    good = tmp_path / "good.jsonl"
    S.write_trace(good, recorded(AGG, agg_ops()))
    proc = subprocess.run([sys.executable, "-m", "mocker_spec.cli", "check", str(good)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0 and "conforms" in proc.stdout


def test_a_trace_that_is_not_utf8_names_the_line_of_the_bad_byte(tmp_path):
    """STEP-1: the refusal of a non-UTF-8 trace names the line holding the first bad byte (1-based),
    like every other trace refusal."""
    f = tmp_path / "t.jsonl"
    f.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": "\xff"}\n')
    with pytest.raises(S.BadTrace, match=r"^line 3: trace=.*: not UTF-8$"):
        S.read_trace(f)
    f.write_bytes(b"\xfe")
    with pytest.raises(S.BadTrace, match=r"^line 1: "):
        S.read_trace(f)
