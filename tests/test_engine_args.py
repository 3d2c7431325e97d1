"""Tests for model.engine_args (spec/engine-args.md, rules ARGS-1 .. ARGS-18)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model.engine_args import (
    EngineArgs,
    EngineType,
    KvTransferTimingMode,
    PreemptionMode,
    RouterQueuePolicy,
    SchedulePolicy,
    SchedulingPolicy,
    SglangArgs,
    WorkerType,
    check_aggregated_replay_args,
    check_disagg_replay_args,
    engine_args_from_json,
    resolve_schedule_policy,
)
from model.errors import InvalidInput


def rejects(obj, field=None, rule=None, dialect="json"):
    with pytest.raises(InvalidInput) as info:
        engine_args_from_json(obj, dialect=dialect)
    if field is not None:
        assert info.value.field == field, str(info.value)
    if rule is not None:
        assert info.value.rule == rule, str(info.value)
    assert "\n" not in str(info.value)
    return info.value


# ---------------------------------------------------------------------------
# Defaults and normalisation (ARGS-1, ARGS-2)
# ---------------------------------------------------------------------------


def test_args1_defaults_match_reference():
    """ARGS-1: defaults. Reference values read from MockEngineArgs() / from_json('{}') in 1.3.0.post1:
    engine vllm, block_size 64, num_gpu_blocks 16384, max_num_seqs 256, max_num_batched_tokens 8192,
    worker aggregated, kv_transfer_timing_mode full_prompt, dp_size 1."""
    a = engine_args_from_json({})
    assert a == EngineArgs()
    assert (a.engine_type, a.block_size, a.num_gpu_blocks, a.max_num_seqs, a.max_num_batched_tokens) == (
        EngineType.VLLM, 64, 16384, 256, 8192)
    assert (a.worker_type, a.kv_transfer_timing_mode, a.dp_size) == (
        WorkerType.AGGREGATED, KvTransferTimingMode.FULL_PROMPT, 1)
    assert a.enable_prefix_caching and a.enable_chunked_prefill
    assert (a.speedup_ratio, a.decode_speedup_ratio, a.preemption_mode) == (1.0, 1.0, PreemptionMode.LIFO)
    assert a.handoff_session_timeout_ms == 300_000


@pytest.mark.parametrize("obj,expected", [
    ({"engine_type": "vllm"}, 64),
    ({"engine_type": "trtllm"}, 32),
    ({"engine_type": "sglang"}, 1),
    ({"engine_type": "sglang", "sglang": {"page_size": 16}}, 16),
    ({"engine_type": "sglang", "sglang": None}, 1),
    ({"engine_type": "sglang", "sglang": {"page_size": None}}, 1),
    ({"engine_type": "vllm", "block_size": 0}, 64),
    ({"engine_type": "vllm", "block_size": 1}, 1),
    ({"engine_type": "vllm", "sglang": {"page_size": 4, "chunked_prefill_size": 7}}, 64),
])
def test_args2_effective_block_size(obj, expected):
    """ARGS-2: block_size 0 -> 64 / 32 / page_size-or-1 (reference values from MockEngineArgs.from_json)."""
    assert engine_args_from_json(obj).block_size == expected


def test_normalized_sglang_defaults_block_size_to_one():
    """protocols.rs test_normalized_sglang_defaults_block_size_to_one; ARGS-2."""
    assert EngineArgs(engine_type="sglang").block_size == 1


def test_normalized_sglang_uses_page_size_alias_for_block_size():
    """protocols.rs test_normalized_sglang_uses_page_size_alias_for_block_size; ARGS-2."""
    assert EngineArgs(engine_type="sglang", sglang=SglangArgs(page_size=16)).block_size == 16


def test_normalized_sglang_accepts_equal_block_size_and_page_size():
    """protocols.rs test_normalized_sglang_accepts_equal_block_size_and_page_size; ARGS-8."""
    assert EngineArgs(engine_type="sglang", block_size=8, sglang=SglangArgs(page_size=8)).block_size == 8


def test_normalized_sglang_rejects_mismatched_block_size_and_page_size():
    """protocols.rs test_normalized_sglang_rejects_mismatched_block_size_and_page_size; ARGS-8."""
    with pytest.raises(InvalidInput) as info:
        EngineArgs(engine_type="sglang", block_size=8, sglang=SglangArgs(page_size=4))
    assert info.value.rule == "ARGS-8" and "block_size and sglang.page_size to match" in str(info.value)


def test_from_json_file_normalizes_sglang_page_size():
    """protocols.rs test_from_json_file_normalizes_sglang_page_size; ARGS-2."""
    assert engine_args_from_json({"engine_type": "sglang", "sglang": {"page_size": 32}}).block_size == 32


def test_normalized_sglang_rejects_chunked_prefill_not_divisible_by_block_size():
    """protocols.rs test_normalized_sglang_rejects_chunked_prefill_not_divisible_by_block_size; ARGS-9."""
    with pytest.raises(InvalidInput) as info:
        EngineArgs(engine_type="sglang", block_size=4, sglang=SglangArgs(page_size=4, chunked_prefill_size=6))
    assert info.value.rule == "ARGS-9" and "divisible by block_size" in str(info.value)


def test_normalized_sglang_accepts_chunked_prefill_divisible_by_block_size():
    """protocols.rs test_normalized_sglang_accepts_chunked_prefill_divisible_by_block_size; ARGS-9."""
    a = EngineArgs(engine_type="sglang", block_size=4, sglang=SglangArgs(page_size=4, chunked_prefill_size=8))
    assert a.block_size == 4


def test_args9_page_size_from_alias_checked_against_chunk():
    """ARGS-9 after ARGS-2: page 8 -> block 8, chunk 12 rejected (reference rejects it too)."""
    rejects({"engine_type": "sglang", "sglang": {"page_size": 8, "chunked_prefill_size": 12}},
            "sglang.chunked_prefill_size", "ARGS-9")
    # chunk 0 is divisible and accepted (sub-arg ranges are not enforced upstream)
    engine_args_from_json({"engine_type": "sglang", "block_size": 4, "sglang": {"chunked_prefill_size": 0}})


def test_args7_zero_page_size_gives_zero_block_size():
    """ARGS-7: sglang.page_size 0 makes block_size 0, which is rejected."""
    rejects({"engine_type": "sglang", "sglang": {"page_size": 0}}, "block_size", "ARGS-7")


# ---------------------------------------------------------------------------
# JSON loader: keys, types, nulls, enums (ARGS-3, ARGS-11, ARGS-13)
# ---------------------------------------------------------------------------


def test_mock_engine_args_json_rejects_unknown_and_invalid_types():
    """protocols.rs test_mock_engine_args_json_rejects_unknown_and_invalid_types; ARGS-11, ARGS-13."""
    rejects({"unknown": True}, "unknown", "ARGS-11")
    rejects({"gpu_memory_utilization": "bad"}, "gpu_memory_utilization", "ARGS-13")
    rejects(["not", "an", "object"], "engine_args", "ARGS-11")


def test_mock_engine_args_accepts_legacy_enum_case_and_writes_lowercase():
    """protocols.rs test_mock_engine_args_accepts_legacy_enum_case_and_writes_lowercase; ARGS-3."""
    a = engine_args_from_json({"engine_type": "Vllm", "worker_type": "Aggregated", "preemption_mode": "Lifo"})
    assert (a.engine_type.value, a.worker_type.value, a.preemption_mode.value) == ("vllm", "aggregated", "lifo")


def test_mock_engine_args_json_round_trip_preserves_worker_type_and_nulls():
    """protocols.rs test_mock_engine_args_json_round_trip_preserves_worker_type_and_nulls; ARGS-1, ARGS-13."""
    payload = {
        "engine_type": "vllm", "num_gpu_blocks": 16384, "block_size": 64, "max_num_seqs": None,
        "max_num_batched_tokens": None, "enable_prefix_caching": True, "enable_chunked_prefill": True,
        "speedup_ratio": 1.0, "decode_speedup_ratio": 1.0, "dp_size": 1, "startup_time": None,
        "worker_type": "decode", "planner_profile_data": None, "aic_backend": None, "aic_system": None,
        "aic_backend_version": None, "aic_tp_size": None, "aic_model_path": None, "enable_local_indexer": False,
        "bootstrap_port": None, "handoff_session_timeout_ms": 300000, "kv_bytes_per_token": None,
        "kv_transfer_bandwidth": None, "kv_transfer_timing_mode": "full_prompt", "num_g2_blocks": None,
        "num_g3_blocks": None, "enable_g4_storage": False, "offload_batch_size": None,
        "bandwidth_g1_to_g2_gbps": None, "bandwidth_g2_to_g1_gbps": None, "bandwidth_g2_to_g3_gbps": None,
        "bandwidth_g3_to_g2_gbps": None, "bandwidth_g2_to_g4_gbps": None, "bandwidth_g4_to_g2_gbps": None,
        "reasoning": None, "zmq_kv_events_port": None, "zmq_replay_port": None, "preemption_mode": "lifo",
        "router_queue_policy": None, "sglang": None, "has_perf_model": True,
    }
    a = engine_args_from_json(payload)
    assert a.worker_type is WorkerType.DECODE
    assert a.max_num_seqs is None and a.max_num_batched_tokens is None
    assert a.kv_transfer_timing_mode is KvTransferTimingMode.FULL_PROMPT


def test_mock_engine_args_json_accepts_aic_quant_dtypes():
    """protocols.rs test_mock_engine_args_json_accepts_aic_quant_dtypes; ARGS-14 (accepted, not modelled)."""
    engine_args_from_json({"aic_gemm_dtype": "fp8_block", "aic_moe_dtype": "w4a16_mxfp4",
                           "aic_fmha_dtype": "bfloat16", "aic_kv_cache_dtype": "fp8", "aic_comm_dtype": "fp8"})


def test_mock_engine_args_from_json_ignores_legacy_has_perf_model_field():
    """components/.../test_config.py test_mock_engine_args_from_json_ignores_legacy_has_perf_model_field; ARGS-11."""
    assert engine_args_from_json({"has_perf_model": {"anything": [1, 2]}}) == EngineArgs()
    rejects({"has_perf_model": True}, "has_perf_model", "ARGS-11", dialect="kwargs")


def test_args13_nulls():
    """ARGS-13: num_gpu_blocks null keeps 16384; Option fields take null; the rest reject null."""
    assert engine_args_from_json({"num_gpu_blocks": None}).num_gpu_blocks == 16384
    a = engine_args_from_json({"max_num_seqs": None, "max_num_batched_tokens": None, "startup_time": None})
    assert a.max_num_seqs is None and a.max_num_batched_tokens is None
    for key in ("block_size", "engine_type", "worker_type", "speedup_ratio", "dp_size", "aic_mtp_seed",
                "enable_prefix_caching", "preemption_mode", "kv_transfer_timing_mode", "is_prefill"):
        rejects({key: None}, key, "ARGS-13")
    # is_prefill/is_decode are not read when worker_type is given
    assert engine_args_from_json({"worker_type": "decode", "is_prefill": None}).is_decode


def test_args13_types():
    """ARGS-13: JSON types (reference messages 'invalid type'/'invalid value')."""
    rejects({"block_size": 2.0}, "block_size", "ARGS-13")
    rejects({"block_size": -2}, "block_size", "ARGS-13")
    rejects({"block_size": True}, "block_size", "ARGS-13")
    rejects({"enable_prefix_caching": 1}, "enable_prefix_caching", "ARGS-13")
    rejects({"speedup_ratio": "2"}, "speedup_ratio", "ARGS-13")
    rejects({"dp_size": 2**32}, "dp_size", "ARGS-13")
    rejects({"bootstrap_port": 70000}, "bootstrap_port", "ARGS-13")
    rejects({"num_gpu_blocks": 2**64}, "num_gpu_blocks", "ARGS-13")
    rejects({"aic_mtp_seed": -1}, "aic_mtp_seed", "ARGS-13")
    rejects({"sglang": {"page_size": "4"}}, "sglang.page_size", "ARGS-13")
    rejects({"sglang": {"schedule_policy": 1}}, "sglang.schedule_policy", "ARGS-13")
    rejects({"sglang": []}, "sglang", "ARGS-13")
    rejects({"reasoning": {"start_thinking_token_id": 1}}, "reasoning.end_thinking_token_id", "ARGS-13")
    assert engine_args_from_json({"speedup_ratio": 2}).speedup_ratio == 2.0
    assert engine_args_from_json({"num_gpu_blocks": 2**64 - 1}).num_gpu_blocks == 2**64 - 1
    # each width's largest value is accepted (u32: 2**32 - 1; u16: 2**16 - 1), one more is refused above
    assert engine_args_from_json({"dp_size": 2**32 - 1}).dp_size == 2**32 - 1
    assert engine_args_from_json({"zmq_kv_events_port": 2**16 - 1}).zmq_kv_events_port == 2**16 - 1


def test_args5_non_finite_floats_rejected():
    """ARGS-5: JSON has no NaN/Infinity (serde: 'expected value' / 'number out of range')."""
    for v in (float("nan"), float("inf"), 10**400):
        rejects({"speedup_ratio": v}, "speedup_ratio")


def test_args3_enums():
    """ARGS-3: enum spellings; JSON is ASCII-case-insensitive except router_queue_policy."""
    assert engine_args_from_json({"engine_type": "SGLang", "worker_type": "Prefill"}).worker_type is WorkerType.PREFILL
    assert engine_args_from_json({"preemption_mode": "FIFO"}).preemption_mode is PreemptionMode.FIFO
    assert (engine_args_from_json({"kv_transfer_timing_mode": "DESTINATION_MISSING"}).kv_transfer_timing_mode
            is KvTransferTimingMode.DESTINATION_MISSING)
    assert engine_args_from_json({"router_queue_policy": "wspt"}).router_queue_policy is RouterQueuePolicy.WSPT
    rejects({"router_queue_policy": "WSPT"}, "router_queue_policy", "ARGS-3")
    rejects({"engine_type": "tgi"}, "engine_type", "ARGS-3")
    rejects({"kv_transfer_timing_mode": "x"}, "kv_transfer_timing_mode", "ARGS-3")
    assert engine_args_from_json({"is_prefill": True}).worker_type is WorkerType.PREFILL
    assert engine_args_from_json({"is_decode": True}).worker_type is WorkerType.DECODE
    assert engine_args_from_json({"worker_type": "decode", "is_prefill": True}).worker_type is WorkerType.DECODE
    rejects({"is_prefill": True, "is_decode": True}, rule="ARGS-3")


def test_args3_kwargs_dialect_is_case_sensitive():
    """ARGS-3: the Python constructor matches engine/worker/preemption strings exactly."""
    rejects({"engine_type": "Vllm"}, "engine_type", "ARGS-3", dialect="kwargs")
    rejects({"worker_type": "Prefill"}, "worker_type", "ARGS-3", dialect="kwargs")
    a = engine_args_from_json({"kv_transfer_timing_mode": "Destination_Missing"}, dialect="kwargs")
    assert a.kv_transfer_timing_mode is KvTransferTimingMode.DESTINATION_MISSING
    rejects({"is_prefill": True}, "is_prefill", "ARGS-11", dialect="kwargs")
    rejects({"sglang": {"page_size": 4, "bogus": 1}}, "sglang.bogus", "ARGS-11", dialect="kwargs")
    # Python's bool is an int for the constructor: block_size=True is 1
    assert engine_args_from_json({"block_size": True}, dialect="kwargs").block_size == 1


def test_args11_nested_unknown_keys_ignored_in_json():
    """ARGS-11: unknown keys inside sglang/trtllm/reasoning are ignored by the JSON form."""
    a = engine_args_from_json({"engine_type": "sglang", "sglang": {"page_size": 16, "bogus": 1},
                               "trtllm": {"capacity_scheduler_policy": None, "x": 1},
                               "reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2,
                                             "thinking_ratio": 2.0, "x": 1}})
    assert a.block_size == 16


def test_args11_nested_object_as_a_sequence_in_json_only():
    """ARGS-11: the JSON form also takes a nested object as an array of all its members in
    declaration order (serde's sequence form, checked against the compiled build); a wrong length
    is refused with serde's message; the constructor form has no sequence form."""
    members = {"schedule_policy": "lpm", "page_size": 4, "max_prefill_tokens": 100, "chunked_prefill_size": 64,
               "clip_max_new_tokens": 10, "schedule_conservativeness": 0.5}
    as_map = engine_args_from_json({"engine_type": "sglang", "sglang": members})
    as_seq = engine_args_from_json({"engine_type": "sglang", "sglang": list(members.values())})
    assert as_seq == as_map and as_seq.sglang.page_size == 4 and as_seq.sglang.schedule_policy == "lpm"
    short = rejects({"engine_type": "sglang", "sglang": ["lpm", 4]}, "sglang", "ARGS-13")
    assert "invalid length 2, expected 6 elements" in str(short)
    rejects({"engine_type": "sglang", "sglang": tuple(members.values())}, "sglang", "ARGS-13", dialect="kwargs")


@pytest.mark.parametrize("seq, field, text", [
    # recorded from the compiled build (a CLI job's JSON engine arguments): serde reads the
    # elements in order and refuses the first bad one by its index, before counting them
    (["lpm", "x"], "sglang[1]", "invalid type"),  # `sglang[1]: invalid type: string "x", expected usize`
    (["lpm", "x", 1, 1, 1, 1.0], "sglang[1]", "invalid type"),
    (["lpm"], "sglang", "invalid length 1, expected 6 elements"),  # `sglang: invalid length 1, ...`
    ([], "sglang", "invalid length 0, expected 6 elements"),
    (["lpm", 16, 1024, 64, 32, 0.5, 7], "sglang", "trailing characters"),  # `sglang: trailing characters ...`
    ([1, 16, 1024, 64, 32, 0.5, 7], "sglang[0]", "invalid type"),  # elements first, then the count
])
def test_args11_sequence_form_is_read_element_by_element(seq, field, text):
    """ARGS-11, ARGS-13: a nested object in serde's sequence form is checked element by element in
    declaration order; a missing element is an invalid length and an extra one is trailing
    characters, both naming the object."""
    error = rejects({"engine_type": "sglang", "sglang": seq}, field, "ARGS-13")
    assert text in str(error)


def test_args11_sequence_form_nulls():
    """ARGS-11, ARGS-13: in the sequence form a null member of an optional object is None (the
    build runs ``[null, 16, ...]``), and a null member of ``reasoning`` is refused by its index
    (`reasoning[0]: invalid type: null, expected u32`)."""
    args = engine_args_from_json({"engine_type": "sglang", "sglang": [None, 16, 1024, 64, 32, 0.5]})
    assert args.sglang.schedule_policy is None and args.sglang.page_size == 16
    error = rejects({"reasoning": [None, None, None]}, "reasoning[0]", "ARGS-13")
    assert "invalid type: null, expected u32" in str(error)


# ---------------------------------------------------------------------------
# Ranges and cross-field rules (ARGS-6, ARGS-10, ARGS-14, ARGS-15)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("obj,field", [
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
    ({"speedup_ratio": -1.0}, "speedup_ratio"),
    ({"decode_speedup_ratio": -0.5}, "decode_speedup_ratio"),
    ({"dp_size": 0}, "dp_size"),
    ({"kv_transfer_bandwidth": -1.0}, "kv_transfer_bandwidth"),
    ({"startup_time": -1.0}, "startup_time"),
    ({"handoff_session_timeout_ms": 0}, "handoff_session_timeout_ms"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"bandwidth_g1_to_g2_gbps": -1}, "bandwidth_g1_to_g2_gbps"),
])
def test_args6_ranges(obj, field):
    """ARGS-6: validator ranges (each case rejected by the reference's from_json)."""
    rejects(obj, field, "ARGS-6")


