"""Tests of the workload rules (spec/replay.md WL-1..WL-20).

Named ports of the upstream loadgen / replay tests at a822423412a0 keep their
upstream names (``lib/mocker/src/loadgen/tests.rs``,
``lib/mocker/src/replay/entrypoints.rs``, ``lib/mocker/src/replay/mod.rs``).
Not ported: the workload-driver tests (the driver belongs to the replay
drivers), the agentic / applied-compute format tests and the trace utilities
that offline replay never calls (partition, hash-prefix expansion, span
rescaling); see WL-19.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from model.errors import InvalidInput
from model.hashing import block_hashes
from model.workload import (
    DEFAULT_TRACE_BLOCK_SIZE,
    SYNTHETIC_PREFIX_TAG,
    FlatWorkload,
    MooncakeRow,
    ReplayRequest,
    SessionTrace,
    SessionWorkload,
    Trace,
    TurnTrace,
    cumulative_session_tokens,
    is_single_turn,
    load_concurrency_trace_workload,
    load_trace_workload,
    normalize_session_starts,
    normalize_trace_requests,
    parse_mooncake_line,
    parse_mooncake_row,
    speed_up_timing,
    synthesize_tokens,
    synthetic_replay_workload,
    synthetic_requests,
    synthetic_token_id,
    synthetic_workload,
    to_single_turn_requests,
    trace_from_mooncake_lines,
    validate_for_trace_mode,
    workload_from_trace,
)
from mocker_spec.formats import load_trace_file, read_trace, read_trace_lines
from test_report import OK_CASES, RefCase


def lines(*rows: object) -> list[str]:
    return [r if isinstance(r, str) else json.dumps(r) for r in rows]


def rows_of(*rows: object):
    return [(i, r) for i, r in enumerate(rows, start=1)]


# ---------------------------------------------------------------------------
# ports: lib/mocker/src/loadgen/tests.rs
# ---------------------------------------------------------------------------


def test_from_mooncake_single_turn_preserves_fields() -> None:
    trace = trace_from_mooncake_lines(
        lines({"timestamp": 123.0, "input_length": 8, "output_length": 4, "hash_ids": [7, 8],
               "priority": -3, "strict_priority": 7}), 4)
    assert len(trace.sessions) == 1
    s = trace.sessions[0]
    assert s.first_arrival_timestamp_ms == 123.0
    assert len(s.turns) == 1
    t = s.turns[0]
    assert (t.input_length, t.max_output_tokens, t.hash_ids) == (8, 4, (7, 8))
    assert (t.priority, t.strict_priority) == (-3, 7)


def test_from_mooncake_multi_turn_uses_session_id_and_delay() -> None:
    trace = trace_from_mooncake_lines(lines(
        {"session_id": "a", "timestamp": 10.0, "input_length": 4, "output_length": 1, "hash_ids": [1]},
        {"session_id": "a", "delay": 25.0, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]},
        {"session_id": "b", "timestamp": 20.0, "input_length": 4, "output_length": 1, "hash_ids": [3]},
    ), 4)
    assert [s.session_id for s in trace.sessions] == ["a", "b"]
    assert len(trace.sessions[0].turns) == 2
    assert trace.sessions[0].turns[1].delay_after_previous_ms == 25.0


def test_from_mooncake_defaults_missing_input_length_from_hash_capacity() -> None:
    trace = trace_from_mooncake_lines(lines({"timestamp": 7.0, "output_length": 3, "hash_ids": [5, 6]}), 4)
    assert trace.sessions[0].turns[0].input_length == 8


def test_turn_to_direct_request_repeats_hash_ids_by_block_size() -> None:
    turn = TurnTrace(input_length=6, max_output_tokens=3, hash_ids=(1, 2), priority=-2, strict_priority=8)
    assert synthesize_tokens(turn, 4) == (1, 1, 1, 1, 2, 2)
    (req,) = to_single_turn_requests(Trace(4, (SessionTrace("s", 5.0, (turn,)),)))
    assert (req.arrival_timestamp_ms, req.priority, req.strict_priority) == (5.0, -2, 8)


def test_turn_replay_hashes_match_full_blocks_only() -> None:
    """Engine block hashes come from the synthesized tokens; a partial block has none."""
    turn = TurnTrace(input_length=6, max_output_tokens=3, hash_ids=(1, 2))
    tokens = synthesize_tokens(turn, 4)
    assert len(block_hashes(tokens, 4)) == 1


def test_turn_replay_hashes_support_distinct_trace_and_engine_block_sizes() -> None:
    turn = TurnTrace(input_length=6, max_output_tokens=3, hash_ids=(1, 2))
    tokens = synthesize_tokens(turn, 4)
    hs = block_hashes(tokens, 2)
    assert len(hs) == 3
    assert hs[0] == hs[1] != hs[2]  # (1,1) (1,1) (2,2)


def test_synthetic_prefix_groups_share_prefixes_within_group() -> None:
    trace = synthetic_workload(4, 16, 2, 6, arrival_interval_ms=0.0, shared_prefix_ratio=0.5, num_prefix_groups=2)
    prefixes = [s.turns[0].hash_ids[:2] for s in trace.sessions]
    assert any(a == b for a, b in zip(prefixes, prefixes[1:]))


# ---------------------------------------------------------------------------
# ports: lib/mocker/src/replay/entrypoints.rs and replay/mod.rs
# ---------------------------------------------------------------------------


def _one_turn(sid: str, ts: float | None, h: int) -> SessionTrace:
    return SessionTrace(sid, ts, (TurnTrace(input_length=4, max_output_tokens=1, hash_ids=(h,)),))


def test_single_turn_mooncake_trace_uses_request_path() -> None:
    w = workload_from_trace(Trace(4, (_one_turn("request_1", 0.0, 1), _one_turn("request_2", 0.0, 2))))
    assert isinstance(w, FlatWorkload)
    assert [r.arrival_timestamp_ms for r in w.requests] == [0.0, 0.0]


def test_single_turn_mooncake_trace_without_timestamps_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="first_arrival_timestamp_ms"):
        workload_from_trace(Trace(4, (_one_turn("request_1", None, 1),)))


def test_multi_turn_mooncake_trace_stays_on_workload_path() -> None:
    s = SessionTrace("session-a", 0.0, (
        TurnTrace(input_length=4, max_output_tokens=1, hash_ids=(1,)),
        TurnTrace(input_length=4, max_output_tokens=1, hash_ids=(2,), delay_after_previous_ms=10.0),
    ))
    w = workload_from_trace(Trace(4, (s,)))
    assert isinstance(w, SessionWorkload) and not w.accumulate_deltas
    assert workload_from_trace(Trace(4, (s,)), "mooncake-delta").accumulate_deltas


def test_normalize_trace_requests_applies_arrival_speedup_ratio() -> None:
    reqs = [ReplayRequest("1", (1,) * 4, 1, 100.0), ReplayRequest("2", (2,) * 4, 1, 200.0)]
    assert [r.arrival_timestamp_ms for r in normalize_trace_requests(reqs, 10.0)] == [0.0, 10.0]


# ---------------------------------------------------------------------------
# WL-1..WL-4: row parsing and bad rows
# ---------------------------------------------------------------------------


def test_aliases_are_accepted() -> None:
    """WL-1: input_tokens, output_tokens, created_time, delay_ms."""
    t = trace_from_mooncake_lines(lines(
        {"session_id": "s", "created_time": 5, "input_tokens": 3, "output_tokens": 2, "hash_ids": [9]},
        {"session_id": "s", "delay_ms": 7, "input_tokens": 3, "output_tokens": 2, "hash_ids": [9]},
    ), 4)
    s = t.sessions[0]
    assert s.first_arrival_timestamp_ms == 5.0
    assert [(x.input_length, x.max_output_tokens, x.delay_after_previous_ms) for x in s.turns] == [(3, 2, 0.0), (3, 2, 7.0)]


def test_unknown_keys_and_nulls_are_ignored() -> None:
    """WL-2: no deny_unknown_fields; null is an absent field."""
    row = parse_mooncake_row({"output_length": 1, "hash_ids": [1], "extra": {"x": 1}, "timestamp": None,
                              "session_id": None})
    assert row == MooncakeRow(output_length=1, hash_ids=(1,))


def test_positional_array_row() -> None:
    """WL-2: serde also reads a struct from a JSON array, in the field order of the compiled
    build's eleven-field row (checked on the build: [null, 8, 2, [1], 0] is refused, as its fourth
    element lands on output_length; [null, null, 8, 2, null, [1], 0] is read)."""
    row = parse_mooncake_row([None, None, 8, 4, None, [1, 2], 3.5], 1)
    assert row == MooncakeRow(input_length=8, output_length=4, hash_ids=(1, 2), timestamp=3.5)
    with pytest.raises(InvalidInput):
        parse_mooncake_row([None, 8, 2, [1], 0], 1)
    with pytest.raises(InvalidInput):
        parse_mooncake_row([None] * 12, 1)


@pytest.mark.parametrize(
    "row,field",
    [
        ({"output_length": 1}, "hash_ids"),
        ({"hash_ids": [1]}, "output_length"),
        ({"output_length": 1, "hash_ids": [1], "input_length": "8"}, "input_length"),
        ({"output_length": 1, "hash_ids": [1], "input_length": 8.0}, "input_length"),
        ({"output_length": 1, "hash_ids": [1], "input_length": -1}, "input_length"),
        ({"output_length": True, "hash_ids": [1]}, "output_length"),
        ({"output_length": 1, "hash_ids": [1, -2]}, "hash_ids"),
        ({"output_length": 1, "hash_ids": [2 ** 64]}, "hash_ids"),
        ({"output_length": 1, "hash_ids": "1"}, "hash_ids"),
        ({"output_length": 1, "hash_ids": [1], "timestamp": "0"}, "timestamp"),
        ({"output_length": 1, "hash_ids": [1], "session_id": 5}, "session_id"),
        ({"output_length": 1, "hash_ids": [1], "priority": 2 ** 31}, "priority"),
        ({"output_length": 1, "hash_ids": [1], "strict_priority": -1}, "strict_priority"),
        ({"output_length": 1, "hash_ids": [1], "input_length": 4, "input_tokens": 4}, "input_length"),
        ({"output_length": 1, "hash_ids": [1], "delay": 5.0}, "delay"),
        ({"output_length": 1, "hash_ids": [1], "delay": -0.0, "timestamp": 1.0}, None),
        ("[1, 2", "json"),
        ('{"output_length": 1, "hash_ids": [1], "timestamp": NaN}', "json"),
        ('{"output_length": 1, "hash_ids": [1], "timestamp": 1e400}', "json"),
        ('{"output_length": 1, "output_length": 2, "hash_ids": [1]}', "output_length"),
        ("17", "row"),
    ],
)
def test_bad_rows_name_line_and_field(row: object, field: str | None) -> None:
    """WL-2..WL-7: every rejection is an InvalidInput naming the 1-based line and the field."""
    good = {"timestamp": 0.0, "output_length": 1, "hash_ids": [1]}
    text = lines(good, "", row)
    if field is None:  # -0.0 == 0.0: accepted on a first turn
        trace_from_mooncake_lines(text, 4)
        return
    with pytest.raises(InvalidInput) as ei:
        trace_from_mooncake_lines(text, 4)
    err = ei.value
    assert err.line == 3  # the blank line counts
    assert err.field == f"trace line 3: {field}"
    assert "line 3" in str(err)


def test_bad_delays() -> None:
    """WL-7: explicit negative delay; inferring a delay without a previous timestamp; time going back."""
    base = {"session_id": "s", "output_length": 1, "hash_ids": [1]}
    for second, field in (
        ({**base, "delay": -1.0}, "delay"),
        ({**base, "timestamp": 3.0}, "delay"),  # 3 - 5 < 0
    ):
        with pytest.raises(InvalidInput) as ei:
            trace_from_mooncake_lines(lines({**base, "timestamp": 5.0}, second), 4)
        assert (ei.value.line, ei.value.field) == (2, f"trace line 2: {field}")
    with pytest.raises(InvalidInput, match="cannot infer delay") as ei:
        trace_from_mooncake_lines(lines(base, {**base, "timestamp": 3.0}), 4)
    assert ei.value.line == 2


def test_delay_inference_uses_last_timestamped_row() -> None:
    """WL-7: rows without a timestamp neither update nor break the reference time."""
    base = {"session_id": "s", "output_length": 1, "hash_ids": [1]}
    t = trace_from_mooncake_lines(lines({**base, "timestamp": 10.0}, base, {**base, "timestamp": 25.0},
                                        {**base, "timestamp": 26.0, "delay": 100.0}), 4)
    assert [x.delay_after_previous_ms for x in t.sessions[0].turns] == [0.0, 0.0, 15.0, 100.0]


def test_empty_trace_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="did not contain any requests"):
        trace_from_mooncake_lines(["", "   "], 4)


def test_a_job_without_trace_block_size_reads_the_trace_at_512(tmp_path) -> None:
    """WL-5: no ``trace_block_size`` means the binding's 512: each hash id stands for 512 tokens, so
    two 700-token rows whose first hash ids agree share 512 tokens (at 16 they would share 16)."""
    from mocker_spec.reference import setup_from_job, workload_from_job

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 700, "output_length": 2, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 1, "input_length": 700, "output_length": 2, "hash_ids": [1, 3]}\n')
    job = {"mode": "agg", "router_mode": "round_robin", "trace_file": str(trace),
           "engine_args": {"block_size": 16, "num_gpu_blocks": 200}}

    def shared(extra):
        j = dict(job, **extra)
        a, b = [r.tokens for r in workload_from_job(j, setup_from_job(j)).requests]
        return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)

    assert shared({}) == shared({"trace_block_size": 512}) == DEFAULT_TRACE_BLOCK_SIZE == 512
    assert shared({"trace_block_size": 16}) == 16


def test_trace_block_size_must_be_positive() -> None:
    with pytest.raises(InvalidInput):
        trace_from_mooncake_lines(lines({"output_length": 1, "hash_ids": [1]}), 0)


# ---------------------------------------------------------------------------
# WL-5..WL-10: sessions, clamping, tokens
# ---------------------------------------------------------------------------


def test_auto_session_ids_count_blank_lines_and_sessions_keep_first_appearance() -> None:
    """WL-6: ``request_{line}``; shared ids become turns in file order."""
    r = {"timestamp": 0.0, "output_length": 1, "hash_ids": [1]}
    t = trace_from_mooncake_lines(lines(r, "", {**r, "session_id": "x"}, r, {**r, "session_id": "x", "timestamp": 4.0}), 4)
    assert [s.session_id for s in t.sessions] == ["request_1", "x", "request_4"]
    assert [len(s.turns) for s in t.sessions] == [1, 2, 1]
    assert not is_single_turn(t)


def test_oversized_input_length_is_clamped_not_rejected() -> None:
    """WL-8: input_length = min(given, len(hash_ids) * tbs)."""
    t = trace_from_mooncake_lines(lines({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}), 16)
    assert t.sessions[0].turns[0].input_length == 32


def test_hash_id_becomes_low_32_bits() -> None:
    """WL-10: ``h as u32``; expansion stops at input_length mid-block."""
    turn = TurnTrace(input_length=5, max_output_tokens=1, hash_ids=((1 << 32) + 7, 2 ** 64 - 1, 3))
    assert synthesize_tokens(turn, 3) == (7, 7, 7, 2 ** 32 - 1, 2 ** 32 - 1)


def test_zero_input_length_and_empty_hash_ids_fail_validation() -> None:
    """WL-9: positive input_length and at least one hash id per turn."""
    for row in ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]},
                {"timestamp": 0, "output_length": 1, "hash_ids": []}):
        with pytest.raises(InvalidInput) as ei:
            load_trace_workload(rows_of(row), 4)
        assert ei.value.line == 1


def test_cumulative_session_tokens_for_delta_traces() -> None:
    """WL-18: mooncake-delta prompts accumulate per session."""
    s = SessionTrace("s", 0.0, (TurnTrace(input_length=2, max_output_tokens=1, hash_ids=(1,)),
                                TurnTrace(input_length=3, max_output_tokens=1, hash_ids=(2,))))
    assert cumulative_session_tokens(s, 4) == ((1, 1), (1, 1, 2, 2, 2))


# ---------------------------------------------------------------------------
# WL-11..WL-15: timing
# ---------------------------------------------------------------------------


def test_normalize_then_speed_up_in_that_order() -> None:
    """WL-11/WL-12: arrival = (ts - min_ts) / ratio; delays are divided too."""
    base = {"output_length": 1, "hash_ids": [1]}
    w = load_trace_workload(rows_of({**base, "timestamp": 1000.3}, {**base, "timestamp": 1000.1}), 4, 3.0)
    assert isinstance(w, FlatWorkload)
    assert [r.arrival_timestamp_ms for r in w.requests] == [0.0, (1000.3 - 1000.1) / 3.0]
    t = speed_up_timing(normalize_session_starts(trace_from_mooncake_lines(lines(
        {**base, "session_id": "s", "timestamp": 50.0}, {**base, "session_id": "s", "delay": 9.0}), 4)), 2.0)
    assert t.sessions[0].first_arrival_timestamp_ms == 0.0
    assert t.sessions[0].turns[1].delay_after_previous_ms == 4.5


def test_negative_timestamps_are_valid_after_normalization() -> None:
    base = {"output_length": 1, "hash_ids": [1]}
    w = load_trace_workload(rows_of({**base, "timestamp": -5.0}, {**base, "timestamp": 0.0}), 4)
    assert [r.arrival_timestamp_ms for r in w.requests] == [0.0, 5.0]


@pytest.mark.parametrize("ratio", [0.0, -1.0, math.inf, math.nan, True, "2"])
def test_speedup_ratio_must_be_finite_positive(ratio: float) -> None:
    """WL-12: the model's API takes a number only (a case's boolean is converted before, DRV-19)."""
    with pytest.raises(InvalidInput) as exc:
        load_trace_workload(rows_of({"timestamp": 0.0, "output_length": 1, "hash_ids": [1]}), 4, ratio)
    assert exc.value.field == "arrival_speedup_ratio"


def test_stable_sort_keeps_file_order_for_ties_and_ids_follow_file_order() -> None:
    """WL-13/WL-15: uuid i+1 for file row i; ties keep file order."""
    base = {"output_length": 1, "hash_ids": [1]}
    w = load_trace_workload(rows_of({**base, "timestamp": 2.0, "input_length": 1},
                                    {**base, "timestamp": 1.0, "input_length": 2},
                                    {**base, "timestamp": 2.0, "input_length": 3},
                                    {**base, "timestamp": 1.0, "input_length": 4}), 4)
    assert [len(r.tokens) for r in w.requests] == [2, 4, 1, 3]
    assert [r.uuid[-1] for r in w.requests] == ["2", "4", "1", "3"]


@pytest.mark.skipif(not OK_CASES, reason="no reference corpus")
@pytest.mark.parametrize("case", OK_CASES, ids=[c.name for c in OK_CASES])
def test_corpus_arrivals_and_lengths_match_reference(case: RefCase) -> None:
    """WL-5..WL-15 against the reference: every report row's (arrival, input_length,
    output_length) is one of our requests, exactly."""
    cfg = case.config
    w = load_trace_file(case.trace_path, cfg["trace_block_size"], cfg.get("arrival_speedup_ratio", 1.0))
    assert isinstance(w, FlatWorkload)
    ours = Counter((r.arrival_timestamp_ms, len(r.tokens), r.max_output_tokens) for r in w.requests)
    theirs = Counter((r["arrival_time_ms"], r["input_length"], r["output_length"]) for r in case.report_rows())
    assert ours == theirs
    arrivals = [r.arrival_timestamp_ms for r in w.requests]
    assert arrivals == sorted(arrivals)


# ---------------------------------------------------------------------------
# file reading (WL-3)
# ---------------------------------------------------------------------------


def test_read_trace_lines_like_rust_bufread(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"a":1}\r\n\n{"b":2}\n')
    assert read_trace_lines(p) == ['{"a":1}', "", '{"b":2}']
    p.write_bytes(b'{"timestamp":0,"output_length":1,"hash_ids":[1]}\n\xff\n')
    with pytest.raises(InvalidInput) as ei:
        read_trace(p, 4)
    assert ei.value.line == 2
    with pytest.raises(InvalidInput):
        read_trace_lines(tmp_path / "missing.jsonl")


def test_parse_blank_line_is_none() -> None:
    assert parse_mooncake_line("  \t ", 1) is None


# ---------------------------------------------------------------------------
# WL-16..WL-17: synthetic inputs
# ---------------------------------------------------------------------------


def test_synthetic_token_id_is_splitmix64_low_bits() -> None:
    """WL-16: for request 0 / token 0 the input is the splitmix64 state after one
    increment from 0, whose published first output is 0xE220A8397B1DCDAF; low 32 bits."""
    assert synthetic_token_id(0, 0) == 0x7B1DCDAF
    assert all(synthetic_token_id(i, j) != 0 for i in range(20) for j in range(20))


def test_synthetic_flat_requests() -> None:
    """WL-16: uuid i+1, arrival i*interval (None in concurrency mode), no shared prefix."""
    reqs = synthetic_requests(8, 3, 3, 2.5)
    assert [r.uuid for r in reqs] == [f"00000000-0000-0000-0000-00000000000{i}" for i in (1, 2, 3)]
    assert [r.arrival_timestamp_ms for r in reqs] == [0.0, 2.5, 5.0]
    assert reqs[0].tokens[0] != reqs[1].tokens[0]
    assert all(r.max_output_tokens == 3 and len(r.tokens) == 8 for r in reqs)
    w = synthetic_replay_workload(16, 8, 3, 3, 2.5, arrival_speedup_ratio=2.0)
    assert isinstance(w, FlatWorkload) and [r.arrival_timestamp_ms for r in w.requests] == [0.0, 1.25, 2.5]
    c = synthetic_replay_workload(16, 8, 3, 3, 2.5, replay_concurrency=2)
    assert [r.arrival_timestamp_ms for r in c.requests] == [None] * 3
    one = synthetic_replay_workload(16, 8, 3, 3, 2.5, replay_concurrency=1)  # the smallest cap
    assert [r.arrival_timestamp_ms for r in one.requests] == [None] * 3


@pytest.mark.parametrize("interval, shown", [(float("nan"), "NaN"), (-1.0, "-1"), (float("inf"), "inf"),
                                             (-0.25, "-0.25")])
def test_synthetic_interval_refusal_quotes_the_value_on_the_flat_path_only(interval, shown) -> None:
    """WL-16, WL-17: the flat path's refusal of a bad arrival interval ends with `, got VALUE` in
    Rust's float display (recorded from the compiled build: `..., got NaN`); the session path's
    text, reached when another option selects it, quotes nothing."""
    with pytest.raises(InvalidInput) as flat:
        synthetic_replay_workload(16, 8, 3, 2, interval)
    assert flat.value.reason == f"arrival_interval_ms must be a finite non-negative number, got {shown}"
    with pytest.raises(InvalidInput) as session:
        synthetic_replay_workload(16, 8, 3, 2, interval, shared_prefix_ratio=0.5)
    assert session.value.reason == "arrival_interval_ms must be a finite non-negative number"


@pytest.mark.parametrize("kw", [{"turns_per_session": 2}, {"shared_prefix_ratio": 0.5},
                                {"num_prefix_groups": 1}, {"inter_turn_delay_ms": 1.0}])
def test_synthetic_workload_path_selection(kw: dict) -> None:
    """WL-17: any multi-turn / prefix / delay option selects the session workload."""
    assert isinstance(synthetic_replay_workload(16, 8, 3, 2, **kw), SessionWorkload)


def test_synthetic_workload_structure() -> None:
    """WL-17: ceil(isl/B) blocks, prefix = round_half_away(blocks*ratio), global unique counter,
    fresh ids per turn, sequential arrival gaps, delays sped up."""
    # 40 tokens / B 16 -> 3 blocks; 3 * 0.5 = 1.5 -> 2 prefix blocks (half-even would give 2 too;
    # 5 blocks * 0.5 = 2.5 -> 3 distinguishes them, checked below)
    t = synthetic_workload(16, 40, 4, 3, 0.1, 2, 0.5, 2, 1.0)
    ids = [[tr.hash_ids for tr in s.turns] for s in t.sessions]
    assert ids[0][0] == (SYNTHETIC_PREFIX_TAG | 0, SYNTHETIC_PREFIX_TAG | 1, 1)
    assert ids[0][1][2] == 2 and ids[1][0][2] == 3 and ids[2][1][2] == 6
    gap = 1000.0 / (1000.0 / 0.1)
    assert [s.first_arrival_timestamp_ms for s in t.sessions] == [0.0, gap, gap + gap]
    assert [tr.delay_after_previous_ms for tr in t.sessions[0].turns] == [0.0, 1.0]
    t5 = synthetic_workload(16, 80, 1, 1, 1.0, 1, 0.5, 1)
    assert sum(1 for h in t5.sessions[0].turns[0].hash_ids if h >= SYNTHETIC_PREFIX_TAG) == 3
    # without groups the prefix share is ignored: all ids unique
    t0 = synthetic_workload(16, 40, 4, 2, 1.0, 1, 0.5, 0)
    assert [s.turns[0].hash_ids for s in t0.sessions] == [(1, 2, 3), (4, 5, 6)]
    w = synthetic_replay_workload(16, 40, 4, 3, 2.0, turns_per_session=2, inter_turn_delay_ms=3.0,
                                  arrival_speedup_ratio=2.0)
    assert [s.first_arrival_timestamp_ms for s in w.trace.sessions] == [0.0, 1.0, 2.0]
    assert w.trace.sessions[0].turns[1].delay_after_previous_ms == 1.5
    validate_for_trace_mode(w.trace)


def test_synthetic_prefix_tokens_do_not_depend_on_group() -> None:
    """WL-17 abstraction: the group id lives above bit 32 and never reaches the tokens."""
    a = TurnTrace(input_length=32, max_output_tokens=1, hash_ids=(SYNTHETIC_PREFIX_TAG | (0 << 32) | 1, 5))
    b = TurnTrace(input_length=32, max_output_tokens=1, hash_ids=(SYNTHETIC_PREFIX_TAG | (7 << 32) | 1, 5))
    assert synthesize_tokens(a, 16) == synthesize_tokens(b, 16)


@pytest.mark.parametrize(
    "kw",
    [{"input_tokens": 0}, {"output_tokens": 0}, {"request_count": 0},
     {"turns_per_session": 0, "shared_prefix_ratio": 0.5},
     {"arrival_interval_ms": -1.0}, {"arrival_interval_ms": math.inf}, {"inter_turn_delay_ms": -1.0},
     {"shared_prefix_ratio": 1.5}, {"replay_concurrency": 0},
     {"num_prefix_groups": -1}, {"num_prefix_groups": 1.5}, {"num_prefix_groups": "2"},
     {"arrival_interval_ms": True}, {"arrival_interval_ms": "1"}, {"inter_turn_delay_ms": "x"}],
)
def test_synthetic_rejections(kw: dict) -> None:
    """WL-16 / WL-17: each bad setting is refused with its name (a boolean or a string too)."""
    base = dict(engine_block_size=16, input_tokens=8, output_tokens=2, request_count=2, turns_per_session=2)
    with pytest.raises(InvalidInput) as exc:
        synthetic_replay_workload(**{**base, **kw})
    assert exc.value.field in kw


def test_zero_turns_per_session_is_accepted_on_the_flat_path() -> None:
    """WL-16 quirk: only the workload path checks turns_per_session; 0 alone selects
    the flat path (the test is ``turns_per_session > 1``), which ignores it."""
    w = synthetic_replay_workload(16, 8, 2, 2, turns_per_session=0)
    assert isinstance(w, FlatWorkload) and len(w.requests) == 2


# ---------------------------------------------------------------------------
# WL-20: a trace file in concurrency mode
# ---------------------------------------------------------------------------


def test_concurrency_trace_keeps_file_order_and_sessions_and_drops_timestamps() -> None:
    """WL-20: no sort, no normalization: the later-stamped first row stays first; every request
    carries its session (``request_N`` after its line, or the row's own id) and no arrival."""
    base = {"output_length": 1, "hash_ids": [1]}
    rows = rows_of({**base, "timestamp": 9.0}, {**base, "timestamp": 1.0, "session_id": "s"}, {**base})
    w = load_concurrency_trace_workload(rows, 4)
    assert isinstance(w, SessionWorkload)  # always the driver's (DRV-17), as upstream
    from model.replay.admission import WorkloadDriver

    released = [r for r, _ in WorkloadDriver(w.trace, max_active_sessions=3).pop_ready(0.0)]
    assert [r.session_id for r in released] == ["request_1", "s", "request_3"]
    assert [r.arrival_timestamp_ms for r in released] == [None, None, None]
    # the same file in trace mode: the third row has no timestamp (rejected, WL-9); without it,
    # the flat path sorts by timestamp and attaches no session (WL-13, WL-15)
    with pytest.raises(InvalidInput, match="first_arrival_timestamp_ms"):
        load_trace_workload(rows, 4)
    flat = load_trace_workload(rows[:2], 4)
    assert [r.arrival_timestamp_ms for r in flat.requests] == [0.0, 8.0]
    assert [r.session_id for r in flat.requests] == [None, None]
    assert [len(r.tokens) for r in released] == [len(r.tokens) for r in load_trace_workload(rows[:2], 4).requests] + [4]


def test_concurrency_trace_validation_is_the_aggregated_runtimes_only() -> None:
    """WL-20: the aggregated runtimes validate (WL-9, a missing timestamp allowed) without
    normalizing first, so a negative timestamp is an error (in trace mode it is shifted to 0);
    the disaggregated runtime does not validate, so a zero-length prompt gets through there.
    Both checked against the compiled build (the golden ``conc-negative-timestamp`` and, for
    the disaggregated side, the sweep of spec/fidelity.md FID-6)."""
    neg = rows_of({"output_length": 1, "hash_ids": [1], "timestamp": -3.0})
    with pytest.raises(InvalidInput, match="invalid first_arrival_timestamp_ms -3$"):
        load_concurrency_trace_workload(neg, 4)
    assert load_trace_workload(neg, 4).requests[0].arrival_timestamp_ms == 0.0
    empty = rows_of({"output_length": 1, "hash_ids": [1], "input_length": 0})
    with pytest.raises(InvalidInput, match="positive input_length"):
        load_concurrency_trace_workload(empty, 4)
    both = rows_of({"output_length": 1, "hash_ids": [1], "input_length": 0}, {"output_length": 1, "hash_ids": [1], "timestamp": -3.0})
    w = load_concurrency_trace_workload(both, 4, validate=False)
    assert isinstance(w, SessionWorkload) and len(w.trace.sessions[0].turns[0].hash_ids) == 1
    assert w.trace.sessions[0].turns[0].input_length == 0


@pytest.mark.parametrize("value,text", [(-3.0, "-3"), (-0.1, "-0.1"), (-1e-7, "-0.0000001"),
                                        (-1e21, "-1000000000000000000000"), (-0.0, "-0"), (2.5, "2.5")])
def test_messages_print_floats_as_rust_does(value: float, text: str) -> None:
    """Upstream formats f64 values in its messages with Rust's ``{}`` (no exponent, no ``.0``); the
    -1e-7 case is the golden ``trace-tiny-negative-delay`` recorded from the compiled build."""
    from model.errors import rust_display

    assert rust_display(value) == text


def test_concurrency_trace_with_several_turns_stays_on_the_session_path() -> None:
    """WL-20: a multi-turn file takes the session path (run by the workload driver, DRV-17)."""
    base = {"output_length": 1, "hash_ids": [1], "session_id": "s"}
    assert isinstance(load_concurrency_trace_workload(rows_of(base, {**base, "delay": 2.0}), 4), SessionWorkload)


def test_trace_format_names_follow_the_binding() -> None:
    """WL-18/WL-19: ``mooncake_delta`` is another spelling; the agentic formats exist upstream but
    are not modelled; any other name gets the pinned binding's list (replay.rs:1668-1686; the
    compiled build, newer, also lists 'dynamo')."""
    from model.workload import canonical_trace_format

    assert canonical_trace_format("mooncake_delta") == "mooncake-delta"
    assert canonical_trace_format("mooncake") == "mooncake"
    with pytest.raises(InvalidInput, match="only 'mooncake' and 'mooncake-delta' are modelled"):
        canonical_trace_format("agentic-mooncake")
    with pytest.raises(InvalidInput) as err:
        canonical_trace_format("csv")
    assert err.value.reason == ("trace_format must be 'mooncake', 'mooncake-delta', "
                                "'agentic_mooncake'/'agentic-mooncake', or 'applied_compute_agentic', got 'csv'")


def test_reservations_past_isize_max_bytes_are_capacity_overflows() -> None:
    """WL-10, WL-16: upstream grows a Vec<u32> by a whole trace block before cutting it, and the
    binding reserves the synthetic request list and each prompt up front; past isize::MAX bytes
    (2^61 tokens, 2^56 requests) each panics with "capacity overflow" (recorded from the compiled
    build), and the model refuses the same input with that text. Just below, nothing is
    materialised beyond the prompt."""
    turn = TurnTrace(input_length=4, max_output_tokens=1, hash_ids=(7, 8), delay_after_previous_ms=0.0)
    with pytest.raises(InvalidInput) as info:
        synthesize_tokens(turn, 2**61)
    assert (info.value.field, info.value.reason) == ("trace_block_size", "capacity overflow")
    assert synthesize_tokens(turn, 2**61 - 1) == (7, 7, 7, 7)
    for kw, field in (({"request_count": 2**56}, "request_count"), ({"input_tokens": 2**61}, "input_tokens")):
        args = dict({"input_tokens": 8, "output_tokens": 2, "request_count": 2, "arrival_interval_ms": 1.0}, **kw)
        with pytest.raises(InvalidInput) as info:
            synthetic_requests(**args)
        assert (info.value.field, info.value.reason) == (field, "capacity overflow")


# ---------------------------------------------------------------------------
# serde_json's reading of a row, and the compiled build's row (WL-1..WL-3). Each case was also
# run on the compiled build (goldens trace-* of tests/goldens/refcases, or the probe noted).
# ---------------------------------------------------------------------------

_ROW = '"input_length": 16, "output_length": 2, "hash_ids": [1], "timestamp": 0'


def _line_error(text: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        parse_mooncake_line(text, 3)
    assert info.value.line == 3 and info.value.field.startswith("trace line 3: ")
    assert info.value.reason == "failed to parse line 3 as JSON"  # upstream's text (WL-4); the cause is the detail
    return info.value


def test_only_a_repeated_field_is_a_duplicate():
    """WL-2: serde skips unknown keys unread, so repeating one (or a key inside its value) is no
    error (golden trace-duplicate-unknown-key); a field twice, or under its name and its alias, is."""
    row = parse_mooncake_line('{"zz": 1, "zz": {"k": 1, "k": 2}, ' + _ROW + "}", 1)
    assert row.input_length == 16
    assert _line_error('{"input_length": 1, ' + _ROW + "}").field.endswith("input_length")
    assert _line_error('{"input_tokens": 1, ' + _ROW + "}").field.endswith("input_length")


def test_minus_zero_is_a_float():
    """WL-2: serde_json reads -0 as the float -0.0: an error for an integer field (golden
    trace-minus-zero-input-length), -0.0 for a timestamp."""
    assert "invalid type" in _line_error('{"input_length": -0, "output_length": 2, "hash_ids": [1]}').detail
    row = parse_mooncake_line('{"input_length": 16, "output_length": 2, "hash_ids": [1], "timestamp": -0}', 1)
    assert row.timestamp == 0.0 and math.copysign(1.0, row.timestamp) == -1.0


def test_numbers_are_valued_as_serde_json_values_them():
    """WL-2: a long fraction is not correctly rounded (the build reads ...784, see test_rustlib);
    a 310-digit integer for an f64 field is out of range (checked on the build)."""
    row = parse_mooncake_line('{"input_length": 16, "output_length": 2, "hash_ids": [1], "timestamp": 64938.497189547844}', 1)
    assert row.timestamp == 64938.49718954784
    assert "out of range" in _line_error('{"output_length": 2, "hash_ids": [1], "timestamp": 1' + "0" * 309 + "}").detail


def test_lone_surrogates_in_read_strings_and_keys():
    """WL-2: serde refuses an escaped lone surrogate in a string it deserializes (a string field, a
    row key; golden trace-lone-surrogate-session-id) and skips one in an unknown key's value."""
    for text in ('{"session_id": "\\ud800", ' + _ROW + "}", '{"policy_class": "\\udc00", ' + _ROW + "}",
                 '{"request_id": "a\\udc00", ' + _ROW + "}", '{"\\ud800": 1, ' + _ROW + "}"):
        _line_error(text)
    assert parse_mooncake_line('{"zz": {"\\ud800": "\\ud800"}, ' + _ROW + "}", 1).input_length == 16


def test_blank_lines_are_rusts_white_space():
    """WL-3: a line of U+3000 is blank; one of U+001C is a JSON error (golden trace-control-char-line)."""
    assert parse_mooncake_line("\u3000 \x85", 1) is None
    _line_error("\x1c")


def test_the_builds_two_extra_fields():
    """WL-1, WL-5: the compiled build's row also reads request_id (a string) and output_token_ids
    (u32s, as many as output_length; golden trace-output-token-ids-length). Output token replay
    is a build feature the model refuses after the load."""
    assert "expected a string" in _line_error('{"request_id": 5, ' + _ROW + "}").detail
    _line_error('{"output_token_ids": [-1, 2], ' + _ROW + "}")
    _line_error('{"output_token_ids": "x", ' + _ROW + "}")
    with pytest.raises(InvalidInput, match="does not match output_token_ids length 3") as info:
        trace_from_mooncake_lines(['{' + _ROW + "}", '{"output_token_ids": [1, 2, 3], ' + _ROW + "}"], 16)
    assert info.value.line == 2
    # after the load: a later row's load error still comes first, as on the build
    with pytest.raises(InvalidInput, match="sets delay on the first turn"):
        trace_from_mooncake_lines(['{"output_token_ids": [7, 8], ' + _ROW + "}", '{"delay": 1, ' + _ROW + "}"], 16)
    with pytest.raises(InvalidInput, match="output token replay") as info:
        trace_from_mooncake_lines(['{"output_token_ids": [7, 8], ' + _ROW + "}", '{' + _ROW + "}"], 16)
    assert info.value.line == 1
    assert trace_from_mooncake_lines(['{"request_id": "r", ' + _ROW + "}"], 16).sessions[0].turns[0].input_length == 16


def test_lines_are_read_one_at_a_time(tmp_path: Path):
    """WL-3, WL-5: a bad row comes before invalid UTF-8 on a later line (golden
    trace-bad-row-before-bad-utf8), and a zero trace block size before the file is even opened."""
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"output_length": 2, "hash_ids": [1]}\n{bad\n\xff\xfe\n')
    with pytest.raises(InvalidInput) as info:
        load_trace_file(p, 16)
    assert info.value.line == 2 and info.value.reason == f"failed to parse line 2 from {p} as JSON"
    p.write_bytes(b'{"output_length": 2, "hash_ids": [1]}\n\xff\xfe\n')
    with pytest.raises(InvalidInput) as info:  # upstream's texts name the file as it was given
        load_trace_file(str(p), 16)
    assert info.value.reason == f"failed to read line 2 from {p}" and info.value.detail == "invalid UTF-8"
    with pytest.raises(InvalidInput) as info:
        load_trace_file(str(tmp_path / "missing.jsonl"), 16)
    assert info.value.reason == f"failed to open trace file {tmp_path / 'missing.jsonl'}"
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(InvalidInput) as info:
        load_trace_file(str(tmp_path / "empty.jsonl"), 16)
    assert info.value.reason == f"trace file {tmp_path / 'empty.jsonl'} did not contain any requests"
    with pytest.raises(InvalidInput, match="trace_block_size must be greater than 0"):
        load_trace_file(tmp_path / "missing.jsonl", 0)
    q = tmp_path / "crlf.jsonl"
    q.write_bytes(b'a\r\nb\r')  # only a \r before \n is dropped, as Rust's lines() does
    assert read_trace_lines(q) == ["a", "b\r"]


def test_synthetic_texts_and_reservations():
    """WL-15, WL-17, WL-10: the flat path's ratio text names the argument (replay/mod.rs:102-106);
    the workload path's ratio is shown in Rust's Display, its qps of 1000 / interval must be finite,
    and its session list is reserved (64-byte entries: 2^57 sessions is a capacity overflow on the
    build); a trace prompt reserves input_length u32 tokens first (2^61 is a capacity overflow on
    the build with tbs 2^60 and two hash ids)."""
    with pytest.raises(InvalidInput, match="^arrival_speedup_ratio=0: arrival_speedup_ratio must be a finite"):
        synthetic_replay_workload(16, 8, 2, 2, arrival_speedup_ratio=0)
    with pytest.raises(InvalidInput, match="got 2$"):
        synthetic_workload(16, 8, 2, 2, turns_per_session=2, shared_prefix_ratio=2.0)
    with pytest.raises(InvalidInput, match="got NaN$"):
        synthetic_workload(16, 8, 2, 2, turns_per_session=2, shared_prefix_ratio=float("nan"))
    with pytest.raises(InvalidInput, match="qps must be a finite positive number, got inf"):
        synthetic_workload(16, 8, 2, 2, arrival_interval_ms=1e-310, turns_per_session=2)
    with pytest.raises(InvalidInput, match="capacity overflow"):
        synthetic_workload(16, 8, 2, 2**57, turns_per_session=2)
    turn = TurnTrace(input_length=2**61, max_output_tokens=1, hash_ids=(1, 2))
    with pytest.raises(InvalidInput, match="capacity overflow") as info:
        synthesize_tokens(turn, 2**60)
    assert info.value.field == "input_length"
