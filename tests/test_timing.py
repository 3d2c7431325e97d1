"""Tests for model.timing (spec/timing.md, rules TIME-1 .. TIME-16)."""

from __future__ import annotations

import json
import math
import os
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.engine_args import EngineArgs, KvTransferTimingMode, WorkerType, engine_args_from_json
from model.errors import InternalInvariantBroken
from model.timing import (
    U64_MAX,
    HandoffTransferTiming,
    as_secs_f64,
    duration_from_ms,
    duration_from_secs,
    f64_as_u64,
    floor_mean,
    pass_times,
    polynomial_decode_ms,
    polynomial_prefill_ms,
    prefill_duration_ns,
    prefill_handoff_delay_ms,
    prefill_transfer_timing,
    scale_decode_ns,
    scale_prefill_ns,
    sglang_decode_duration_ns,
    token_stamp_ms,
    transfer_action_delay_ms,
    transfer_complete_ms,
    vllm_decode_duration_ns,
)

GOLDENS = os.path.join(os.path.dirname(__file__), "goldens", "timing_goldens.json")


# ---------------------------------------------------------------------------
# Independent exact-rational reference for TIME-1 (written differently from the model)
# ---------------------------------------------------------------------------


def _ref_round_half_even_ns(x: float) -> int:
    exact = Fraction(x) * 1_000_000_000
    floor = exact.numerator // exact.denominator
    frac = exact - floor
    if frac > Fraction(1, 2):
        return floor + 1
    if frac < Fraction(1, 2):
        return floor
    return floor if floor % 2 == 0 else floor + 1


finite_secs = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@given(finite_secs)
@settings(max_examples=2000)
def test_time1_matches_exact_rational_round_half_even(x):
    """TIME-1: from_secs_f64 is round-half-even of the exact binary value."""
    assert duration_from_secs(x) == _ref_round_half_even_ns(x)


@given(st.integers(min_value=0, max_value=2**40))
def test_time1_exact_ties_go_to_even(i):
    """TIME-1: x = (2i+1)/1024 is exactly (2i+1)*976562.5 ns, a tie; the even neighbour wins."""
    x = (2 * i + 1) / 1024
    scaled2 = (2 * i + 1) * 1_953_125  # twice the exact ns value
    lo = scaled2 // 2
    expected = lo if lo % 2 == 0 else lo + 1
    assert duration_from_secs(x) == expected


def test_time1_rejects_where_rust_panics():
    """TIME-1: negative, NaN and infinite inputs are upstream panics."""
    for bad in (-1e-9, float("nan"), float("inf"), 2.0**64):
        with pytest.raises(InternalInvariantBroken):
            duration_from_secs(bad)


@given(st.integers(min_value=0, max_value=10**15))
def test_time2_as_secs_round_trip_is_idempotent(ns):
    """TIME-2: re-quantising as_secs_f64(d) gives d back (up to ~11.6 days)."""
    assert duration_from_secs(as_secs_f64(ns)) == ns


def test_time2_as_secs_is_secs_plus_nanos_over_1e9():
    """TIME-2: two-part conversion, e.g. 1.5 s = 1.0 + 0.5."""
    assert as_secs_f64(1_500_000_000) == 1.0 + 500_000_000 / 1e9
    assert as_secs_f64(18_023_974) == 0.0 + 18_023_974 / 1e9


# ---------------------------------------------------------------------------
# Ports of upstream unit tests
# ---------------------------------------------------------------------------


def test_fully_cached_prompt_skips_prefill():
    """perf_model.rs fully_cached_prompt_skips_prefill; TIME-4."""
    assert polynomial_prefill_ms(1, 128, 128) == 0.0


def test_prefill_handoff_delay_only_applies_to_completed_prefill():
    """utils.rs test_prefill_handoff_delay_only_applies_to_completed_prefill; TIME-16."""
    delay = prefill_handoff_delay_ms(WorkerType.PREFILL, True, 128, 1.0, 1_000_000)
    assert delay is not None and abs(delay - 128.0) < 1e-9
    assert prefill_handoff_delay_ms(WorkerType.PREFILL, False, 128, 1.0, 1_000_000) is None
    assert prefill_handoff_delay_ms(WorkerType.DECODE, True, 128, 1.0, 1_000_000) is None