def test_args6_boundaries_accepted():
    """ARGS-6: zero ratios and zero bandwidth are accepted (reference accepts them)."""
    a = engine_args_from_json({"speedup_ratio": 0.0, "decode_speedup_ratio": 0.0, "kv_transfer_bandwidth": 0})
    assert a.speedup_ratio == 0.0 and a.kv_transfer_bandwidth == 0.0
    assert engine_args_from_json({"dp_size": 2}).dp_size == 2


def test_args10_trtllm_policy():
    """ARGS-10: only guaranteed_no_evict, checked whatever the engine type."""
    engine_args_from_json({"engine_type": "trtllm", "trtllm": {"capacity_scheduler_policy": "guaranteed_no_evict"}})
    rejects({"engine_type": "trtllm", "trtllm": {"capacity_scheduler_policy": "max_utilization"}},
            "trtllm.capacity_scheduler_policy", "ARGS-10")
    rejects({"trtllm": {"capacity_scheduler_policy": "max_utilization"}}, rule="ARGS-10")


def test_normalized_rejects_out_of_range_aic_nextn():
    """protocols.rs test_normalized_rejects_out_of_range_aic_nextn; ARGS-10, then ARGS-14 for in-range values."""
    for bad in (0, 6, 2**64 - 1):
        rejects({"aic_nextn": bad}, "aic_nextn", "ARGS-10")
    rejects({"aic_nextn": 3}, "aic_nextn", "ARGS-14")


