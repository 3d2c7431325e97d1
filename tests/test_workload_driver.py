"""The session workload driver (spec/replay.md DRV-17): trace and concurrency policies, think
times, slot hand-over and cumulative prompts, derived by hand from the rule (upstream
loadgen/driver.rs).  The runtimes' use of it is checked against the compiled build by the goldens
``tests/goldens/refcases/mt-*`` (tests/test_replay.py)."""

from __future__ import annotations

import pytest

from model.replay.admission import WorkloadAdmission, WorkloadDriver
from model.replay.common import ReplayError
from model.workload import SessionTrace, Trace, TurnTrace


def _turn(hash_id: int, delay: float = 0.0, length: int = 2) -> TurnTrace:
    return TurnTrace(input_length=length, max_output_tokens=1, hash_ids=(hash_id,), delay_after_previous_ms=delay)


def _trace() -> Trace:
    # session a: ready at 0, a second turn 5 ms after the first completes; session b: ready at 1
    return Trace(2, (SessionTrace("a", 0.0, (_turn(1), _turn(2, 5.0))), SessionTrace("b", 1.0, (_turn(3),))))


def _names(ready):
    return [(r.session_id, r.turn_index, at) for r, at in ready]


def test_trace_policy_releases_first_turns_at_their_timestamps_and_next_turns_after_think_time():
    d = WorkloadDriver(_trace())
    assert d.total == 3 and d.next_ready_time_ms() == 0.0
    a0 = d.pop_ready(0.0)
    assert _names(a0) == [("a", 0, 0.0)] and a0[0][0].arrival_timestamp_ms == 0.0
    assert d.next_ready_time_ms() == 1.0
    assert _names(d.pop_ready(1.0)) == [("b", 0, 1.0)]
    assert d.next_ready_time_ms() is None  # a's next turn waits for its first to complete
    d.on_request_completed(a0[0][0].uuid, 3.0)
    assert d.next_ready_time_ms() == 8.0  # 3 + 5 ms think time
    assert d.pop_ready(7.9) == []
    a1 = d.pop_ready(8.0)
    assert _names(a1) == [("a", 1, 8.0)] and a1[0][0].tokens == (2, 2)
    assert not d.is_drained()


def test_concurrency_policy_holds_a_session_slot_through_its_think_time():
    """Cap 1: b waits until a has finished both turns; a's think time keeps the slot."""
    d = WorkloadDriver(_trace(), max_active_sessions=1)
    first = d.pop_ready(0.0)
    assert _names(first) == [("a", 0, 0.0)] and first[0][0].arrival_timestamp_ms is None
    assert d.next_ready_time_ms() is None  # the only slot is taken
    d.on_request_completed(first[0][0].uuid, 4.0)
    assert d.next_ready_time_ms() == 9.0 and d.pop_ready(8.0) == []
    second = d.pop_ready(9.0)
    assert _names(second) == [("a", 1, 9.0)]
    d.on_request_completed(second[0][0].uuid, 20.0)
    assert d.next_ready_time_ms() == 20.0  # a ended: b is activated at that moment
    last = d.pop_ready(20.0)
    assert _names(last) == [("b", 0, 20.0)]
    d.on_request_completed(last[0][0].uuid, 21.0)
    assert d.is_drained()


def test_concurrency_admission_stamps_arrival_now_and_single_worker_limit_applies():
    d = WorkloadDriver(_trace(), max_active_sessions=2)
    assert _names(d.pop_ready(0.0, 1)) == [("a", 0, 0.0)]  # a runtime's own limit of one
    adm = WorkloadAdmission(d)
    assert [(r.session_id, at) for r, at in adm.drain_ready(2.5, 0)] == [("b", 2.5)]


def test_ties_pop_by_session_index_and_uuids_follow_release_order():
    t = Trace(2, tuple(SessionTrace(s, 0.0, (_turn(i),)) for i, s in enumerate(("z", "y", "x"))))
    ready = WorkloadDriver(t).pop_ready(0.0)
    assert [r.session_id for r, _ in ready] == ["z", "y", "x"]
    assert [r.uuid for r, _ in ready] == sorted(r.uuid for r, _ in ready)


def test_delta_prompts_accumulate_per_session():
    t = Trace(2, (SessionTrace("a", 0.0, (_turn(1), _turn(2))),))
    d = WorkloadDriver(t, accumulate_deltas=True)
    (r0, _), = d.pop_ready(0.0)
    d.on_request_completed(r0.uuid, 1.0)
    (r1, _), = d.pop_ready(1.0)
    assert r0.tokens == (1, 1) and r1.tokens == (1, 1, 2, 2)


def test_an_unknown_completion_is_an_error():
    with pytest.raises(ReplayError, match="unknown workload request completion"):
        WorkloadDriver(_trace()).on_request_completed("nope", 0.0)