def test_prefill_completion_emits_handoff_delay():
    """vllm/tests.rs and sglang/tests.rs test_prefill_completion_emits_handoff_delay; TIME-16.

    8-token prompt, 1 GB/s, 1e6 bytes/token: 8e6 B / 1e9 B/s = 8 ms.
    """
    for engine in ("vllm", "sglang"):
        args = engine_args_from_json(
            {
                "engine_type": engine,
                "block_size": 4,
                "worker_type": "prefill",
                "kv_transfer_bandwidth": 1.0,
                "kv_bytes_per_token": 1_000_000,
                "speedup_ratio": 0.0,
            }
        )
        assert prefill_handoff_delay_ms(args.worker_type, True, 8, args.kv_transfer_bandwidth,
                                        args.kv_bytes_per_token) == 8.0


def test_timing_mode_selects_full_or_destination_missing_footprint():
    """handoff_tests.rs timing_mode_selects_full_or_destination_missing_footprint; TIME-12, TIME-13."""
    for mode, expected in ((KvTransferTimingMode.FULL_PROMPT, 8.0), (KvTransferTimingMode.DESTINATION_MISSING, 4.0)):
        timing = HandoffTransferTiming(mode=mode, full_prompt_tokens=8, kv_bytes_per_token=1_000_000,
                                       bandwidth_gb_s=1.0)
        assert timing.invalid_reason() is None
        assert transfer_action_delay_ms(timing, 4) == expected


def test_full_destination_hit_keeps_zero_delay_transfer_transition():
    """handoff_tests.rs full_destination_hit_keeps_zero_delay_transfer_transition; TIME-13, TIME-15."""
    timing = HandoffTransferTiming(KvTransferTimingMode.DESTINATION_MISSING, 8, 1_000_000, 1.0)
    delay = transfer_action_delay_ms(timing, 0)
    assert delay == 0.0
    assert transfer_complete_ms(5.0, delay) is None


def test_invalid_transfer_timing_is_rejected_before_scheduling():
    """handoff_tests.rs invalid_transfer_timing_is_rejected_before_scheduling; TIME-14 (0 is invalid too)."""
    # the numbers as Rust's {} prints them (the 0 case recorded from the compiled build: golden
    # disagg-zero-transfer-bandwidth)
    for bw, shown in ((-1.0, "-1"), (float("nan"), "NaN"), (float("inf"), "inf"), (0.0, "0")):
        timing = HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 1, 1_000_000, bw)
        assert timing.invalid_reason() == f"invalid handoff transfer bandwidth {shown}"
    assert HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 1, None, None).invalid_reason() is None


def test_time12_delay_none_without_inputs_or_bandwidth():
    """TIME-12: None when bytes or bandwidth is missing, or bandwidth <= 0."""
    assert HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 10, None, 1.0).delay_ms(0) is None
    assert HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 10, 5, None).delay_ms(0) is None
    assert HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 10, 5, 0.0).delay_ms(0) is None
    # float order: ((tokens * bytes) / (bw * 1e9)) * 1000
    t = HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 64, 100_000, 3.0)
    assert t.delay_ms(0) == 64.0 * 100000.0 / (3.0 * 1e9) * 1000.0


def test_decode_speedup_ratio_scales_sglang_decode_time():
    """sglang/tests.rs test_decode_speedup_ratio_scales_sglang_decode_time; TIME-7, TIME-11.

    One running 4-token request on a 64-page pool; decode_speedup 4 vs 1 (speedup 2 both).
    """
    base = engine_args_from_json({"engine_type": "sglang", "block_size": 4, "speedup_ratio": 2.0,
                                  "decode_speedup_ratio": 1.0, "num_gpu_blocks": 64})
    fast = engine_args_from_json({"engine_type": "sglang", "block_size": 4, "speedup_ratio": 2.0,
                                  "decode_speedup_ratio": 4.0, "num_gpu_blocks": 64})
    base_end = pass_times(0.0, 0, sglang_decode_duration_ns(1, 4, base)).end_ms
    fast_end = pass_times(0.0, 0, sglang_decode_duration_ns(1, 4, fast)).end_ms
    assert base_end > fast_end
    assert abs(base_end / fast_end - 4.0) < 1e-3


# ---------------------------------------------------------------------------
# Rules by hand
# ---------------------------------------------------------------------------