def test_mtp_rejects_decode_speedup_ratio():
    """protocols.rs test_mtp_rejects_decode_speedup_ratio; ARGS-10."""
    err = rejects({"aic_nextn": 1, "decode_speedup_ratio": 2.0}, "decode_speedup_ratio", "ARGS-10")
    assert "decode_speedup_ratio=1.0" in str(err)


def test_mtp_rates_are_validated_before_normalization():
    """protocols.rs test_mtp_rates_are_validated_before_normalization; ARGS-10."""
    for rates in ("nan", "inf", "-0.1", "1.1", "bad"):
        rejects({"aic_nextn": 1, "aic_nextn_accept_rates": rates}, "aic_nextn_accept_rates", "ARGS-10")
    rejects({"aic_nextn_accept_rates": "0.5"}, "aic_nextn_accept_rates", "ARGS-10")


def test_mtp_rates_are_all_parsed_with_rusts_syntax_before_any_range_check():
    """ARGS-10: speculative.rs:17-34 parses every entry (trimmed by Rust's str::trim) with f64's
    own grammar, then range-checks them all, entries past aic_nextn included. Each outcome was
    checked on the compiled build: a parse refusal names the unparsable entry, a range refusal the
    entry's index; the two accepted ones then meet the model's MTP refusal (ARGS-14)."""
    parse, rng = "invalid float literal", "must be finite and in [0, 1]"
    for rates, why in (("2.0,abc", parse), ("0.5,0.5,7", "[2] " + rng + ", got 7"), ("\u0660.\u0665", parse),
                       ("0.5\x1f", parse), ("1_0", parse), (".", parse),
                       ("1E-5,,", '"": cannot parse float from empty string'),
                       ("5.", "[0] " + rng + ", got 5"), ("+nan", "[0] " + rng + ", got NaN")):
        err = rejects({"aic_nextn": 1, "aic_nextn_accept_rates": rates}, "aic_nextn_accept_rates", "ARGS-10")
        assert why in str(err), (rates, str(err))
    for rates in (" 0.5 ,\u3000.5", "1e-5"):  # U+3000 is Unicode white space; 1e-5 is in range
        rejects({"aic_nextn": 1, "aic_nextn_accept_rates": rates}, "aic_nextn", "ARGS-14")


