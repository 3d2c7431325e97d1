"""LIVE-6 and FID-5: dead-end diagnoses (model/replay/dead_end.py).

The dead ends here are recorded from the compiled reference (tests/goldens/refcases, expected.status)
and reproduced by the model (test_replay.py checks the message); these tests check why the model
says each one happens, and that the explorer's known-defect states get the same cause."""

from __future__ import annotations

import json
import pathlib

import pytest

from explorer import explore, load_scenario
from explorer.outputs import deadlock_diagnosis
from model import core as C
from model.engine_args import engine_args_from_json
from model.protocol import DirectRequest
from model.replay import ReplayDeadEnd, run_replay
from model.replay.dead_end import CAUSES, completes_alone, diagnose_dead_end
from mocker_spec import cli
from mocker_spec.reference import setup_from_job, workload_from_job

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "tests" / "goldens" / "refcases"
KNOWN = ROOT / "spec" / "scenarios" / "known-defects"


def _dead_end(case: str) -> ReplayDeadEnd:
    d = GOLDENS / case
    assert "dead end" in (d / "expected.status").read_text()  # the compiled reference's own verdict
    job = dict(json.loads((d / "case.json").read_text()), trace_file=str(d / "trace.jsonl"))
    setup = setup_from_job(job)
    with pytest.raises(ReplayDeadEnd) as exc:
        run_replay(setup, workload_from_job(job, setup))
    return exc.value


def _causes(exc: ReplayDeadEnd):
    return [(d.stage, d.worker_idx, d.cause) for d in diagnose_dead_end(exc.stuck)]


def test_gen_1_0100_is_s6_a_preempted_head_in_front_of_an_activated_destination():
    """The compiled build's DIS-15 dead end of gen-1-0100: the decode worker's head is a destination
    that was preempted and must be prefilled again; the activated destination behind it holds the
    blocks it needs, while the head alone fits the 125-block pool."""
    exc = _dead_end("gen-1-0100")
    assert _causes(exc) == [("decode", 0, "blocked_head_before_activated_destination")]
    (w,) = exc.stuck
    waiting, running = C.queues(w.core)
    assert not running and len(waiting) == exc.in_flight == 2
    assert C.request_status(w.core, waiting[0]) == "preempted"
    assert waiting[1] in set(w.core.ledger.active_destinations.by_handoff.values())


def test_s9_retraction_golden_is_the_retracted_destination():
    exc = _dead_end("s9-retraction-deadlock")
    assert _causes(exc) == [("decode", 0, "retracted_destination")]


def test_gen_23_0273_two_half_prefilled_sglang_requests_hold_the_pool():
    """The compiled build's DRV-16 dead end of gen-23-0273 (aggregated SGLang, 128-token chunks, 87
    blocks of 8): the head kept the slots of the chunks it already prefilled, a second request did
    the same, and neither's next chunk is admitted, though the head alone completes."""
    exc = _dead_end("gen-23-0273")
    assert _causes(exc) == [("aggregated", 0, "half_prefilled_head")]
    (w,) = exc.stuck
    waiting, running = C.queues(w.core)
    assert not running
    partly = [u for u in waiting if w.core.find(u).materialized_tokens > 0]
    assert partly[0] == waiting[0] and len(partly) >= 2


def test_zero_output_vllm_request_runs_forever_without_a_token():
    """The compiled build's DRV-11 dead end of golden zero-output-vllm-single: nothing waits, and
    the running request asks for 0 output tokens, so it is never ready (VLLM-Q4). The cause used
    to read as a worker waiting for other workers' handoffs."""
    exc = _dead_end("zero-output-vllm-single")
    assert _causes(exc) == [("aggregated", 0, "zero_output_running")]
    (d,) = diagnose_dead_end(exc.stuck)
    assert "max_output_tokens 0" in d.text


@pytest.mark.parametrize("case", ["gen-1-0169", "gen-1-0137"])
def test_configuration_dead_ends_never_complete_alone(case):
    """gen-1-0169: a TRT-LLM prompt above the token budget with chunking off (VLLM-6); gen-1-0137:
    SGLang prompts above ``max_prefill_tokens`` (quirk E3). Their heads fail even alone."""
    exc = _dead_end(case)
    assert exc.stuck and {c for _s, _i, c in _causes(exc)} == {"never_completes_alone"}


def test_completes_alone_counterfactual():
    """LIVE-6 by hand: 20 tokens are 2 blocks of 16 (plus the output token's), so a 4-block pool
    drains and a 1-block pool never admits; with chunking off and an 8-token budget the 20-token
    prompt is never scheduled (VLLM-6); zero output tokens never complete (VLLM-Q4)."""
    req = DirectRequest(tuple(range(20)), 2, uuid="r")
    roomy = engine_args_from_json({"block_size": 16, "num_gpu_blocks": 4})
    assert completes_alone(roomy, req)
    assert not completes_alone(engine_args_from_json({"block_size": 16, "num_gpu_blocks": 1}), req)
    budget = {"block_size": 16, "num_gpu_blocks": 4, "enable_chunked_prefill": False, "max_num_batched_tokens": 8}
    assert not completes_alone(engine_args_from_json(budget), req)
    assert not completes_alone(roomy, DirectRequest(tuple(range(20)), 0, uuid="r"))
    sg = engine_args_from_json({"engine_type": "sglang", "block_size": 16, "num_gpu_blocks": 4})
    assert completes_alone(sg, req)


@pytest.mark.parametrize("name, cause", [
    ("s6-vllm-fresh-head-deadlock", "blocked_head_before_activated_destination"),
    ("s6-vllm-activated-fifo-deadlock", "blocked_head_before_activated_destination"),
    ("s9-sglang-retracted-destination-deadlock", "retracted_destination"),
])
def test_explorer_deadlock_states_get_the_same_cause(name, cause):
    """The explorer's shortest deadlock of each known-defect scenario, replayed step by step, ends
    in a core that LIVE-6 classifies as the defect the scenario stands for."""
    exp = explore(load_scenario(KNOWN / f"{name}.json"))
    d = deadlock_diagnosis(exp, exp.violation("deadlock"))
    assert d.cause == cause, d.text
    assert d.cause in CAUSES


def test_cli_prints_why_under_the_dead_end(capsys):
    d = GOLDENS / "gen-1-0100"
    case = json.loads((d / "case.json").read_text())
    rc = cli.main(["replay", str(d / "trace.jsonl"), "--prefill-engine-args", json.dumps(case["prefill_engine_args"]),
                   "--decode-engine-args", json.dumps(case["decode_engine_args"]),
                   "--num-prefill-workers", "2", "--num-decode-workers", "1", "--trace-block-size", "64",
                   "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 3
    lines = err.strip().splitlines()
    assert lines[0] == "error: offline disagg replay reached a dead end with 2 in-flight requests remaining"
    assert lines[1].startswith("  why: decode worker 0: the head ") and "(S6;" in lines[1]