def test_time4_worked_example_defaults():
    """TIME-4/8/9/10: defaults, P=100 at t=0 (vllm-core notes worked example; also a reference golden).

    prefill_ms = 4.209989e-07*100^2 + 1.518344e-02*100 + 16.50142 = 18.023973989 -> 18_023_974 ns.
    """
    args = EngineArgs()
    assert polynomial_prefill_ms(1, 100, 0) == 4.209989e-07 * (100.0 * 100.0) + 1.518344e-02 * 100.0 + 1.650142e01
    p = prefill_duration_ns(1, 100, 0, args)
    assert p == 18_023_974
    d = vllm_decode_duration_ns(1, 100, 2, args)
    times = pass_times(0.0, p, d)
    assert times.decode_start_ms == 18.023974000000003
    assert times.end_ms == 23.770567000000003


def test_time3_floor_means_lose_tokens():
    """TIME-3: the polynomial sees n*(floor(isl/n) - floor(prefix/n)), not the exact total."""
    args = EngineArgs(speedup_ratio=0.0)
    # totals 101 / 0 over 2 requests: mean 50 -> t = 100, not 101
    assert prefill_duration_ns(2, 101, 0, args) == duration_from_ms(polynomial_prefill_ms(2, 50, 0))
    assert floor_mean(7, 0) == 0
    # means 5 and 5 -> nothing new although totals differ by 1
    assert prefill_duration_ns(2, 11, 10, args) == 0


def test_time5_decode_floor_and_empty_batch():
    """TIME-5: empty batch costs 0; otherwise >= 1 ms; u uses the two products."""
    assert polynomial_decode_ms(0, 10, 10, 100) == 0.0
    assert polynomial_decode_ms(1, 0, 0, 100) == 5.74
    assert polynomial_decode_ms(1, 5, 0, 0) == -25.74 * 1.0 + 54.01 * 1.0 + 5.74
    u = 128.0 / 1048576.0
    assert polynomial_decode_ms(1, 128, 100, 1048576) == -25.74 * (u * u) + 54.01 * u + 5.74


def test_time8_worker_types():
    """TIME-8/10/11: Decode workers have no prefill; vLLM Prefill workers no decode; SGLang still decodes."""
    dec = EngineArgs(worker_type="decode")
    pre = EngineArgs(worker_type="prefill")
    sg_pre = EngineArgs(engine_type="sglang", worker_type="prefill")
    assert prefill_duration_ns(1, 100, 0, dec) == 0
    assert prefill_duration_ns(1, 100, 0, pre) > 0
    assert vllm_decode_duration_ns(1, 100, 2, pre) == 0
    assert sglang_decode_duration_ns(1, 100, sg_pre) > 0
    times = pass_times(3.0, 1_000_000, 0)
    assert token_stamp_ms(times, pre) == times.decode_start_ms == 4.0


def test_time7_decode_speedup_zero_leaves_decode_unscaled_but_prefill_scaled():
    """TIME-6/7: speedup 2, decode_speedup 0 -> effective decode ratio 0 (unscaled); prefill halved."""
    args = EngineArgs(speedup_ratio=2.0, decode_speedup_ratio=0.0)
    d_unscaled = duration_from_ms(polynomial_decode_ms(1, 64, 64, 64 * 16384))
    assert vllm_decode_duration_ns(1, 64, 1, args) == d_unscaled
    p0 = duration_from_ms(polynomial_prefill_ms(1, 100, 0))
    assert prefill_duration_ns(1, 100, 0, args) == duration_from_secs(as_secs_f64(p0) / 2.0)


ms_values = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(ms_values, st.floats(max_value=0.0, allow_nan=False, allow_infinity=False))
def test_time6_speedup_nonpositive_is_unscaled(ms, ratio):
    """TIME-6: a ratio <= 0 means unscaled, which equals ratio 1.0 (re-rounding is idempotent)."""
    assert scale_prefill_ns(ms, ratio) == duration_from_ms(ms) == scale_prefill_ns(ms, 1.0)


@given(ms_values, st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
       st.floats(min_value=0.0, max_value=100.0, allow_nan=False))
def test_time7_effective_ratio_nonpositive_is_unscaled(ms, a, b):
    """TIME-7: speedup*decode_speedup <= 0 -> unscaled."""
    assert scale_decode_ns(ms, a, b) == duration_from_ms(ms) == scale_decode_ns(ms, b, a)


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**6),
       st.floats(min_value=0.01, max_value=100.0))