def test_mtp_rates_are_parsed_before_the_models_non_finite_refusal():
    """ARGS-19 step 6, ARGS-5: the build parses the rates in its normalisation; the non-finite
    refusal is the model's own, so it comes after (checked on the build: "abc" is refused)."""
    rejects({"speedup_ratio": float("nan"), "aic_nextn": 1, "aic_nextn_accept_rates": "abc"},
            "aic_nextn_accept_rates", "ARGS-10", dialect="kwargs")
    rejects({"sglang": {"schedule_conservativeness": float("inf")}, "aic_nextn": 1,
             "aic_nextn_accept_rates": "abc"}, "aic_nextn_accept_rates", "ARGS-10", dialect="kwargs")
    rejects({"speedup_ratio": float("nan"), "aic_nextn": 1, "aic_nextn_accept_rates": "0.5"},
            "speedup_ratio", "ARGS-5", dialect="kwargs")


def test_path_parameters_take_a_path_like_in_the_constructor_dialect():
    """ARGS-13: planner_profile_data (and the build's response_replay_trace_path) are PathBuf
    parameters, which PyO3 converts through os.fspath; the build then refuses the bad worker_type
    (checked). JSON has only strings, and bytes are refused in both dialects."""
    import pathlib

    for key in ("planner_profile_data", "response_replay_trace_path"):
        rejects({key: pathlib.Path("missing.npz"), "worker_type": "bad"}, "worker_type", "ARGS-3", dialect="kwargs")
        rejects({key: b"missing.npz"}, key, "ARGS-13", dialect="kwargs")
    rejects({"planner_profile_data": pathlib.Path("missing.npz")}, "planner_profile_data", "ARGS-14",
            dialect="kwargs")
    rejects({"aic_model_path": pathlib.Path("m")}, "aic_model_path", "ARGS-13", dialect="kwargs")


def test_normalized_g3_requires_g2():
    """protocols.rs test_normalized_g3_requires_g2; ARGS-15."""
    err = rejects({"num_g3_blocks": 10, "kv_bytes_per_token": 1024}, "num_g3_blocks", "ARGS-15")
    assert "requires num_g2_blocks" in str(err)


def test_normalized_g4_requires_g2():
    """protocols.rs test_normalized_g4_requires_g2; ARGS-15."""
    err = rejects({"enable_g4_storage": True, "kv_bytes_per_token": 1024}, "enable_g4_storage", "ARGS-15")
    assert "requires num_g2_blocks" in str(err)


def test_normalized_zero_disables_optional_offload_knobs():
    """protocols.rs test_normalized_zero_disables_optional_offload_knobs (+ zero G3 needs no G2); ARGS-15."""
    assert engine_args_from_json({"num_g2_blocks": 0, "num_g3_blocks": 0, "offload_batch_size": 0}) == EngineArgs()
    assert engine_args_from_json({"num_g3_blocks": 0}) == EngineArgs()


