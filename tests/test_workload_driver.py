"""The session workload driver (spec/replay.md DRV-17): trace and concurrency policies, think
times, slot hand-over and cumulative prompts, derived by hand from the rule (upstream
loadgen/driver.rs).  The runtimes' use of it is checked against the compiled build by the goldens
``tests/goldens/refcases/mt-*`` (tests/test_replay.py)."""

from __future__ import annotations

import pytest

from model.replay.admission import WorkloadAdmission, WorkloadDriver
from model.replay.common import ReplayError
from model.report import uuid_from_int
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
    # DRV-17: the k-th turn released gets uuid k, counted from 1; ``released`` (LIVE-7) counts them
    assert [r.uuid for r, _ in ready] == [uuid_from_int(k) for k in (1, 2, 3)]
    d = WorkloadDriver(t)
    adm = WorkloadAdmission(d)
    assert adm.released == 0
    adm.drain_ready(0.0, 0)
    assert adm.released == 3


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


# ---------------------------------------------------------------------------------------------
# DRV-17 as properties: any trace, any completion order
# ---------------------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SESSIONS = st.lists(
    st.tuples(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.5, 7.0])),
              st.lists(st.sampled_from([0.0, 1.0, 4.0]), min_size=1, max_size=4)),
    min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(sessions=SESSIONS, cap=st.one_of(st.none(), st.integers(1, 3)), data=st.data())
def test_driver_releases_every_turn_once_in_order_within_the_cap(sessions, cap, data):
    """DRV-17: whatever the order in which released turns complete, every turn of every session is
    released exactly once, a session's turns in order and one at a time, a turn never before its
    think time has passed since the previous one completed, at most ``cap`` sessions are started
    and unfinished at once, and the driver ends drained."""
    trace = Trace(2, tuple(
        SessionTrace(f"s{i}", first, tuple(_turn(10 * i + k, delay if k else 0.0) for k, delay in enumerate(delays)))
        for i, (first, delays) in enumerate(sessions)))
    d = WorkloadDriver(trace, max_active_sessions=cap)
    now, running, done_at, released = 0.0, [], {}, []
    for _ in range(200):
        for req, at in d.pop_ready(now):
            assert at <= now
            s, k = req.session_id, req.turn_index
            assert all(r[0] != s for r in running)  # one turn of a session at a time
            assert k == sum(1 for x in released if x == s)  # turns in order
            if k:
                assert now >= done_at[s] + sessions[int(s[1:])][1][k]  # think time respected
            running.append((s, req.uuid))
            released.append(s)
        if cap is not None:
            started = {s for s in released}
            finished = {s for s in started if released.count(s) == len(sessions[int(s[1:])][1])
                        and all(r[0] != s for r in running)}
            assert len(started - finished) <= cap
        if running:
            s, uuid = running.pop(data.draw(st.integers(0, len(running) - 1)))
            now += data.draw(st.sampled_from([0.0, 0.5, 3.0]))
            d.on_request_completed(uuid, now)
            done_at[s] = now
            continue
        nxt = d.next_ready_time_ms()
        if nxt is None:
            break
        assert nxt >= now
        now = nxt
    assert d.is_drained()
    assert sorted(released) == sorted(f"s{i}" for i, (_, delays) in enumerate(sessions) for _ in delays)