def test_time4_prefill_monotone_in_new_tokens(t1, t2, ratio):
    """TIME-4/6: prefill time is non-decreasing in new tokens (every float step is monotone)."""
    lo, hi = sorted((t1, t2))
    assert polynomial_prefill_ms(1, lo, 0) <= polynomial_prefill_ms(1, hi, 0)
    assert scale_prefill_ns(polynomial_prefill_ms(1, lo, 0), ratio) <= scale_prefill_ns(
        polynomial_prefill_ms(1, hi, 0), ratio)


@given(st.integers(min_value=1, max_value=4096), st.integers(min_value=0, max_value=10**6),
       st.integers(min_value=0, max_value=10**6))
def test_time3_prefill_uses_floor_means(n, total_isl, total_prefix):
    """TIME-3/8: the engine-level prefill equals the polynomial on floored means."""
    args = EngineArgs(speedup_ratio=0.0)
    expected = duration_from_ms(polynomial_prefill_ms(n, total_isl // n, total_prefix // n))
    assert prefill_duration_ns(n, total_isl, total_prefix, args) == expected


@given(st.integers(min_value=1, max_value=2**20), st.integers(min_value=0, max_value=2**20),
       st.integers(min_value=0, max_value=2**20))
def test_time5_decode_bounded(total, a1, a2):
    """TIME-5: on [0, 1] utilisation the polynomial lies in [5.74, 34.01] (vertex at u ~ 1.05 > 1)."""
    for active in (min(a1, total), min(a2, total)):
        ms = polynomial_decode_ms(1, active, 0, total)
        assert 5.74 <= ms <= 34.01 + 1e-9


@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=64))
def test_time11_sglang_utilisation_capped_at_pool(total_context, pool_pages):
    """TIME-11: active tokens are min(sum seq lens, pool): a context beyond the pool costs like a full pool."""
    args = EngineArgs(engine_type="sglang", num_gpu_blocks=pool_pages)
    full = sglang_decode_duration_ns(1, pool_pages, args)
    got = sglang_decode_duration_ns(1, total_context, args)
    if total_context >= pool_pages:
        assert got == full


# ---------------------------------------------------------------------------
# Reference goldens (produced by scripts/record_timing_goldens.py)
# ---------------------------------------------------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _decode_chain(args: EngineArgs, prompt: int, outputs: int, start_ms: float, first_prefill: bool):
    """Token times of one isolated request (TIME-8..11). Returns (token_times, end_ms)."""
    now = start_ms
    tokens = []
    for k in range(1, outputs + 1):
        length = prompt + k - 1
        pre = prefill_duration_ns(1, prompt, 0, args) if (k == 1 and first_prefill) else 0
        if args.engine_type.value == "sglang":
            dec = sglang_decode_duration_ns(1, length, args)
        else:
            dec = vllm_decode_duration_ns(1, length, _ceil_div(length, args.block_size), args)
        times = pass_times(now, pre, dec)
        stamp = times.end_ms if args.engine_type.value == "sglang" else token_stamp_ms(times, args)
        tokens.append(stamp)
        now = times.end_ms
    return tokens, now


def _golden_scenarios():
    with open(GOLDENS) as fh:
        return json.load(fh)["scenarios"]


@pytest.mark.parametrize("scenario", _golden_scenarios(), ids=lambda s: s["name"])
def test_reference_goldens(scenario):
    """TIME-1..16 against the compiled reference: isolated requests, exact float equality.

    Values in tests/goldens/timing_goldens.json come from scripts/record_timing_goldens.py,
    which replays each scenario with ai-dynamo-runtime 1.3.0.post1.
    """
    settings_ = scenario["settings"]
    rows = scenario["report"]
    assert len(rows) == len(scenario["requests"])
    for i, ((prompt, outputs), row) in enumerate(zip(scenario["requests"], rows)):
        arrival = i * scenario["gap_ms"]
        assert row["arrival_time_ms"] == arrival
        assert row["terminal_status"] == "completed"
        if scenario["mode"] == "agg":
            args = engine_args_from_json(settings_["engine_args"])
            tokens, _ = _decode_chain(args, prompt, outputs, arrival, first_prefill=True)
        else:
            pargs = engine_args_from_json(settings_["prefill_engine_args"])
            dargs = engine_args_from_json(settings_["decode_engine_args"])
            # Prefill pass on the prefill worker: the request's only pass there.
            if pargs.engine_type.value == "sglang":
                held = pass_times(arrival, prefill_duration_ns(1, prompt, 0, pargs),
                                  sglang_decode_duration_ns(1, prompt, pargs)).end_ms
            else:
                held = pass_times(arrival, prefill_duration_ns(1, prompt, 0, pargs),
                                  vllm_decode_duration_ns(1, prompt, _ceil_div(prompt, pargs.block_size),
                                                          pargs)).end_ms
            assert row["source_held_ms"] == held
            # Transfer: timing from the prefill args; an empty destination misses every prompt page.
            timing = prefill_transfer_timing(prompt, pargs)
            delay = transfer_action_delay_ms(timing, _ceil_div(prompt, pargs.block_size) * pargs.block_size)
            done = transfer_complete_ms(held, delay)
            activated = held if done is None else done
            assert row["destination_activated_ms"] == activated
            assert row["decode_admit_ms"] == activated
            tokens, _ = _decode_chain(dargs, prompt, outputs, activated, first_prefill=False)
        assert row["first_token_ms"] == tokens[0], (i, row, tokens)
        assert row["last_token_ms"] == tokens[-1], (i, row, tokens)
        if outputs >= 2:
            assert row["ttst_ms"] == max(tokens[1] - tokens[0], 0.0)
        assert not math.isnan(tokens[-1])