def test_args14_unsupported_inputs():
    """ARGS-14: accepted upstream but outside the model -> a clear rejection."""
    for obj, field in (
        ({"planner_profile_data": "/profiles/x.npz"}, "planner_profile_data"),
        ({"aic_backend": "vllm"}, "aic_backend"),
        ({"aic_nextn": 2}, "aic_nextn"),
        ({"num_g2_blocks": 10}, "num_g2_blocks"),
        ({"num_g2_blocks": 10, "num_g3_blocks": 10}, "num_g2_blocks"),
    ):
        err = rejects(obj, field, "ARGS-14")
        assert "not supported by the model" in str(err)
    # accepted and inert
    engine_args_from_json({"planner_profile_data": None, "aic_model_path": "m", "reasoning": None,
                           "zmq_replay_port": 5, "enable_local_indexer": True, "bootstrap_port": 1,
                           "response_replay_trace_path": "/tmp/x", "aic_mtp_seed": 7,
                           "bandwidth_g2_to_g1_gbps": 3.0, "offload_batch_size": 0})


# ---------------------------------------------------------------------------
# SGLang configuration (ARGS-12)
# ---------------------------------------------------------------------------


def test_args12_sglang_config_defaults():
    """ARGS-12: defaults 16384 / 8192 / 4096, ratios 0.7, 0.7*0.14, (init-min)/600, FIFO."""
    cfg = EngineArgs(engine_type="sglang", max_num_seqs=None).sglang_config()
    assert cfg.schedule_policy is SchedulePolicy.FIFO
    assert (cfg.max_prefill_tokens, cfg.chunked_prefill_size, cfg.clip_max_new_tokens) == (16384, 8192, 4096)
    assert cfg.max_running_requests is None
    assert cfg.init_new_token_ratio == 0.7 * 1.0
    assert cfg.min_new_token_ratio == (0.7 * 1.0) * 0.14
    assert cfg.new_token_ratio_decay_step == ((0.7 * 1.0) - (0.7 * 1.0) * 0.14) / 600.0
    assert cfg.block_size == 1 and cfg.total_kv_tokens == 16384


def test_args12_sglang_config_overrides():
    a = engine_args_from_json({"engine_type": "sglang", "num_gpu_blocks": 10, "max_num_seqs": 3, "sglang": {
        "schedule_policy": "lpm", "page_size": 4, "max_prefill_tokens": 100, "chunked_prefill_size": 64,
        "clip_max_new_tokens": 7, "schedule_conservativeness": 0.5}})
    cfg = a.sglang_config()
    assert cfg.schedule_policy is SchedulePolicy.LPM
    assert (cfg.max_prefill_tokens, cfg.chunked_prefill_size, cfg.clip_max_new_tokens) == (100, 64, 7)
    assert cfg.max_running_requests == 3 and cfg.block_size == 4 and cfg.total_kv_tokens == 40
    assert cfg.init_new_token_ratio == 0.7 * 0.5


@given(st.one_of(st.none(), st.text(max_size=8)))
def test_args12_schedule_policy_only_exact_lpm(policy):
    """ARGS-12: exactly 'lpm' is LPM; 'fifo', 'fcfs', None, typos and 'LPM' are FIFO."""
    expected = SchedulePolicy.LPM if policy == "lpm" else SchedulePolicy.FIFO
    assert resolve_schedule_policy(policy) is expected


def test_args12_sglang_subargs_not_range_checked():
    """ARGS-12: the reference accepts conservativeness outside [0,1] and zero token budgets."""
    engine_args_from_json({"engine_type": "sglang", "sglang": {"schedule_conservativeness": -1,
                                                               "max_prefill_tokens": 0, "clip_max_new_tokens": 0}})


# ---------------------------------------------------------------------------
# Derived values and replay checks (ARGS-16 .. ARGS-18)
# ---------------------------------------------------------------------------


def test_args16_17_derived_values():
    """ARGS-16, ARGS-17: derived values used by live channels and replay accounting."""
    assert EngineArgs(engine_type="trtllm").scheduling_policy() is SchedulingPolicy.TRTLLM_GUARANTEED_NO_EVICT
    assert EngineArgs(engine_type="sglang").scheduling_policy() is SchedulingPolicy.VLLM
    assert not EngineArgs(worker_type="decode").needs_kv_publisher()
    assert not EngineArgs(enable_prefix_caching=False).needs_kv_publisher()
    assert EngineArgs().effective_handoff_capacity() == 256
    assert EngineArgs(max_num_seqs=None, num_gpu_blocks=77).effective_handoff_capacity() == 77
    assert EngineArgs().aic_gpus_per_worker() == 1
    assert EngineArgs(aic_tp_size=2, aic_attention_dp_size=3).aic_gpus_per_worker() == 6
    assert EngineArgs(aic_attention_dp_size=0).aic_gpus_per_worker() == 0
    # a usize product, wrapping modulo 2^64 (the build reports decode_gpus_per_worker 0, resp. 2^63)
    assert EngineArgs(aic_tp_size=2**32, aic_attention_dp_size=2**32).aic_gpus_per_worker() == 0
    assert EngineArgs(aic_tp_size=2**63, aic_attention_dp_size=3).aic_gpus_per_worker() == 2**63
    assert EngineArgs(startup_time=0.0).startup_time_ms() is None
    assert EngineArgs(startup_time=5.0).startup_time_ms() == 5000.0


def test_args18_replay_checks():
    """The reasons are upstream's texts (mocker/replay/validate.rs:45-63, 115-167; the disaggregated
    block-size, worker-type and num_workers ones were also recorded from the compiled build, goldens
    input-refused-*), with the replay mode in front."""
    agg = EngineArgs()
    check_aggregated_replay_args(agg, 1)
    for args, workers, mode, reason in (
        (agg, 0, "trace replay", "trace replay requires num_workers >= 1"),
        (agg, 0, "concurrency replay", "concurrency replay requires num_workers >= 1"),
        (EngineArgs(dp_size=2), 1, "trace replay", "trace replay only supports data_parallel_size=1, got 2"),
        (EngineArgs(worker_type="prefill"), 1, "trace replay", "trace replay only supports aggregated workers, got Prefill"),
    ):
        with pytest.raises(InvalidInput) as info:
            check_aggregated_replay_args(args, workers, mode)
        assert info.value.rule == "ARGS-18" and info.value.reason == reason
    p, d = EngineArgs(worker_type="prefill", block_size=16), EngineArgs(worker_type="decode", block_size=16)
    check_disagg_replay_args(p, d, 1, 1)
    for bad, reason in (
        ((EngineArgs(engine_type="trtllm", worker_type="prefill"), d, 1, 1),
         "trace replay disaggregation does not support TRT-LLM"),
        ((EngineArgs(engine_type="sglang", worker_type="prefill", block_size=16), d, 1, 1),
         "trace replay disaggregation requires matching prefill/decode engine_type, got Sglang and Vllm"),
        ((p, d, 0, 1), "trace replay requires num_prefill_workers >= 1"),
        ((p, d, 1, 0), "trace replay requires num_decode_workers >= 1"),
        ((EngineArgs(block_size=16), d, 1, 1),
         "trace replay requires prefill_engine_args.worker_type=prefill, got Aggregated"),
        ((p, EngineArgs(worker_type="prefill", block_size=16), 1, 1),
         "trace replay requires decode_engine_args.worker_type=decode, got Prefill"),
        ((EngineArgs(worker_type="prefill", block_size=16, dp_size=2), d, 1, 1),
         "trace replay only supports prefill data_parallel_size=1, got 2"),
        ((p, EngineArgs(worker_type="decode", block_size=8), 1, 1),
         "trace replay requires matching prefill/decode block_size, got 16 and 8"),
    ):
        with pytest.raises(InvalidInput) as info:
            check_disagg_replay_args(*bad)
        assert info.value.rule == "ARGS-18" and info.value.reason == reason
    with pytest.raises(InvalidInput) as info:
        check_disagg_replay_args(p, EngineArgs(worker_type="aggregated", block_size=16), 1, 1, "concurrency replay")
    assert info.value.reason == "concurrency replay requires decode_engine_args.worker_type=decode, got Aggregated"


# ---------------------------------------------------------------------------
# Live comparison with the compiled reference (accept/reject + normalised values)
# ---------------------------------------------------------------------------

LIVE_CASES = [
    {}, {"engine_type": "sglang"}, {"engine_type": "trtllm"}, {"engine_type": "Vllm"},
    {"engine_type": "sglang", "sglang": {"page_size": 16}}, {"engine_type": "sglang", "sglang": {"page_size": 0}},
    {"engine_type": "sglang", "block_size": 8, "sglang": {"page_size": 4}},
    {"engine_type": "sglang", "block_size": 4, "sglang": {"chunked_prefill_size": 6}},
    {"engine_type": "sglang", "sglang": {"page_size": 8, "chunked_prefill_size": 12}},
    {"bogus": 1}, {"block_size": None}, {"num_gpu_blocks": None}, {"max_num_seqs": None},
    {"max_num_seqs": 0}, {"num_gpu_blocks": 0}, {"speedup_ratio": -1.0}, {"speedup_ratio": 0.0},
    {"speedup_ratio": 2}, {"block_size": 2.0}, {"block_size": -2}, {"enable_prefix_caching": 1},
    {"dp_size": 2}, {"dp_size": 0}, {"kv_transfer_bandwidth": -1.0}, {"kv_transfer_bandwidth": 0},
    {"kv_transfer_timing_mode": "Destination_Missing"}, {"kv_transfer_timing_mode": "x"},
    {"worker_type": "Prefill"}, {"is_prefill": True}, {"is_prefill": True, "is_decode": True},
    {"worker_type": None}, {"router_queue_policy": "WSPT"}, {"router_queue_policy": "lcfs"},
    {"num_g3_blocks": 10}, {"num_g3_blocks": 0}, {"enable_g4_storage": True}, {"aic_nextn": 0},
    {"aic_nextn_accept_rates": "0.5"}, {"aic_nextn": 2, "decode_speedup_ratio": 2.0},
    {"trtllm": {"capacity_scheduler_policy": "max_utilization"}}, {"handoff_session_timeout_ms": 0},
    {"gpu_memory_utilization": 1.5}, {"bootstrap_port": 70000}, {"has_perf_model": True},
    {"sglang": {"page_size": "4"}}, {"engine_type": "sglang", "sglang": {"schedule_conservativeness": -1}},
    {"reasoning": {"start_thinking_token_id": 1}}, {"startup_time": -1.0}, {"preemption_mode": "FIFO"},
]

_LIVE_CHILD = r"""
import json, sys
import dynamo._core as c
out = []
for case in json.loads(sys.stdin.read()):
    try:
        a = c.MockEngineArgs.from_json(json.dumps(case))
        out.append({"ok": True, "block_size": a.block_size, "num_gpu_blocks": a.num_gpu_blocks,
                    "max_num_seqs": a.max_num_seqs, "engine_type": a.engine_type, "worker_type": a.worker_type,
                    "kv_transfer_timing_mode": a.kv_transfer_timing_mode, "dp_size": a.dp_size})
    except Exception as e:
        out.append({"ok": False, "error": str(e)})
print(json.dumps(out))
"""