def test_time9_two_float_additions_in_order():
    """TIME-9, derived by hand: 0.1 + 0.2 then + 0.3 as two separate additions differs from
    0.1 + (0.2 + 0.3); pass_times must take the left-to-right path."""
    times = pass_times(0.1, 200_000, 300_000)  # 0.2 ms prefill, 0.3 ms decode
    assert times.decode_start_ms == 0.1 + 0.2
    assert times.end_ms == (0.1 + 0.2) + 0.3
    assert times.end_ms != 0.1 + (0.2 + 0.3)
    assert pass_times(5.0, 0, 0) == type(times)(5.0, 5.0)


def test_time10_vllm_decode_zero_when_idle_or_prefill_worker():
    """TIME-10: no ready request, or a Prefill worker, charges no decode; otherwise TIME-5 applies
    (at least 1 ms before scaling, derived from the max(1, ...) floor)."""
    agg = EngineArgs(num_gpu_blocks=100, block_size=16)
    assert vllm_decode_duration_ns(0, 0, 0, agg) == 0
    prefill = EngineArgs(num_gpu_blocks=100, block_size=16, worker_type="prefill")
    assert vllm_decode_duration_ns(3, 300, 10, prefill) == 0
    assert vllm_decode_duration_ns(1, 10, 1, agg) >= 1_000_000


def test_f64_as_u64_saturates_like_rust():
    # Rust's `f64 as u64` (FPM-2's queued and decode sums, SGLang's chunk budget): truncation
    # toward zero; NaN, negatives and zero give 0; 2^64 (the nearest f64 to u64::MAX) and
    # anything above give u64::MAX.  Values by hand.
    assert U64_MAX == 18_446_744_073_709_551_615
    assert [f64_as_u64(x) for x in (float("nan"), -3.7, -0.0, 0.0, 0.999, 7.9, 1e6)] == [0, 0, 0, 0, 0, 7, 1_000_000]
    assert f64_as_u64(2.0**64) == U64_MAX and f64_as_u64(float("inf")) == U64_MAX
    assert f64_as_u64(2.0**63) == 2**63  # exact below the bound
    assert f64_as_u64(2.0**64 - 2048.0) == 2**64 - 2048  # the largest f64 below 2^64 is kept exactly


@pytest.mark.parametrize("secs, text", [
    (-1.0, "value is negative"), (float("-inf"), "value is negative"),
    (float("nan"), "value is either too big or NaN"), (float("inf"), "value is either too big or NaN"),
    (1.7e298, "value is either too big or NaN"),
])
def test_time1_duration_panics_carry_rusts_text(secs, text):
    """TIME-1: where Duration::from_secs_f64 panics the model stops with Rust's text (recorded
    from the compiled build for the overflow a speed-up of 1e-300 causes: "cannot convert float
    seconds to Duration: value is either too big or NaN"); -0.0 is a zero duration."""
    from model.errors import UpstreamPanic
    from model.timing import duration_from_secs

    with pytest.raises(UpstreamPanic) as info:
        duration_from_secs(secs)
    assert info.value.message == "cannot convert float seconds to Duration: " + text
    assert duration_from_secs(-0.0) == 0