@pytest.mark.reference
@pytest.mark.skipif(importlib.util.find_spec("dynamo") is None, reason="compiled reference not installed")
def test_live_accept_reject_matches_reference():
    """ARGS-*: every LIVE_CASES entry is accepted/rejected like MockEngineArgs.from_json, with equal values.

    Cases outside the model (ARGS-14) are absent from LIVE_CASES on purpose.
    """
    proc = subprocess.run([sys.executable, "-c", _LIVE_CHILD], input=json.dumps(LIVE_CASES),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, expected in zip(LIVE_CASES, ref):
        try:
            got = engine_args_from_json(case)
        except InvalidInput as err:
            assert not expected["ok"], (case, str(err))
            continue
        assert expected["ok"], (case, expected["error"])
        assert got.block_size == expected["block_size"], case
        assert got.num_gpu_blocks == expected["num_gpu_blocks"], case
        assert got.max_num_seqs == expected["max_num_seqs"], case
        assert got.engine_type.value == expected["engine_type"], case
        assert got.worker_type.value == expected["worker_type"], case
        assert got.kv_transfer_timing_mode.value == expected["kv_transfer_timing_mode"], case
        assert got.dp_size == expected["dp_size"], case


@pytest.mark.parametrize(
    "obj",
    # ARGS-4: counts are usize, dp_size is u32 (values derived from the widths)
    [{"num_gpu_blocks": -1}, {"num_gpu_blocks": 2**64}, {"dp_size": 2**32}],
)
def test_args4_integer_widths(obj):
    with pytest.raises(InvalidInput):
        engine_args_from_json(obj)


# ---------------------------------------------------------------------------
# Check order: which of two bad arguments is refused (ARGS-11, ARGS-13, ARGS-3, ARGS-5)
# ---------------------------------------------------------------------------

#: each refused field recorded from the compiled build (1.3.0.post1): ``MockEngineArgs(**obj)``,
#: with nested mappings built first by their own constructors, or ``MockEngineArgs.from_json``
_ORDER_CASES = [
    # constructor: an unknown keyword first, then the signature's order, then the body's enums
    ({"block_size": "x", "engine_type": 1}, "kwargs", "engine_type"),
    ({"block_size": "x", "foo": 1}, "kwargs", "foo"),
    ({"max_num_seqs": -1, "block_size": "x"}, "kwargs", "block_size"),
    ({"block_size": None, "dp_size": "x"}, "kwargs", "block_size"),
    ({"kv_transfer_timing_mode": "bad", "preemption_mode": "bad"}, "kwargs", "preemption_mode"),
    # the nested constructors run before MockEngineArgs; a missing member before a bad type
    ({"engine_type": 1, "sglang": {"page_size": "x"}}, "kwargs", "sglang.page_size"),
    ({"reasoning": {"start_thinking_token_id": "x"}}, "kwargs", "reasoning.end_thinking_token_id"),
    # the body loads planner_profile_data before any range is validated
    ({"num_gpu_blocks": 0, "planner_profile_data": "missing.npz"}, "kwargs", "planner_profile_data"),
    # field ranges before struct rules; G3 before the TRT-LLM policy; NaN is the model's own, last
    ({"num_gpu_blocks": 0, "num_g3_blocks": 8}, "kwargs", "num_gpu_blocks"),
    ({"aic_nextn": 9, "decode_speedup_ratio": 2.0}, "kwargs", "aic_nextn"),
    ({"trtllm": {"capacity_scheduler_policy": "x"}, "num_g3_blocks": 8}, "kwargs", "num_g3_blocks"),
    ({"speedup_ratio": float("nan"), "engine_type": "bad"}, "kwargs", "engine_type"),
    # JSON: serde's types in document order, then the conversion's nulls and enums in its order
    ({"block_size": "x", "engine_type": 1}, "json", "block_size"),
    ({"engine_type": 1, "block_size": "x"}, "json", "engine_type"),
    ({"block_size": None, "engine_type": "bad"}, "json", "engine_type"),
    ({"worker_type": "bad", "block_size": None}, "json", "block_size"),
    ({"preemption_mode": "bad", "kv_transfer_timing_mode": "bad"}, "json", "kv_transfer_timing_mode"),
    ({"is_prefill": None, "dp_size": None}, "json", "dp_size"),
]


@pytest.mark.parametrize("obj, dialect, field", _ORDER_CASES)
def test_of_two_bad_arguments_the_builds_first_is_refused(obj, dialect, field):
    """ARGS-19 (ARGS-11, ARGS-13, ARGS-3, ARGS-5): the constructor dialect checks as PyO3 and the binding do
    (nested objects, unknown keywords, conversions in signature order, the body's enumerations,
    field ranges, struct rules); the JSON dialect as serde and its conversion do."""
    rejects(obj, field, dialect=dialect)


def test_signature_order_names_every_constructor_parameter_once():
    """ARGS-19: the signature order the constructor dialect follows lists every accepted keyword
    exactly once (the live suite compares it with the build's own signature)."""
    from model.engine_args import _COMMON_KEYS, _SIGNATURE_ORDER

    assert sorted(_SIGNATURE_ORDER) == sorted(_COMMON_KEYS) and len(set(_SIGNATURE_ORDER)) == len(_SIGNATURE_ORDER)


_PAIRS_CHILD = r"""
import json, re, sys
import dynamo._core as c
jobs = json.loads(sys.stdin.read())
def build(args, dialect):
    try:
        if dialect == "json":
            c.MockEngineArgs.from_json(json.dumps(args))
        else:  # nested mappings are the keyword arguments of their own constructors (ARGS-11)
            args = dict(args)
            for key, cls in (("reasoning", "ReasoningConfig"), ("sglang", "SglangArgs"), ("trtllm", "TrtllmArgs")):
                if isinstance(args.get(key), dict):
                    args[key] = getattr(c, cls)(**args[key])
            c.MockEngineArgs(**args)
        return None
    except Exception as exc:
        return str(exc)
out = [build(a, d) for a, d in jobs]
print(json.dumps({"signature": re.findall(r"(\w+)=", c.MockEngineArgs.__text_signature__), "refusals": out}))
"""


def _bad_values() -> list:
    """One to seven wrong values per engine argument: wrong types, out-of-range and non-finite
    numbers, nulls where not allowed, unknown enumeration members, and bad nested objects."""
    from model.engine_args import _COMMON_KEYS

    items = []
    for key, (kind, nullable) in _COMMON_KEYS.items():
        if kind in ("usize", "u32", "u16", "u64"):
            values = ["x", -1, 1.5, 2**64, 70000, 0, 9]
        elif kind == "f64":
            values = ["x", -1.0, float("nan"), 2.0]
        elif kind == "bool":
            values = ["x", 2, True]
        elif kind == "str":
            values = [1, "bad"]
        elif kind == "sglang":
            values = [1, {"page_size": "x", "schedule_policy": 1}, {"max_prefill_tokens": -1, "foo": 2}, ["lpm", "x"]]
        elif kind == "trtllm":
            values = [1, {"capacity_scheduler_policy": 1}, {"capacity_scheduler_policy": "x"}]
        else:  # reasoning
            values = [1, {"start_thinking_token_id": 1}, {"start_thinking_token_id": "x", "end_thinking_token_id": -1,
                                                           "thinking_ratio": 0.5}]
        items += [(key, v) for v in values + ([] if nullable else [None])]
    return items + [("foo_unknown", 1)]


@pytest.mark.reference
@pytest.mark.skipif(importlib.util.find_spec("dynamo") is None, reason="compiled reference not installed")
def test_live_two_bad_arguments_are_refused_like_the_build():
    """ARGS-19, FID-10: for a seeded sample of pairs of bad engine
    arguments, in both dialects and both orders, the model refuses the argument the compiled build
    refuses (compared as ``diff`` compares refusals), or the build accepts and the model refuses an
    input it does not model (ARGS-5, ARGS-14); and the constructor's signature order is the build's."""
    import itertools
    import random

    from mocker_spec.reference import Outcome, compare
    from model.engine_args import _SIGNATURE_ORDER

    pairs = [(k1, v1, k2, v2) for (k1, v1), (k2, v2) in itertools.permutations(_bad_values(), 2) if k1 != k2]
    sample = random.Random(20261205).sample(pairs, 10000)
    jobs = [({k1: v1, k2: v2}, dialect) for k1, v1, k2, v2 in sample for dialect in ("kwargs", "json")]
    proc = subprocess.run([sys.executable, "-c", _PAIRS_CHILD], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["signature"] == list(_SIGNATURE_ORDER)
    disagreements = []
    for (args, dialect), message in zip(jobs, result["refusals"]):
        try:
            engine_args_from_json(args, dialect=dialect)
            ours = None
        except InvalidInput as error:
            ours = error
        if message is None:
            if ours is not None and ours.rule not in ("ARGS-5", "ARGS-14"):
                disagreements.append((dialect, args, "the build accepts", str(ours)))
            continue
        if ours is None:
            disagreements.append((dialect, args, message, "the model accepts"))
            continue
        text = re.sub(r"^(?:Exception|TypeError|ValueError|OverflowError): ", "", message)
        mine = Outcome("error", ours.reason, refused="engine_args." + ours.field, refused_value=ours.value)
        if compare(mine, Outcome("error", text)) is not None:
            disagreements.append((dialect, args, text[:120], str(ours)))
    assert not disagreements, f"{len(disagreements)} of {len(jobs)}, first: {disagreements[:3]}"


def test_pool_size_is_a_wrapping_usize_product():
    """ARGS-12, SG-1: ``num_gpu_blocks * block_size`` wraps modulo 2^64 as upstream's usize
    product does in release builds: (2^62 + 16) * 4 = 2^64 + 64, a 64-token pool (the compiled
    build runs such a worker exactly like one with 16 blocks: golden args-sglang-pool-wraps)."""
    wrapped = engine_args_from_json({"engine_type": "sglang", "num_gpu_blocks": 2**62 + 16, "block_size": 4})
    assert wrapped.total_kv_tokens == 64
    assert wrapped.sglang_config().total_kv_tokens == 64
    assert engine_args_from_json({"num_gpu_blocks": 2**62, "block_size": 4, "engine_type": "sglang"}).total_kv_tokens == 0
    assert engine_args_from_json({"num_gpu_blocks": 100, "block_size": 16}).total_kv_tokens == 1600


def test_json_dialect_floats_are_valued_as_serde_json_reads_them():
    """ARGS-13: the CLI's JSON reaches from_json as Python's repr, which serde_json's default parse
    reads as significand 28874685634979014 (not exact in binary64: 28874685634979016) / 1e16,
    one ulp above Python's value; the constructor takes the Python float as it is."""
    assert engine_args_from_json({"speedup_ratio": 2.8874685634979014}).speedup_ratio == 2.887468563497902
    assert engine_args_from_json({"speedup_ratio": 2.8874685634979014}, dialect="kwargs").speedup_ratio \
        == 2.8874685634979014
    assert engine_args_from_json({"speedup_ratio": 2.5}).speedup_ratio == 2.5


#: ARGS-20: single refusals in the constructor dialect and the compiled build's text for each,
#: recorded from it (a live test repeats them)
UPSTREAM_TEXTS = [
    ({"num_gpu_blocks": 1.5}, "argument 'num_gpu_blocks': 'float' object cannot be interpreted as an integer"),
    ({"num_gpu_blocks": -1}, "can't convert negative int to unsigned"),
    ({"num_gpu_blocks": 2**64}, "int too big to convert"),
    ({"dp_size": -1}, "out of range integral type conversion attempted"),
    ({"dp_size": 2**63}, "Python int too large to convert to C long"),
    ({"zmq_kv_events_port": 70000}, "out of range integral type conversion attempted"),
    ({"speedup_ratio": "x"}, "argument 'speedup_ratio': must be real number, not str"),
    ({"speedup_ratio": None}, "argument 'speedup_ratio': must be real number, not NoneType"),
    ({"speedup_ratio": 10**400}, "int too large to convert to float"),
    ({"enable_prefix_caching": 1}, "argument 'enable_prefix_caching': 'int' object cannot be converted to 'PyBool'"),
    ({"engine_type": None}, "argument 'engine_type': 'NoneType' object cannot be converted to 'PyString'"),
    ({"planner_profile_data": 5}, "argument 'planner_profile_data': expected str, bytes or os.PathLike object, not int"),
    ({"planner_profile_data": b"x"}, "argument 'planner_profile_data': 'bytes' object cannot be converted to 'PyString'"),
    ({"sglang": 5}, "argument 'sglang': 'int' object cannot be converted to 'SglangArgs'"),
    ({"sglang": {"page_size": "x"}}, "argument 'page_size': 'str' object cannot be interpreted as an integer"),
    ({"sglang": {"zz": 1}}, "SglangArgs.__new__() got an unexpected keyword argument 'zz'"),
    ({"no_such": 1}, "MockEngineArgs.__new__() got an unexpected keyword argument 'no_such'"),
    ({"reasoning": {"start_thinking_token_id": 1}},
     "ReasoningConfig.__new__() missing 2 required positional arguments: 'end_thinking_token_id' and 'thinking_ratio'"),
    ({"reasoning": {}}, "ReasoningConfig.__new__() missing 3 required positional arguments: "
                        "'start_thinking_token_id', 'end_thinking_token_id', and 'thinking_ratio'"),
    ({"engine_type": "x"}, "engine_type must be one of 'vllm', 'sglang', or 'trtllm', got 'x'"),
    ({"preemption_mode": "x"}, "preemption_mode must be either 'lifo' or 'fifo', got 'x'"),
    ({"router_queue_policy": 'a"\n'},
     "invalid router_queue_policy \"a\\\"\\n\": unknown queue policy: \"a\\\"\\n\", expected 'fcfs', 'lcfs', or 'wspt'"),
    ({"num_g3_blocks": 5}, "Failed to normalize MockEngineArgs: Failed to validate MockEngineArgs: __all__: "
                           "num_g3_blocks requires num_g2_blocks because mocker stages G3 through G2"),
    ({"engine_type": "sglang", "block_size": 16, "sglang": {"page_size": 32}},
     "Failed to normalize MockEngineArgs: Failed to validate MockEngineArgs: __all__: engine_type=sglang requires "
     "block_size and sglang.page_size to match when both are set, got block_size=16 and sglang.page_size=32"),
    ({"aic_nextn": 1, "aic_nextn_accept_rates": "1,,2"},
     'Failed to normalize MockEngineArgs: invalid aic_nextn_accept_rates value "": cannot parse float from empty string'),
]


@pytest.mark.parametrize("kwargs,text", UPSTREAM_TEXTS)
def test_refusals_carry_the_builds_text(kwargs, text):
    """ARGS-20: the refusal's reason is the compiled build's text (UPSTREAM_TEXTS)."""
    with pytest.raises(InvalidInput) as info:
        engine_args_from_json(kwargs, dialect="kwargs")
    assert info.value.reason == text


def test_json_dialect_integers_for_floats_are_read_once_from_their_text():
    """ARGS-13: an integer given for an f64 reaches serde as its own digits: 4567306425310660689501048
    keeps the significand 4567306425310660689 (the next digit would pass u64) times 10^6, here
    the correctly rounded 4.5673064253106604e24. Reading that float's shortest repr
    (4.5673064253106604e+24, a 17-digit significand above 2^53) once more would land 1 ulp higher."""
    v = 4567306425310660689501048
    got = engine_args_from_json({"speedup_ratio": v}).speedup_ratio
    assert got == float(4567306425310660689) * 1e6 == float(v)
    assert got != 4.567306425310661e24
