"""Replay drivers (spec/replay.md DRV, DIS, LIVE rules): reference corpus, upstream test ports, livelocks, CLI."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import attrs
import pytest

from model import core as C
from model.engine_args import engine_args_from_json
from model.errors import InternalInvariantBroken, InvalidInput
from model.ids import HandoffId
from model.report import TerminalStatus, finish
from model.replay import ReplayDeadEnd, ReplayLivelock, ReplaySetup, check_setup, run_replay
from model.replay.common import EventHeap, made_progress
from model.replay.coordinator import (
    ActionKind,
    DestinationReservedFact,
    Failed,
    FailedFact,
    HandoffOrder,
    Outcome,
    SourceHeldFact,
    TransferCompletedFact,
    new_coordinator,
)
from model.replay.livelock import canonical_state
from model.timing import HandoffTransferTiming, KvTransferTimingMode
from model.workload import FlatWorkload, ReplayRequest, normalize_trace_requests, synthetic_replay_workload
from model.report import uuid_from_int
from mocker_spec import cli
from mocker_spec.reference import case_dirs, check_case

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "tests" / "goldens" / "refcases"
#: the shared reference corpus: ``$MOCKER_SPEC_REFCASES``, else ``shared/refcases`` beside the repository
SHARED = pathlib.Path(os.environ.get("MOCKER_SPEC_REFCASES") or ROOT.parent / "shared" / "refcases")


def _check(case_dir: pathlib.Path) -> None:
    ours, ref, div = check_case(case_dir)
    assert div is None, div.describe()


# ---------------------------------------------------------------------------------------------
# reference corpus (DRV-1..DRV-16, DIS-1..DIS-15): per-request report and summary parity
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_dir", case_dirs(GOLDENS), ids=lambda p: p.name)
def test_golden_refcase_matches_reference(case_dir):
    """End-to-end parity: exercises DRV-4, DRV-5, DRV-7, DRV-12, DRV-14, DRV-15, DIS-8, DIS-11,
    DIS-13 and DIS-14 on every case (a case the reference hangs on must end in a livelock
    diagnosis, not spin: LIVE-1, LIVE-7)."""
    with _Deadline(120):
        _check(case_dir)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason="shared reference corpus not present")
@pytest.mark.parametrize(
    "case_dir", case_dirs(SHARED) if SHARED.is_dir() else [], ids=lambda p: p.name
)
def test_shared_refcase_matches_reference(case_dir):
    _check(case_dir)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _args(**kw):
    return engine_args_from_json(kw)


def _staged(worker_type, speedup=1000.0, **kw):
    """Upstream disagg_tests.rs ``staged_args``: B=64, 256 blocks, 8 seqs, both speed-ups."""
    base = dict(block_size=64, num_gpu_blocks=256, max_num_batched_tokens=8192, max_num_seqs=8,
                speedup_ratio=speedup, decode_speedup_ratio=speedup, worker_type=worker_type)
    base.update(kw)
    return _args(**base)


def _req(i, isl, osl, arrival, token=None):
    toks = tuple([token if token is not None else i] * isl)
    return ReplayRequest(uuid=uuid_from_int(i), tokens=toks, max_output_tokens=osl, arrival_timestamp_ms=arrival)


def _run(setup, reqs):
    """Like upstream's ``run_trace_collect``: arrivals are normalized first (WL-15)."""
    reqs = tuple(reqs)
    if all(r.arrival_timestamp_ms is not None for r in reqs):
        reqs = normalize_trace_requests(reqs, 1.0)
    col = run_replay(setup, FlatWorkload(reqs))
    summary, records = finish(col)
    return col, summary, {r.uuid: r for r in records}


def _disagg(np_=2, nd=2, prefill_kw=None, decode_kw=None, **kw):
    return ReplaySetup(prefill_args=_staged("prefill", **(prefill_kw or {})),
                       decode_args=_staged("decode", **(decode_kw or {})),
                       num_prefill_workers=np_, num_decode_workers=nd, **kw)


# ---------------------------------------------------------------------------------------------
# DRV: event heap, progress predicate, setup checks
# ---------------------------------------------------------------------------------------------


def test_event_heap_orders_by_time_then_push_and_blocks_on_other_kinds():
    """DRV-3: (at_ms, seq_no) order; pop_ready only pops the top event of the asked kind."""
    h = EventHeap()
    h.push(5.0, "transfer_complete", "t")
    h.push(5.0, "worker_completion", "w")
    h.push(1.0, "worker_completion", "early")
    assert h.pop_ready("worker_completion", 1.0) == "early"
    assert h.pop_ready("worker_completion", 5.0) is None  # blocked by the transfer at the top
    assert h.pop_ready("transfer_complete", 5.0) == "t"
    assert h.pop_ready("worker_completion", 5.0) == "w"
    assert h.is_empty()


def test_event_heap_retain_drops_refused_events_and_keeps_the_order_of_the_rest():
    """DRV-3, DIS-14: the compaction of stale transfer events keeps exactly the events the
    predicate accepts (it sees each event's kind and payload), still in (at_ms, push) order."""
    h = EventHeap()
    h.push(3.0, "transfer_complete", "stale-a")
    h.push(2.0, "worker_completion", "w1")
    h.push(2.0, "transfer_complete", "live")
    h.push(1.0, "transfer_complete", "stale-b")
    h.push(2.0, "worker_completion", "w2")
    seen = []

    def keep(kind, payload):
        seen.append((kind, payload))
        return not payload.startswith("stale")

    h.retain(keep)
    assert sorted(seen) == sorted([("transfer_complete", "stale-a"), ("worker_completion", "w1"),
                                   ("transfer_complete", "live"), ("transfer_complete", "stale-b"),
                                   ("worker_completion", "w2")])
    assert len(h) == 3
    assert h.pop_ready("worker_completion", 2.0) == "w1"
    assert h.pop_ready("worker_completion", 2.0) is None  # "live" was pushed before w2
    assert h.pop_ready("transfer_complete", 2.0) == "live"
    assert h.pop_ready("worker_completion", 2.0) == "w2"
    assert h.is_empty()


def test_progress_predicate_counts_admissions_and_scheduled_fpm():
    """DRV-6: an empty pass is no progress; any admission is."""
    core = C.new_core(_args(block_size=16, num_gpu_blocks=8))
    _, res = C.execute_pass(core, 0.0)
    assert res.end_ms == 0.0 and not made_progress(res)


@pytest.mark.parametrize(
    "setup, field",
    [
        (ReplaySetup(engine_args=_args(block_size=16), num_prefill_workers=2), "num_prefill_workers"),
        (ReplaySetup(prefill_args=_staged("prefill")), "decode_engine_args"),
        (ReplaySetup(prefill_args=_staged("prefill"), decode_args=_staged("decode"), num_workers=2), "num_workers"),
        (ReplaySetup(engine_args=_args(block_size=16), replay_concurrency=0), "replay_concurrency"),
        (ReplaySetup(engine_args=_args(block_size=16), num_workers=2, router_mode="kv_router"), "router_mode"),
        (ReplaySetup(engine_args=_args(block_size=16, worker_type="decode")), "worker_type"),
        (ReplaySetup(prefill_args=_args(engine_type="trtllm", worker_type="prefill", block_size=16),
                     decode_args=_args(engine_type="trtllm", worker_type="decode", block_size=16)), "engine_type"),
    ],
)
def test_setup_checks_name_the_field(setup, field):
    """DRV-1: upstream's argument checks; kv_router is refused (not modelled)."""
    with pytest.raises(InvalidInput) as exc:
        check_setup(setup)
    assert exc.value.field == field


@pytest.mark.parametrize("field", ["num_workers", "num_prefill_workers", "num_decode_workers"])
def test_zero_workers_get_upstreams_replay_message_and_negative_counts_the_type_check(field):
    """DRV-1, ARGS-18: a count of 0 passes the type check and is refused by upstream's replay
    check, with its text (validate.rs); only a negative count is refused as not a non-negative
    integer."""
    disagg = field != "num_workers"
    def setup(n):
        if disagg:
            other = "num_decode_workers" if field == "num_prefill_workers" else "num_prefill_workers"
            return ReplaySetup(prefill_args=_staged("prefill"), decode_args=_staged("decode"),
                               **{field: n, other: 1})
        return ReplaySetup(engine_args=_args(block_size=16), num_workers=n)
    with pytest.raises(InvalidInput) as zero:
        check_setup(setup(0))
    assert (zero.value.field, zero.value.rule) == (field, "ARGS-18")
    assert f"trace replay requires {field} >= 1" in str(zero.value)
    with pytest.raises(InvalidInput) as negative:
        check_setup(setup(-1))
    assert (negative.value.field, negative.value.rule) == (field, "DRV-1")
    assert "must be a non-negative integer" in str(negative.value)
    check_setup(setup(1))


# ---------------------------------------------------------------------------------------------
# DRV-9..DRV-11: single-worker runtime
# ---------------------------------------------------------------------------------------------


def test_single_runtime_leaves_decode_worker_null_and_uses_static_worker_seconds():
    """DRV-9: SingleRuntime never assigns a worker index; worker-seconds = 1 x duration."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=64))
    _, summary, recs = _run(setup, [_req(1, 32, 3, 0.0), _req(2, 32, 3, 1.0)])
    assert all(r.decode_worker_idx is None for r in recs.values())
    assert summary["decode_worker_seconds"] == summary["duration_ms"] / 1000.0


@pytest.mark.parametrize("runtime", ["single", "agg", "disagg"])
def test_progress_observer_counts_each_finished_request_once(runtime):
    """DRV-1: ``on_progress(done, total)`` (the CLI's progress bar) sees the number of requests
    finished so far, rising to the trace's size, with the trace's size as the total, on each of
    the three runtimes."""
    if runtime == "disagg":
        setup = _disagg(np_=1, nd=2)
    else:
        setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=64),
                            num_workers=1 if runtime == "single" else 2)
    reqs = normalize_trace_requests(tuple(_req(i, 32, 3, 5.0 * i) for i in range(1, 5)), 1.0)
    calls = []
    run_replay(setup, FlatWorkload(reqs), on_progress=lambda done, total: calls.append((done, total)))
    assert calls, "no progress was reported"
    assert {total for _, total in calls} == {4}
    done = [d for d, _ in calls]
    assert done == sorted(set(done)) and 1 <= done[0] and done[-1] == 4


def test_single_runtime_zero_output_is_a_dead_end():
    """DRV-8/DRV-11: an ``output_length: 0`` row never completes -> dead end after 1024 idle passes."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=64))
    with pytest.raises(ReplayDeadEnd) as exc:
        _run(setup, [_req(1, 32, 0, 0.0)])
    assert str(exc.value) == "offline replay reached a dead end with 1 in-flight requests remaining"
    assert exc.value.in_flight == 1


def test_single_concurrency_arrival_is_release_time():
    """DRV-2 (port of single.rs test_concurrency_replay_matches_manual_steps): cap 1 releases the
    next request when the previous one completes; its arrival is that time."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=64), replay_concurrency=1)
    reqs = [attrs.evolve(_req(i, 32, 3, 0.0), arrival_timestamp_ms=None) for i in (1, 2, 3)]
    _, _, recs = _run(setup, reqs)
    r = [recs[uuid_from_int(i)] for i in (1, 2, 3)]
    assert r[0].arrival_time_ms == 0.0
    assert r[1].arrival_time_ms == r[0].last_token_ms
    assert r[2].arrival_time_ms == r[1].last_token_ms


def test_trtllm_oversized_request_rejected_unblocks_follower():
    """DRV-10/DRV-14 (port of agg.rs trtllm_oversized_request_rejected_unblocks_follower_agg): the
    rejected request gets terminal status rejected and the next one completes."""
    args = _args(engine_type="trtllm", block_size=16, num_gpu_blocks=4, max_num_seqs=4)
    for workers in (1, 2):
        setup = ReplaySetup(engine_args=args, num_workers=workers)
        _, _, recs = _run(setup, [_req(1, 200, 4, 0.0), _req(2, 16, 2, 0.0)])
        assert recs[uuid_from_int(1)].terminal_status is TerminalStatus.REJECTED
        assert recs[uuid_from_int(1)].first_token_ms is None
        assert recs[uuid_from_int(2)].terminal_status is TerminalStatus.COMPLETED


# ---------------------------------------------------------------------------------------------
# DRV-12..DRV-16: aggregated event loop
# ---------------------------------------------------------------------------------------------


def test_agg_round_robin_assigns_same_timestamp_requests_in_order():
    """DRV-5/DRV-13 (port of agg.rs ..._round_robin_assigns_same_timestamp_requests_deterministically)."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=256), num_workers=3)
    reqs = [_req(i, 32, 2, 0.0) for i in range(1, 8)]
    _, _, recs = _run(setup, reqs)
    assert [recs[uuid_from_int(i)].decode_worker_idx for i in range(1, 8)] == [0, 1, 2, 0, 1, 2, 0]


def test_agg_worker_seconds_integrate_worker_count():
    """DRV-15: every clock advance adds ``workers * dt / 1000``; prefill stays 0."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=256), num_workers=2)
    _, summary, _ = _run(setup, [_req(1, 32, 4, 0.0), _req(2, 32, 4, 50.0)])
    assert summary["prefill_worker_seconds"] == 0.0
    assert summary["decode_worker_seconds"] == pytest.approx(2 * summary["duration_ms"] / 1000.0)


def test_agg_multi_worker_concurrency_counts_worker_in_flight():
    """DRV-2 (port of agg.rs test_multi_worker_concurrency_uses_worker_in_flight_for_cap_checks)."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=256), num_workers=2, replay_concurrency=2)
    reqs = [attrs.evolve(_req(i, 32, 3, 0.0), arrival_timestamp_ms=None) for i in range(1, 5)]
    _, _, recs = _run(setup, reqs)
    arrivals = sorted(r.arrival_time_ms for r in recs.values())
    assert arrivals[:2] == [0.0, 0.0] and arrivals[2] > 0.0


def test_agg_concurrency_releases_every_free_slot_before_the_first_pass():
    """DRV-2/DRV-12: at cap 3 the flat queue releases three requests in one drain, before any
    pass starts, so worker 0 gets requests 1 and 3 (round robin) and admits both in its first
    pass at 0 ms.  Releasing one request per drain would start worker 0's pass on request 1
    alone and leave request 3 queued behind it."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=256), num_workers=2, replay_concurrency=3)
    reqs = [attrs.evolve(_req(i, 32, 3, 0.0), arrival_timestamp_ms=None) for i in range(1, 5)]
    _, _, recs = _run(setup, reqs)
    first = [recs[uuid_from_int(i)] for i in (1, 2, 3)]
    assert [r.decode_worker_idx for r in first] == [0, 1, 0]
    assert [r.arrival_time_ms for r in first] == [0.0, 0.0, 0.0]
    assert [r.first_admit_ms for r in first] == [0.0, 0.0, 0.0]
    assert recs[uuid_from_int(4)].arrival_time_ms > 0.0


def test_agg_same_timestamp_arrival_joins_next_pass():
    """DRV-12: completions first, then arrivals at the same time, then new passes."""
    setup = ReplaySetup(engine_args=_args(block_size=16, num_gpu_blocks=256), num_workers=2)
    col, _, recs = _run(setup, [_req(1, 32, 1, 0.0)])
    end = recs[uuid_from_int(1)].last_token_ms
    _, _, recs2 = _run(setup, [_req(1, 32, 1, 0.0), _req(2, 32, 1, end), _req(3, 32, 1, end)])
    assert recs2[uuid_from_int(3)].first_admit_ms == end  # worker 0 is idle again at `end`


# ---------------------------------------------------------------------------------------------
# DIS: disaggregated runtime (ports of disagg_tests.rs, vLLM)
# ---------------------------------------------------------------------------------------------


def test_disagg_trace_smoke_reports_decode_only_tokens():
    """DIS-3/DIS-13 (port of test_trace_smoke_reports_decode_only_tokens): the prefill copy emits one
    hidden token; all three visible tokens come from decode."""
    _, summary, recs = _run(_disagg(), [_req(1, 128, 3, 5.0)])
    r = recs[uuid_from_int(1)]
    assert r.arrival_time_ms == 0.0 and r.first_admit_ms is not None and r.first_token_ms is not None
    assert r.output_length == 3
    assert summary["completed_requests"] == 1 and summary["total_output_tokens"] == 3


def test_disagg_prefill_and_decode_use_separate_pools_and_handoff_order():
    """DIS-6/DIS-10/DIS-11/DIS-14 (port of test_prefill_and_decode_use_separate_worker_pools and
    test_source_release_waits_for_destination_activation): both indices recorded, and the
    recorded handoff times follow held <= reserved <= activated <= decode admit, release."""
    _, _, recs = _run(_disagg(), [_req(1, 128, 2, 0.0), _req(2, 128, 2, 10.0)])
    for i, w in ((1, 0), (2, 1)):
        r = recs[uuid_from_int(i)]
        assert r.prefill_worker_idx == w and r.decode_worker_idx == w
        assert r.prefill_admit_ms <= r.source_held_ms <= r.destination_reserved_ms
        assert r.destination_reserved_ms <= r.destination_activated_ms <= r.decode_admit_ms
        assert r.destination_activated_ms <= r.source_released_ms
        assert r.prefill_route_overlap_tokens == 0 and r.decode_route_overlap_tokens == 0


def test_disagg_concurrency_backfill_waits_for_decode_completion():
    """DIS-2 (port of test_concurrency_backfill_waits_for_decode_completion)."""
    reqs = [attrs.evolve(_req(i, 128, 3, 0.0), arrival_timestamp_ms=None) for i in (1, 2)]
    _, _, recs = _run(_disagg(replay_concurrency=1), reqs)
    first, second = recs[uuid_from_int(1)], recs[uuid_from_int(2)]
    assert first.arrival_time_ms == 0.0
    assert second.arrival_time_ms == first.last_token_ms


def test_disagg_transfer_delay_uses_prefill_args_only():
    """DIS-9 / TIME-12: the transfer delay comes from the source (prefill) core's args."""
    bw = dict(kv_transfer_bandwidth=1.0, kv_bytes_per_token=1_000_000)
    _, _, with_delay = _run(_disagg(1, 1, prefill_kw=bw), [_req(1, 128, 2, 0.0)])
    _, _, decode_only = _run(_disagg(1, 1, decode_kw=bw), [_req(1, 128, 2, 0.0)])
    _, _, none = _run(_disagg(1, 1), [_req(1, 128, 2, 0.0)])
    r = with_delay[uuid_from_int(1)]
    assert r.destination_activated_ms == pytest.approx(r.destination_reserved_ms + 128.0)  # 128 tok * 1e6 B / 1 GB/s
    assert decode_only[uuid_from_int(1)] == attrs.evolve(none[uuid_from_int(1)], uuid=none[uuid_from_int(1)].uuid)


def test_disagg_destination_missing_mode_charges_transferable_tokens():
    """DIS-9 (port of the transfer_timing_config cases): destination_missing counts the
    destination's unpublished tokens, so a warm decode cache shortens the second transfer."""
    bw = dict(kv_transfer_bandwidth=1.0, kv_bytes_per_token=1_000_000, kv_transfer_timing_mode="destination_missing")
    _, _, recs = _run(_disagg(1, 1, prefill_kw=bw), [_req(1, 128, 2, 0.0, token=7), _req(2, 128, 2, 500.0, token=7)])
    d1 = recs[uuid_from_int(1)].destination_activated_ms - recs[uuid_from_int(1)].destination_reserved_ms
    d2 = recs[uuid_from_int(2)].destination_activated_ms - recs[uuid_from_int(2)].destination_reserved_ms
    assert d1 == pytest.approx(128.0) and d2 < d1


def test_disagg_busy_workers_defer_reservation_activation_and_release():
    """DIS-8/DIS-9/DIS-11: a busy decode worker queues the reservation without probing (it
    succeeds after the pass), a transfer that completes mid-pass activates at the pass end, and a
    release waits for the busy prefill worker's pass end."""
    unit = dict(speedup_ratio=1.0, decode_speedup_ratio=1.0)
    setup = _disagg(1, 1, prefill_kw=dict(unit, kv_transfer_bandwidth=1.0, kv_bytes_per_token=100_000),
                    decode_kw=unit)
    _, _, recs = _run(setup, [_req(1, 128, 50, 0.0), _req(2, 128, 3, 30.0)])
    r1, r2 = recs[uuid_from_int(1)], recs[uuid_from_int(2)]
    delay = 128 * 100_000 / 1e9 * 1000.0
    # request 1: decode idle -> reserved at the hold, activated when the transfer completes
    assert r1.destination_reserved_ms == r1.source_held_ms
    assert r1.destination_activated_ms == r1.destination_reserved_ms + delay
    # its release waits for the prefill pass of request 2 (busy prefill worker)
    assert r1.source_released_ms == r2.source_held_ms > r1.destination_activated_ms
    # request 2: decode busy -> reservation at a later pass end, activation deferred past the transfer
    assert r2.destination_reserved_ms > r2.source_held_ms
    assert r2.destination_activated_ms > r2.destination_reserved_ms + delay
    assert r2.decode_admit_ms == r2.destination_activated_ms


def test_disagg_prefill_rejection_fails_handoff_and_finishes_request():
    """DIS-7/DIS-12: a rejected prefill records ``rejected`` and the handoff cleans up."""
    setup = ReplaySetup(prefill_args=_staged("prefill", num_gpu_blocks=2), decode_args=_staged("decode"))
    _, _, recs = _run(setup, [_req(1, 1000, 2, 0.0), _req(2, 64, 2, 0.0)])
    assert recs[uuid_from_int(1)].terminal_status is TerminalStatus.REJECTED
    assert recs[uuid_from_int(2)].terminal_status is TerminalStatus.COMPLETED


# ---------------------------------------------------------------------------------------------
# DIS-4..DIS-7: the coordinator
# ---------------------------------------------------------------------------------------------

_TIMING = HandoffTransferTiming(KvTransferTimingMode.FULL_PROMPT, 100, 1000, 1.0)


def test_coordinator_source_first_success_path():
    """DIS-4..DIS-6: SubmitPrefill, ReserveDestination, StartTransfer(delay), Activate, Release, Complete."""
    c = new_coordinator(HandoffId("h"), HandoffOrder.SOURCE_FIRST)
    c, (a,) = c.start()
    assert a.kind is ActionKind.SUBMIT_PREFILL and c.start()[1] == ()
    c, _ = c.on_action_outcome(a.id, Outcome.SUBMITTED)
    c, (r,) = c.on_fact(SourceHeldFact(_TIMING))
    assert r.kind is ActionKind.RESERVE_DESTINATION
    c, _ = c.on_action_outcome(r.id, Outcome.ACCEPTED)
    c, (t,) = c.on_fact(DestinationReservedFact(64))
    assert t.kind is ActionKind.START_TRANSFER and t.delay_ms == pytest.approx(0.1)
    c, _ = c.on_action_outcome(t.id, Outcome.SCHEDULED)
    c, (act,) = c.on_fact(TransferCompletedFact())
    c, (rel,) = c.on_action_outcome(act.id, Outcome.APPLIED)
    assert rel.kind is ActionKind.RELEASE_SOURCE
    c, (done,) = c.on_action_outcome(rel.id, Outcome.NOOP)
    assert done.kind is ActionKind.COMPLETE and c.is_complete and c.completion.value == "success"


def test_coordinator_destination_first_and_cleanup():
    """DIS-4/DIS-7: SGLang order reserves first; a failure cancels every issued side, then completes."""
    c = new_coordinator(HandoffId("h"), HandoffOrder.DESTINATION_FIRST)
    c, (r,) = c.start()
    assert r.kind is ActionKind.RESERVE_DESTINATION
    c, _ = c.on_action_outcome(r.id, Outcome.ACCEPTED)
    c, (s,) = c.on_fact(DestinationReservedFact(64))
    assert s.kind is ActionKind.SUBMIT_PREFILL
    c, _ = c.on_action_outcome(s.id, Outcome.SUBMITTED)
    c, cancels = c.on_fact(FailedFact())
    assert [a.kind for a in cancels] == [ActionKind.CANCEL_SOURCE, ActionKind.CANCEL_DESTINATION]
    c, none = c.on_action_outcome(cancels[0].id, Outcome.APPLIED)
    assert none == ()
    c, (done,) = c.on_action_outcome(cancels[1].id, Outcome.NOOP)
    assert done.kind is ActionKind.COMPLETE and c.completion.value == "canceled"


def test_coordinator_rejects_out_of_order_facts_and_conflicting_outcomes():
    """DIS-5: a hold before submission is acknowledged, or two outcomes for one action, are errors."""
    c = new_coordinator(HandoffId("h"), HandoffOrder.SOURCE_FIRST)
    c, (a,) = c.start()
    with pytest.raises(InternalInvariantBroken, match="before prefill submission"):
        c.on_fact(SourceHeldFact(_TIMING))
    c, _ = c.on_action_outcome(a.id, Outcome.SUBMITTED)
    with pytest.raises(InternalInvariantBroken, match="conflicting outcome"):
        c.on_action_outcome(a.id, Failed("x"))


# ---------------------------------------------------------------------------------------------
# LIVE: livelocks where upstream spins forever, dead ends where it bails
# ---------------------------------------------------------------------------------------------


def _small_disagg(decode_blocks=2, **decode_kw):
    p = _args(num_gpu_blocks=64, block_size=16, worker_type="prefill")
    d = _args(num_gpu_blocks=decode_blocks, block_size=16, worker_type="decode", **decode_kw)
    return ReplaySetup(prefill_args=p, decode_args=d)


@pytest.mark.parametrize("n, expected", [(2, "ok"), (3, "ok"), (4, "ok"), (5, "dead:3"), (6, "livelock")])
def test_small_disagg_head_of_line_outcomes(n, expected):
    """LIVE-5 / DIS-15: ISL 16, OSL 2, decode N=2, 1 ms apart -- the outcomes checked against the
    compiled build: 2-4 complete, 5 is a dead end with 3 in flight, 6 spins (here: a livelock)."""
    wl = synthetic_replay_workload(16, 16, 2, n, 1.0)
    try:
        run_replay(_small_disagg(), wl)
        got = "ok"
    except ReplayDeadEnd as exc:
        assert str(exc) == f"offline disagg replay reached a dead end with {exc.in_flight} in-flight requests remaining"
        got = f"dead:{exc.in_flight}"
    except ReplayLivelock as exc:
        d = exc.diagnosis
        assert d.proven and d.stage == "decode" and d.cycle_passes == 1 and d.admitted
        got = "livelock"
    assert got == expected


def test_small_disagg_one_seq_dead_end_with_five_in_flight():
    """LIVE-5: the same 6-request run with decode max_num_seqs=1 ends in a dead end with 5 in flight."""
    with pytest.raises(ReplayDeadEnd) as exc:
        run_replay(_small_disagg(max_num_seqs=1), synthetic_replay_workload(16, 16, 2, 6, 1.0))
    assert exc.value.in_flight == 5


@pytest.mark.parametrize("workers", [1, 2])
def test_agg_sequence_outgrowing_pool_is_a_livelock(workers):
    """LIVE-5: aggregated N=3, B=16, ISL 32, OSL 40 spins upstream with 1 and 2 workers."""
    setup = ReplaySetup(engine_args=_args(num_gpu_blocks=3, block_size=16), num_workers=workers)
    with pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload((_req(1, 32, 40, 0.0),)))
    d = exc.value.diagnosis
    assert d.proven and d.runtime == ("single" if workers == 1 else "agg")
    assert d.admitted == (uuid_from_int(1),)


def test_livelock_diagnosis_counts_free_blocks_as_total_minus_active():
    """LIVE-3: the diagnosis reports the worker's free blocks as the CORE-6 metrics give them:
    total minus active. A running 32-token request on a 10-block pool of 16 holds at least its two
    prompt blocks, so free is below total, and the two readings must agree."""
    from model.protocol import DirectRequest, Submit
    from model.replay.livelock import diagnose

    core = C.new_core(_args(num_gpu_blocks=10, block_size=16))
    core, _ = C.apply_command(core, Submit(DirectRequest(tuple(range(32)), 4, uuid="r")))
    core, _ = C.execute_pass(core, 0.0)
    m = C.metrics(core)
    assert m.active_decode_blocks >= 2
    d = diagnose("single", "aggregated", 0, 0.0, core, 1, ())
    assert (d.total_blocks, d.free_blocks) == (10, 10 - m.active_decode_blocks)


def test_decode_pool_exact_fit_is_a_livelock():
    """LIVE-5: decode N=1, ISL 16 = B, OSL 2 spins upstream."""
    with pytest.raises(ReplayLivelock):
        run_replay(_small_disagg(decode_blocks=1), synthetic_replay_workload(16, 16, 2, 1, 1.0))


def test_pool_accounting_busy_and_in_flight():
    """DRV-4/DRV-6/DRV-7: receive counts in flight; a timed pass marks busy; its completion
    marks idle, subtracts completions and retries destinations."""
    from model.protocol import DirectRequest
    from model.replay.common import Pool

    pool = Pool("aggregated", _args(block_size=16, num_gpu_blocks=16), 2, visible=True)
    pool.workers[1].receive(DirectRequest((3,) * 16, 1, "r"))
    assert pool.in_flight() == 1 and pool.workers[1].is_ready() and not pool.workers[0].is_ready()
    eff = pool.drive_ready(0.0)
    assert eff.worker_idx == 1 and not eff.immediate and pool.workers[1].busy
    assert pool.drive_ready(0.0) is None
    assert pool.on_scheduled_completion(1, eff.result.completed_requests) == ()
    assert pool.in_flight() == 0 and pool.is_drained()


def test_pool_command_accounting_counts_what_each_result_adds_or_removes():
    """DRV-4: +1 on a submitted handoff prefill and on an accepted reservation, -1 on an applied
    destination cancel, and minus the requests an applied source cancel removed from the core.

    The drivers never cancel a source whose request is still in the core (DIS-7: every cleanup
    trigger comes after the prefill left it, so ``removed`` is 0 in a replay); the pool is driven
    directly here so the subtraction itself is checked: an unfinished prefill is cancelled before
    any pass, which removes one request and leaves the worker drained."""
    from model.protocol import (
        APPLIED,
        CancelDestination,
        CancelSource,
        DirectRequest,
        ReserveDestination,
        SubmitHandoffPrefill,
    )
    from model.replay.common import Pool

    prefill = Pool("prefill", _args(block_size=16, num_gpu_blocks=16, worker_type="prefill"), 1, visible=True)
    w = prefill.workers[0]
    prefill.apply_command(0, SubmitHandoffPrefill("h1", DirectRequest((5,) * 32, 1, "a")))
    prefill.apply_command(0, SubmitHandoffPrefill("h2", DirectRequest((6,) * 32, 1, "b")))
    assert w.in_flight == 2 and C.num_requests(w.core) == 2
    eff = prefill.apply_command(0, CancelSource("h1"))
    assert eff.result == APPLIED and w.in_flight == 1 and C.num_requests(w.core) == 1
    eff = prefill.apply_command(0, CancelSource("h2"))
    assert eff.result == APPLIED and w.in_flight == 0 and w.is_drained() and prefill.is_drained()

    decode = Pool("decode", _args(block_size=16, num_gpu_blocks=16, worker_type="decode"), 1, visible=True)
    decode.apply_command(0, ReserveDestination("h3", DirectRequest((7,) * 32, 1, "c")))
    assert decode.in_flight() == 1
    assert decode.apply_command(0, CancelDestination("h3")).result == APPLIED
    assert decode.in_flight() == 0 and decode.is_drained()


def test_s5_zero_progress_pass_bumps_the_generation_without_a_retry():
    """Upstream S5 (spec/model-checking.md §6), DRV-6 and DRV-7: a zero-time pass without progress
    is dropped, so nothing retries the pending head although the pass freed room for it.

    The core state is the one of the S5 row, derived by hand: a vLLM decode core with 3 blocks of
    4 tokens and a 4-token budget. P (12 tokens) runs its first chunk and holds 1 block; X (8
    tokens) reserves the 2 others; Z (4 tokens) waits pending. The next pass cannot allocate P's
    second chunk, so P preempts itself in the running loop and frees its block: no admission, no
    output, no event, nothing scheduled, end = now, yet the capacity generation is bumped.
    """
    from model.ids import hid
    from model.protocol import DestinationReserved, DirectRequest, ReserveDestination
    from model.replay.common import Pool

    decode = _args(block_size=4, num_gpu_blocks=3, max_num_batched_tokens=4, max_num_seqs=4,
                   enable_chunked_prefill=True, enable_prefix_caching=False, worker_type="decode")
    pool = Pool("decode", decode, 1, visible=True)
    w = pool.workers[0]
    w.receive(DirectRequest(tuple(range(12)), 2, "p"))
    first = pool.drive_ready(0.0)
    assert first is not None and first.result.admissions  # P's first chunk
    pool.on_scheduled_completion(0, first.result.completed_requests)  # DRV-7 (an immediate completion too)
    now = first.result.end_ms
    x = pool.apply_command(0, ReserveDestination("hx", DirectRequest(tuple(range(100, 108)), 2, "x")))
    assert [type(e) for e in x.lifecycle_events] == [DestinationReserved]
    z = pool.apply_command(0, ReserveDestination("hz", DirectRequest(tuple(range(200, 204)), 2, "z")))
    assert z.lifecycle_events == ()  # no free block: Z is the pending head
    generation = w.core.ledger.capacity_generation

    assert pool.drive_ready(now) is None  # the pass ran, made no progress and was dropped
    assert not w.busy
    assert [r.value for r in w.core.waiting] == ["p"] and not w.core.running  # P preempted itself
    assert w.core.ledger.capacity_generation == generation + 1
    assert w.core.ledger.pending_destinations.contains_handoff(hid("hz"))  # nobody retried
    # the retry a pass completion would have run reserves Z at once (RETRY-2)
    _, retry = C.retry_pending_destinations(w.core)
    assert [e.handoff_id for e in retry.lifecycle_events] == [hid("hz")]


def test_timed_cycle_detector_finds_the_period_with_one_saved_state():
    """LIVE-7 (Brent): after the LIVE-1 grace of quiet steps, a sequence that enters a cycle of
    period p is reported with exactly p steps and the simulated time between the two equal states;
    a reset forgets the saved state."""
    from model.replay import livelock as L

    for prefix, period in [(0, 1), (3, 3), (20, 5), (1, 13)]:
        det = L.TimedCycleDetector()
        seq = [("pre", i) for i in range(prefix)]
        step = 0
        found = None
        while found is None and step < 500:
            key = seq[step] if step < prefix else ("cyc", (step - prefix) % period)
            found = det.observe(lambda: key, 10.0 * step)
            step += 1
        assert found is not None and found[0] == period and found[1] == 10.0 * period
    det = L.TimedCycleDetector()
    for _ in range(2):  # the same grace again after a reset
        hits = [det.observe(lambda: "same", float(i)) for i in range(L.RECORD_AFTER + 1)]
        assert hits == [None] * L.RECORD_AFTER + [(1, 1.0)]
        det.reset()
    assert all(det.observe(lambda: i, float(i)) is None for i in range(500))  # never repeats


def test_timed_cycle_budget_reports_an_unproven_livelock(monkeypatch):
    """LIVE-7 with LIVE-4's budget: without a repeated state the run stops as a suspected livelock."""
    import itertools

    import model.replay.livelock as L
    import model.replay.single as S

    counter = itertools.count()
    monkeypatch.setattr(L, "STEP_BUDGET", 300)
    monkeypatch.setattr(S, "canonical_state", lambda core: next(counter))
    sg = _args(engine_type="sglang", num_gpu_blocks=64, block_size=16)
    with pytest.raises(ReplayLivelock) as exc:
        run_replay(ReplaySetup(engine_args=sg), FlatWorkload((_req(1, 32, 0, 0.0),)))
    d = exc.value.diagnosis
    assert not d.proven and d.period_ms is not None and str(exc.value).startswith("suspected livelock")


class _Deadline:
    """Fail a test that would spin forever if LIVE-7 stopped working (SIGALRM, main thread)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self):
        import signal

        def expired(*_):
            raise AssertionError(f"no livelock diagnosis within {self.seconds} s: the replay spins")

        self.old = signal.signal(signal.SIGALRM, expired)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)
        return False


def _zero_output_sglang(mode, workers=1):
    """An SGLang request with ``max_output_tokens`` 0 never completes, yet every decode step is
    charged the running list's decode time (SG-20, SG-27): the clock advances forever."""
    sg = dict(engine_type="sglang", num_gpu_blocks=64, block_size=16)
    if mode == "agg":
        setup = ReplaySetup(engine_args=_args(**sg), num_workers=workers)
    else:
        setup = ReplaySetup(prefill_args=_args(worker_type="prefill", **sg), decode_args=_args(worker_type="decode", **sg))
    reqs = [_req(1, 32, 4, 0.0), _req(2, 32, 0, 1.0)] + ([_req(3, 80, 0, 2.0)] if workers > 1 else [])
    with _Deadline(60), pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload(tuple(reqs)))
    return exc.value.diagnosis


@pytest.mark.parametrize("mode, workers, runtime", [("agg", 1, "single"), ("agg", 2, "agg"), ("disagg", 1, "disagg")])
def test_zero_output_sglang_request_is_a_timed_livelock(mode, workers, runtime):
    """LIVE-7 on each runtime (the compiled build hangs on all three: goldens zero-output-sglang-*).
    The 32-token request and the rest of the run are done; the zero-output request stays running;
    the state repeats with the clock advanced."""
    d = _zero_output_sglang(mode, workers)
    assert d.proven and d.runtime == runtime and d.cycle_passes >= 1 and d.period_ms > 0
    if workers == 1:  # one worker, one running request whose every pass is the same: period one step
        assert d.cycle_passes == 1
    assert uuid_from_int(2) in d.running or (workers > 1 and uuid_from_int(3) in d.running)
    assert d.stage == ("decode" if mode == "disagg" else "aggregated")
    assert "while the clock advances" in d.message()


def test_timed_livelock_with_several_pending_events_reports_the_lowest_worker():
    """LIVE-7, several pending events (disaggregated): two zero-output SGLang requests, routed
    round-robin to two decode workers, each run identical passes forever. Both workers' passes
    complete at each clock step, so no single event is pending; the state repeats after one step
    and the diagnosis names the lowest pending (stage, worker), decode worker 0, which runs the
    first request. Both requests stay in flight."""
    sg = dict(engine_type="sglang", num_gpu_blocks=64, block_size=16)
    setup = ReplaySetup(prefill_args=_args(worker_type="prefill", **sg), decode_args=_args(worker_type="decode", **sg),
                        num_decode_workers=2)
    with _Deadline(60), pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload((_req(1, 32, 0, 0.0), _req(2, 32, 0, 1.0))))
    d = exc.value.diagnosis
    assert d.proven and d.runtime == "disagg" and d.cycle_passes == 1 and d.period_ms > 0
    assert (d.stage, d.worker_idx, d.running) == ("decode", 0, (uuid_from_int(1),))
    assert "requests in flight: 2" in d.other


@pytest.mark.parametrize("mode, workers, runtime", [("agg", 1, "single"), ("agg", 2, "agg"), ("disagg", 1, "disagg")])
def test_recompute_loop_is_a_timed_livelock(mode, workers, runtime):
    """LIVE-7, second shape (goldens recompute-loop-vllm-*, on which the compiled build hangs). By
    hand: 2 blocks of 8 hold 16 tokens; the 8-token prompt with 9 output tokens needs 17, so after
    8 tokens the next token's block does not exist, the request preempts itself (VLLM-8) and is
    admitted again, recomputing its 16 tokens in two timed 8-token chunks, forever. The cycle
    admits it and emits nothing."""
    tight = dict(engine_type="vllm", block_size=8, num_gpu_blocks=2, max_num_batched_tokens=8, max_num_seqs=1,
                 enable_prefix_caching=False, enable_chunked_prefill=True)
    if mode == "agg":
        setup = ReplaySetup(engine_args=_args(**tight), num_workers=workers)
    else:
        setup = ReplaySetup(prefill_args=_args(**dict(tight, worker_type="prefill", num_gpu_blocks=16)),
                            decode_args=_args(**dict(tight, worker_type="decode")))
    reqs = (_req(1, 4, 1, 0.0), _req(2, 8, 9, 3.0))
    with _Deadline(60), pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload(reqs))
    d = exc.value.diagnosis
    assert d.proven and d.runtime == runtime
    if d.period_ms is not None:  # LIVE-7 (the disaggregated decode worker may loop at one time: LIVE-1)
        assert d.period_ms > 0 and uuid_from_int(2) in d.admitted


def test_livelock_names_the_transfer_completions_never_processed():
    """LIVE-3 (disaggregated): the transfers in flight when the loop starts are listed. By hand:
    64-token prompts with 1 MB per token at 0.001 GB/s take 64 s to transfer, far beyond the
    loop's start. Each reservation takes 4 blocks of 16 on the 32-block decode pool, so requests
    1-8 are reserved and transferring. Each held source keeps 5 blocks (64 prompt tokens and the
    first output token) of the 64-block prefill pool: 12 sources fill 60 blocks, and request 13,
    which needs 5, is admitted and preempts itself at one instant forever (LIVE-1), with 13-20
    waiting."""
    kw = dict(block_size=16, kv_bytes_per_token=1_000_000, kv_transfer_bandwidth=0.001)
    setup = ReplaySetup(prefill_args=_args(worker_type="prefill", num_gpu_blocks=64, **kw),
                        decode_args=_args(worker_type="decode", num_gpu_blocks=32, **kw))
    reqs = tuple(_req(i, 64, 8, 5.0 * (i - 1)) for i in range(1, 21))
    with _Deadline(60), pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload(reqs))
    d = exc.value.diagnosis
    assert d.proven and d.period_ms is None and (d.stage, d.worker_idx) == ("prefill", 0)
    assert d.waiting == tuple(uuid_from_int(i) for i in range(13, 21))
    assert d.other == ("requests in flight: 20",
                       "transfer completions never processed: " + ", ".join(uuid_from_int(i) for i in range(1, 9)))


def test_zero_output_sglang_request_stops_at_the_sim_time_cap():
    """DRV-18 before LIVE-7: with ``max_sim_time_ms`` the loop ends at the cap (golden
    zero-output-sglang-capped: the compiled build returns with one request completed)."""
    sg = _args(engine_type="sglang", num_gpu_blocks=64, block_size=16)
    reqs = (_req(1, 32, 4, 0.0), _req(2, 32, 0, 1.0))
    summary, _ = finish(run_replay(ReplaySetup(engine_args=sg, max_sim_time_ms=200.0), FlatWorkload(reqs)))
    assert summary["completed_requests"] == 1


@pytest.mark.parametrize("mode", ["single", "agg", "disagg"])
def test_budget_stops_a_timed_loop_with_an_arrival_far_ahead(monkeypatch, mode):
    """LIVE-4 with an arrival to come: a zero-output SGLang request loops with the clock advancing
    (LIVE-7's shape) while the last request arrives only at 10^12 ms, so no repeat may be taken as
    proof and, before the budget counted such steps, the run spun towards that arrival (the
    compiled build hangs: golden `zero-output-sglang-far-arrival`, odd-109-0240). Each runtime
    now stops as a suspected livelock that names the next arrival."""
    import model.replay.livelock as L

    monkeypatch.setattr(L, "STEP_BUDGET", 300)
    sg = dict(engine_type="sglang", num_gpu_blocks=64, block_size=16)
    if mode == "disagg":
        setup = ReplaySetup(prefill_args=_args(worker_type="prefill", **sg), decode_args=_args(worker_type="decode", **sg))
    else:
        setup = ReplaySetup(engine_args=_args(**sg), num_workers=1 if mode == "single" else 2)
    reqs = (_req(1, 32, 4, 0.0), _req(2, 32, 0, 1.0), _req(3, 16, 2, 1e12))
    with _Deadline(60), pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload(reqs))
    d = exc.value.diagnosis
    assert not d.proven and d.now_ms < 1e12
    assert str(exc.value).startswith("suspected livelock") and "next arrival at t=1000000000000.0 ms" in str(exc.value)


def test_step_budget_reports_unproven_livelock(monkeypatch):
    """LIVE-4: without a repeatable canonical form the budget stops the loop ("suspected")."""
    import itertools

    import model.replay.livelock as L
    import model.replay.single as S

    counter = itertools.count()
    monkeypatch.setattr(L, "STEP_BUDGET", 50)
    monkeypatch.setattr(S, "canonical_state", lambda core: next(counter))
    setup = ReplaySetup(engine_args=_args(num_gpu_blocks=3, block_size=16))
    with pytest.raises(ReplayLivelock) as exc:
        run_replay(setup, FlatWorkload((_req(1, 32, 40, 0.0),)))
    assert not exc.value.diagnosis.proven and str(exc.value).startswith("suspected livelock")


def test_canonical_state_ignores_counters_but_not_queues():
    """LIVE-2: the capacity generation, LRU ticks and preemption counters are abstracted;
    the queues are not."""
    core = C.new_core(_args(num_gpu_blocks=8, block_size=16))
    bumped = attrs.evolve(core, ledger=core.ledger.bump_generation(), preemptions_total=5)
    assert canonical_state(core) == canonical_state(bumped)
    from model.protocol import DirectRequest, Submit

    other, _ = C.apply_command(core, Submit(DirectRequest((1,) * 16, 2, "r")))
    assert canonical_state(core) != canonical_state(other)


def test_livelock_acceptance_cli_exits_4_quickly(tmp_path):
    """LIVE-1/LIVE-3: the reported 64/8/20 run (the compiled 1.3.0.post1 spins forever on it)
    exits 4 with a diagnosis in well under 5 s, and writes nothing."""
    summary = tmp_path / "summary.json"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mocker_spec.cli", "replay", "--input-tokens", "64", "--output-tokens", "8",
         "--num-requests", "20", "--arrival-interval-ms", "5",
         "--prefill-engine-args", '{"num_gpu_blocks":64,"block_size":16,"worker_type":"prefill"}',
         "--decode-engine-args", '{"num_gpu_blocks":32,"block_size":16,"worker_type":"decode"}',
         "--summary-json", str(summary)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 4, proc.stderr
    assert "livelock" in proc.stderr and "repeats the same zero-duration pass" in proc.stderr
    assert "requests in flight: 20" in proc.stderr
    assert not summary.exists()
    assert elapsed < 5.0


# ---------------------------------------------------------------------------------------------
# CLI: replay, diff, bad input
# ---------------------------------------------------------------------------------------------

CASE = GOLDENS / "case-1-035"


def _case_flags(case_dir):
    case = json.loads((case_dir / "case.json").read_text())
    return [str(case_dir / "trace.jsonl"), "--extra-engine-args", json.dumps(case["engine_args"]),
            "--num-workers", str(case["num_workers"]), "--trace-block-size", str(case["trace_block_size"])]


def test_cli_replay_writes_report_and_summary(tmp_path, capsys):
    rep, summ = tmp_path / "r.jsonl", tmp_path / "s.json"
    rc = cli.main(["replay", *_case_flags(CASE), "--report-jsonl", str(rep), "--summary-json", str(summ)])
    assert rc == 0
    rows = [json.loads(l) for l in rep.read_text().splitlines()]
    assert len(rows) == len((CASE / "expected.report.jsonl").read_text().splitlines())
    expected = json.loads((CASE / "expected.summary.json").read_text())
    got = json.loads(summ.read_text())
    assert got["completed_requests"] == expected["completed_requests"]
    assert got["duration_ms"] == expected["duration_ms"]
    assert "mocker-spec replay" in capsys.readouterr().out


def test_cli_engine_args_from_file(tmp_path):
    case = json.loads((CASE / "case.json").read_text())
    f = tmp_path / "args.json"
    f.write_text(json.dumps(case["engine_args"]))
    flags = _case_flags(CASE)
    flags[2] = str(f)
    assert cli.main(["replay", *flags]) == 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--extra-engine-args", '{"num_gpu_blocks": -1}'], "num_gpu_blocks"),
        (["--extra-engine-args", "{not json"], "--extra-engine-args"),
        (["--extra-engine-args", "/nonexistent/args.json"], "--extra-engine-args"),
        (["--router-mode", "kv_router", "--num-workers", "2"], "not supported yet"),
        (["--arrival-speedup-ratio", "0"], "--arrival-speedup-ratio"),
        (["--trace-block-size", "0"], "--trace-block-size"),
        (["--replay-concurrency", "0"], "--replay-concurrency"),
        (["--num-prefill-workers", "2"], "num_prefill_workers"),
        (["--prefill-engine-args", '{"worker_type":"prefill"}'], "--decode-engine-args"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, needle):
    rep, summ = tmp_path / "r.jsonl", tmp_path / "s.json"
    flags = [str(CASE / "trace.jsonl"), *argv, "--report-jsonl", str(rep), "--summary-json", str(summ)]
    assert cli.main(["replay", *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not rep.exists() and not summ.exists()
    assert list(tmp_path.iterdir()) == []


def test_cli_smallest_valid_numbers_are_accepted(tmp_path):
    """The other side of the refusals above: WL-5's "greater than 0" takes a trace block size of 1,
    and WL-20's cap takes 1 (a refusal of 1 passed every test before). The compiled build runs
    the same trace at block size 1 too, identical to the model (`mocker-spec diff` on it)."""
    t = tmp_path / "t.jsonl"
    t.write_text('{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [1, 2, 3]}\n')
    summ = tmp_path / "s.json"
    for extra in (["--trace-block-size", "1"], ["--replay-concurrency", "1"]):
        summ.unlink(missing_ok=True)
        argv = ["replay", str(t), "--trace-block-size", "1", *extra, "--summary-json", str(summ), "--no-progress"]
        assert cli.main(argv) == 0, extra
        assert json.loads(summ.read_text())["completed_requests"] == 1


def test_cli_bad_trace_row_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "hash_ids": [1]}\n')
    summ = tmp_path / "s.json"
    assert cli.main(["replay", str(bad), "--summary-json", str(summ)]) == 2
    assert "output_length" in capsys.readouterr().err
    assert not summ.exists()


def test_cli_dead_end_exits_3(tmp_path, capsys):
    t = tmp_path / "t.jsonl"
    t.write_text('{"timestamp": 0, "input_length": 16, "output_length": 0, "hash_ids": [1]}\n')
    assert cli.main(["replay", str(t), "--trace-block-size", "16", "--extra-engine-args", '{"block_size":16}']) == 3
    assert "dead end with 1 in-flight" in capsys.readouterr().err


def test_cli_replay_error_exits_1_and_writes_nothing(tmp_path, capsys):
    """TIME-14: bandwidth 0 passes ARGS-6 but fails the disaggregated replay as a whole with
    upstream's message (golden disagg-zero-transfer-bandwidth, recorded as that error): exit
    status 1, one error line, no report or summary."""
    case_dir = GOLDENS / "disagg-zero-transfer-bandwidth"
    case = json.loads((case_dir / "case.json").read_text())
    rep, summ = tmp_path / "r.jsonl", tmp_path / "s.json"
    argv = ["replay", str(case_dir / "trace.jsonl"), "--prefill-engine-args", json.dumps(case["prefill_engine_args"]),
            "--decode-engine-args", json.dumps(case["decode_engine_args"]),
            "--trace-block-size", str(case["trace_block_size"]), "--report-jsonl", str(rep), "--summary-json", str(summ),
            "--no-progress"]
    assert cli.main(argv) == 1
    expected = (case_dir / "expected.status").read_text().strip()
    assert expected == "error: invalid handoff transfer bandwidth 0"
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_cli_diff_corpus_goldens(capsys):
    rc = cli.main(["diff", "--corpus", str(GOLDENS)])
    out = capsys.readouterr().out
    n = len(case_dirs(GOLDENS))
    assert rc == 0 and f"{n}/{n} identical" in out


def test_cli_diff_reports_reference_hang_and_missing_wheel(monkeypatch, capsys):
    """The live diff runs the reference in a subprocess; a hang is reported as such."""
    import mocker_spec.reference as ref

    monkeypatch.setattr(ref, "_REFERENCE_SCRIPT", "import time\ntime.sleep(30)\n")
    out = ref.run_reference({"mode": "agg", "synthetic": {}}, timeout_s=0.5)
    assert out.status == "timeout" and "hangs" in out.message
    ours = ref.Outcome("livelock", "livelock: ...")
    assert ref.compare(ours, out) is None
    assert ref.compare(ref.Outcome("ok", "", {}, []), out).where == "status"


def test_a_reference_that_logs_while_it_hangs_is_drained_through_a_bounded_tail(monkeypatch):
    # gen-11-0036 (a hanging SGLang disagg case) made the wheel log ~60 MB/s of retract warnings;
    # buffering that whole stream filled the recorder's memory.  The child here writes 8 MiB of
    # log, then a crash line, then hangs: the run is a timeout and at most the 64 KiB tail is kept.
    import mocker_spec.reference as ref

    spew = ("import sys, time\nfor _ in range(128):\n    sys.stderr.write('w' * 65535 + '\\n')\n"
            "sys.stderr.write('panicked at the end\\n'); sys.stderr.flush()\n")
    timed_out, code, tail = ref.run_script(spew + "time.sleep(30)\n", {}, timeout_s=3)
    assert timed_out and code is None
    assert len(tail) <= 64 * 1024 and tail.endswith("panicked at the end\n")
    timed_out, code, tail = ref.run_script(spew + "sys.exit(3)\n", {}, timeout_s=30)
    assert not timed_out and code == 3 and tail.strip().splitlines()[-1] == "panicked at the end"
    monkeypatch.setattr(ref, "_REFERENCE_SCRIPT", spew + "sys.exit(3)\n")
    out = ref.run_reference({"mode": "agg", "synthetic": {}}, timeout_s=30)
    assert out.status == "error" and out.message == "the reference crashed: panicked at the end"


def test_a_reference_that_leaves_a_process_holding_its_log_open_does_not_hang_the_runner():
    # the child exits at once but leaves a grandchild (in its process group) holding stderr open;
    # the runner stops waiting for the end of the log 5 s later and kills the group
    import time

    import mocker_spec.reference as ref

    script = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "sys.stderr.write('parent done\\n')\n")
    t0 = time.monotonic()
    timed_out, code, tail = ref.run_script(script, {}, timeout_s=30)
    assert not timed_out and code == 0 and tail.strip() == "parent done"
    assert time.monotonic() - t0 < 20


def test_compare_skips_wall_clock_keys_and_uuids_and_matches_rows_by_content():
    """FID-2: the summary's wall-clock keys are never compared; FID-3: neither are uuids, and rows
    are paired by content, whatever order each side lists them in; FID-4: a model livelock agrees
    with a reference hang, and with nothing else."""
    from mocker_spec.reference import Outcome, WALL_CLOCK_KEYS, compare

    a = {"uuid": "x1", "arrival_time_ms": 0.0, "input_length": 4, "output_length": 2, "ttft_ms": 1.0}
    b = {"uuid": "x2", "arrival_time_ms": 5.0, "input_length": 8, "output_length": 1, "ttft_ms": 2.0}
    summary = {"completed_requests": 2, "wall_time_ms": 10.0}
    summary.update({k: 1.0 for k in WALL_CLOCK_KEYS})
    assert {"processed_tokens_per_s", "processed_output_tokens_per_s"} <= WALL_CLOCK_KEYS
    ours = Outcome("ok", "", summary, [a, b])
    theirs = Outcome("ok", "", dict({k: 99.0 for k in summary}, completed_requests=2),
                     [dict(b, uuid="y2"), dict(a, uuid="y1")])
    assert compare(ours, theirs) is None
    off = Outcome("ok", "", dict(theirs.summary, completed_requests=3), theirs.records)
    assert compare(ours, off).field == "completed_requests"
    hang = Outcome("timeout", "")
    assert compare(Outcome("livelock", "livelock: decode worker ..."), hang) is None
    assert compare(ours, hang).where == "status"
    assert compare(Outcome("livelock", "livelock"), Outcome("error", "dead end")).where == "status"


def test_compare_reports_first_divergent_field():
    from mocker_spec.reference import Outcome, compare

    row = {"uuid": "a", "arrival_time_ms": 0.0, "input_length": 4, "output_length": 2, "ttft_ms": 1.0}
    div = compare(Outcome("ok", "", {}, [dict(row, ttft_ms=1.5)]), Outcome("ok", "", {}, [dict(row, uuid="b")]))
    assert div.where == "record" and div.field == "ttft_ms" and div.ours == 1.5 and div.reference == 1.0
    assert compare(Outcome("ok", "", {}, [dict(row, ttft_ms=1.0 + 1e-15)]), Outcome("ok", "", {}, [row])) is None
    # the line diff prints: the request by its arrival and lengths, then the field and both values
    assert div.describe() == ("first divergence: request arriving at 0.0 ms (input 4, output 2), "
                              "field ttft_ms: model 1.5, reference 1.0")


# the compiled build's texts (recorded from 1.3.0.post1, see spec/fidelity.md FID-10)
_RANGE = ('Failed to normalize MockEngineArgs: Failed to validate MockEngineArgs: max_num_seqs: Validation '
          'error: range [{"min": Number(1), "value": Number(0)}]')
_CROSS = ('Failed to normalize MockEngineArgs: Failed to validate MockEngineArgs: __all__: engine_type=sglang '
          'requires block_size and sglang.page_size to match when both are set, got block_size=8 and '
          'sglang.page_size=4')


@pytest.mark.parametrize("message, named", [
    (_RANGE, "max_num_seqs"),
    ("the reference crashed: Exception: " + _RANGE, "max_num_seqs"),  # recorded before FID-10
    (_CROSS, "__all__"),
    ("argument 'num_gpu_blocks': 'float' object cannot be interpreted as an integer", "num_gpu_blocks"),
    ("MockEngineArgs.__new__() got an unexpected keyword argument 'foo_bar'", "foo_bar"),
    ("engine_type must be one of 'vllm', 'sglang', or 'trtllm', got 'foo'", "engine_type"),
    ("can't convert negative int to unsigned", ""),
    ("Failed to parse MockEngineArgs JSON: max_num_seqs: invalid type: boolean `true`, expected usize at line 1 "
     "column 62", "max_num_seqs"),  # the JSON dialect (a CLI job, DRV-19)
    # the JSON dialect's validator texts (recorded from 1.3.0.post1 with a CLI job's prefill args)
    ('Failed to parse MockEngineArgs JSON: Failed to validate MockEngineArgs: num_gpu_blocks: Validation error: '
     'range [{"value": Number(0), "min": Number(1)}]', "num_gpu_blocks"),
    (_CROSS.replace("Failed to normalize", "Failed to parse", 1).replace("MockEngineArgs:", "MockEngineArgs JSON:", 1),
     "__all__"),
    # ... its paths into nested objects (by member, or by index in the sequence form) and its
    # enumeration texts, one of which names no argument
    ('Failed to parse MockEngineArgs JSON: sglang.max_prefill_tokens: invalid type: string "x", expected usize '
     'at line 1 column 120', "max_prefill_tokens"),
    ('Failed to parse MockEngineArgs JSON: sglang[1]: invalid type: string "x", expected usize at line 1 '
     'column 88', "sglang[1]"),
    ("Failed to parse MockEngineArgs JSON: sglang: trailing characters at line 1 column 109", "sglang"),
    ("Failed to parse MockEngineArgs JSON: Invalid engine_type 'foo'. Must be 'vllm', 'sglang', or 'trtllm'.",
     "engine_type"),
    ("Failed to parse MockEngineArgs JSON: Invalid preemption_mode: 'x'. Must be 'lifo' or 'fifo'.",
     "preemption_mode"),
    ('Failed to parse MockEngineArgs JSON: unknown queue policy: "X", expected \'fcfs\', \'lcfs\', or \'wspt\'',
     "router_queue_policy"),
    ("worker_type must be one of 'aggregated', 'prefill', or 'decode', got 'AGGREGATED'", "worker_type"),
    ("preemption_mode must be either 'lifo' or 'fifo', got 'FIFO'", "preemption_mode"),
    ("Invalid kv_transfer_timing_mode 'X'. Must be 'full_prompt' or 'destination_missing'.",
     "kv_transfer_timing_mode"),
    ('invalid router_queue_policy "X": unknown queue policy: "X", expected \'fcfs\', \'lcfs\', or \'wspt\'',
     "router_queue_policy"),
    # PyO3's own texts: integer conversions that name no argument, a nested constructor's missing
    # members (the first is named), the constructor's load of a profile file; the JSON dialect's
    # null and missing-member texts (all recorded from 1.3.0.post1)
    ("out of range integral type conversion attempted", ""),
    ("Python int too large to convert to C long", ""),
    ("ReasoningConfig.__new__() missing 2 required positional arguments: 'end_thinking_token_id' and "
     "'thinking_ratio'", "end_thinking_token_id"),
    ('Failed to load planner_profile_data from "missing.npz": Failed to open NPZ file: "missing.npz"',
     "planner_profile_data"),
    ("Failed to parse MockEngineArgs JSON: dp_size must not be null", "dp_size"),
    ("Failed to parse MockEngineArgs JSON: reasoning: missing field `end_thinking_token_id` at line 1 column 44",
     "end_thinking_token_id"),
    ("offline replay reached a dead end with 1 in-flight requests remaining", None),
    ("invalid handoff transfer bandwidth 0", None),
])
def test_refused_argument_reads_the_reference_refusals(message, named):
    from mocker_spec.reference import refused_argument

    assert refused_argument(message) == named


def test_a_refusal_agrees_only_with_a_model_refusal_of_the_same_argument():
    """FID-10: texts differ, the refused argument must not."""
    from mocker_spec.reference import Outcome, compare

    ref = Outcome("error", _RANGE)
    ours = lambda field: Outcome("error", "must be >= 1 (null means unlimited)", refused=field)  # noqa: E731
    assert compare(ours("engine_args.max_num_seqs"), ref) is None
    assert compare(ours("decode_engine_args.max_num_seqs"), ref) is None
    assert compare(ours("engine_args.num_gpu_blocks"), ref).where == "status"
    assert compare(ours("max_num_seqs"), ref).where == "status"  # not an engine-args field
    assert compare(Outcome("error", "must be >= 1 (null means unlimited)"), ref).where == "status"
    cross = Outcome("error", _CROSS)
    assert compare(ours("engine_args.sglang.page_size"), cross) is None
    assert compare(ours("engine_args.sglang.chunked_prefill_size"), cross).where == "status"
    # integer conversions that name no argument agree with a model refusal of an integer that
    # does not fit: below 0 or above u16 (a u16 or u32 parameter), or not even an i64
    for text, fits, does_not in (("out of range integral type conversion attempted", 5, [-1, 70000]),
                                 ("Python int too large to convert to C long", 70000, [2**64]),
                                 ("int too big to convert", 2**63, [2**64])):
        refused = lambda v: Outcome("error", "invalid value", refused="engine_args.dp_size", refused_value=v)  # noqa: E731
        assert compare(refused(fits), Outcome("error", text)).where == "status", text
        assert all(compare(refused(v), Outcome("error", text)) is None for v in does_not), text
    # an upstream assertion the model mirrors (KV-1): the panic's text must be the model's reason
    panic = Outcome("error", "the reference crashed: pyo3_runtime.PanicException: block_size must be a power of "
                             "2, got 12")
    mirrored = lambda reason: Outcome("error", reason, refused="block_size", refused_value=12)  # noqa: E731
    assert compare(mirrored("block_size must be a power of 2, got 12"), panic) is None
    assert compare(mirrored("block_size must be a power of 2, got 24"), panic).where == "status"
    negative = Outcome("error", "can't convert negative int to unsigned")  # names no argument
    assert compare(Outcome("error", "must be a non-negative integer", refused="num_workers", refused_value=-1),
                   negative) is None
    assert compare(Outcome("error", "x", refused="engine_args.max_num_seqs", refused_value=-1), negative) is None
    assert compare(ours("engine_args.max_num_seqs"), negative).where == "status"  # the model's value was not negative
    dead_end = Outcome("error", "offline replay reached a dead end with 1 in-flight requests remaining")
    assert compare(ours("engine_args.max_num_seqs"), dead_end).where == "status"
    # trace refusals quote the recording's path: compared by line (loadgen/trace.rs:193-197, 303-305)
    line2 = Outcome("error", "failed to parse line 2 from /elsewhere/trace.jsonl as JSON")
    assert compare(Outcome("error", "invalid value", refused="trace line 2: output_length"), line2) is None
    assert compare(Outcome("error", "invalid value", refused="trace line 3: output_length"), line2).where == "status"
    empty = Outcome("error", "trace file /elsewhere/trace.jsonl did not contain any requests")
    assert compare(Outcome("error", "trace file did not contain any requests", refused="trace"), empty) is None
    # a panic of a validator names the field it refused (golden args-refused-vllm-block-size-one)
    panic = Outcome("error", 'the reference crashed: pyo3_runtime.PanicException: invalid ActiveSequence: '
                             'ValidationErrors({"block_size": Field([ValidationError { code: "range" }])})')
    assert compare(Outcome("error", "the vLLM sequence needs block_size >= 2", refused="block_size"), panic) is None
    assert compare(ours("engine_args.max_num_seqs"), panic).where == "status"
    assert compare(Outcome("error", "the vLLM sequence needs block_size >= 2"), panic).where == "status"
    # several bad engine arguments: the build lists them all, one per line, in an order that
    # changes between runs (recorded from 1.3.0.post1 with num_gpu_blocks 0 and max_num_seqs 0)
    both = Outcome("error", 'Failed to normalize MockEngineArgs: Failed to validate MockEngineArgs: num_gpu_blocks: '
                            'Validation error: range [{"value": Number(0), "min": Number(1)}]\nmax_num_seqs: Validation '
                            'error: range [{"min": Number(1), "value": Number(0)}]')
    assert compare(ours("engine_args.num_gpu_blocks"), both) is None
    assert compare(ours("engine_args.max_num_seqs"), both) is None
    assert compare(ours("engine_args.max_num_batched_tokens"), both).where == "status"
    # FID-11: the build lists one more trace format; the refused value is compared (golden
    # args-order-format-before-cap holds the recorded text)
    fmt = Outcome("error", "trace_format must be 'mooncake', 'mooncake-delta', 'agentic_mooncake'/'agentic-mooncake', "
                           "'applied_compute_agentic', or 'dynamo', got 'csv'")
    assert compare(Outcome("error", "x", refused="trace_format", refused_value="csv"), fmt) is None
    assert compare(Outcome("error", "x", refused="trace_format", refused_value="tsv"), fmt).where == "status"
    assert compare(Outcome("error", "x", refused="router_mode", refused_value="csv"), fmt).where == "status"


# the binding's conversion texts, recorded from 1.3.0.post1 (run_mocker_trace_replay called with
# each value; spec/replay.md DRV-19)
@pytest.mark.parametrize("name, value, expected", [
    ("num_workers", True, 1),
    ("num_workers", False, 0),
    ("num_workers", 3, 3),
    ("num_workers", 2.0, "argument 'num_workers': 'float' object cannot be interpreted as an integer"),
    ("num_workers", "2", "argument 'num_workers': 'str' object cannot be interpreted as an integer"),
    ("num_workers", None, "argument 'num_workers': 'NoneType' object cannot be interpreted as an integer"),
    ("num_workers", [1], "argument 'num_workers': 'list' object cannot be interpreted as an integer"),
    ("num_workers", -1, "can't convert negative int to unsigned"),
    ("num_workers", 2**64, "int too big to convert"),
    ("trace_block_size", 2**64 - 1, 2**64 - 1),
    ("replay_concurrency", -1, -1),  # isize: the range check comes later (DRV-1)
    ("replay_concurrency", 2**63, "Python int too large to convert to C long"),
    ("replay_concurrency", 2.5, "argument 'replay_concurrency': 'float' object cannot be interpreted as an integer"),
    ("arrival_speedup_ratio", True, 1.0),
    ("arrival_speedup_ratio", 2, 2.0),
    ("arrival_speedup_ratio", "x", "argument 'arrival_speedup_ratio': must be real number, not str"),
    ("arrival_speedup_ratio", None, "argument 'arrival_speedup_ratio': must be real number, not NoneType"),
    ("arrival_speedup_ratio", 2**1100, "int too large to convert to float"),
    ("sla_ttft_ms", "x", "argument 'sla_ttft_ms': must be real number, not str"),
    ("router_mode", 5, "argument 'router_mode': 'int' object cannot be converted to 'PyString'"),
    ("trace_format", None, "argument 'trace_format': 'NoneType' object cannot be converted to 'PyString'"),
])
def test_binding_value_converts_as_pyo3_does(name, value, expected):
    """DRV-19: a boolean is an integer, an integer is a float; anything else is refused with the
    binding's text, the argument named."""
    from mocker_spec.reference import binding_value

    if isinstance(expected, str):
        with pytest.raises(InvalidInput) as exc:
            binding_value(name, value)
        assert (exc.value.field, exc.value.reason, exc.value.rule) == (name, expected, "DRV-19")
    else:
        got = binding_value(name, value)
        assert got == expected and type(got) is type(expected)


def test_binding_arguments_pass_what_the_corpus_runner_passes():
    """DRV-19: a case passes its mode's worker counts only and a cap only when truthy; a CLI job
    passes every count; the first argument that does not convert is the error."""
    from mocker_spec.reference import binding_arguments, setup_from_job

    agg = {"mode": "agg", "engine_args": {"block_size": 16}, "num_workers": True, "num_prefill_workers": 2,
           "replay_concurrency": 0, "trace_file": "t.jsonl", "trace_block_size": None}
    a = binding_arguments(agg)
    assert a == {"num_workers": 1, "router_mode": "round_robin", "arrival_speedup_ratio": 1.0}
    check_setup(setup_from_job(agg))  # num_prefill_workers is not passed in agg mode
    with pytest.raises(InvalidInput) as exc:
        check_setup(setup_from_job(dict(agg, from_cli=True)))  # the CLI passes it: DRV-1 refuses
    assert exc.value.field == "num_prefill_workers"
    assert setup_from_job(dict(agg, replay_concurrency=False)).replay_concurrency is None
    assert setup_from_job(dict(agg, replay_concurrency=True)).replay_concurrency == 1
    disagg = {"mode": "disagg", "num_workers": "ignored", "num_prefill_workers": True, "num_decode_workers": 2,
              "prefill_engine_args": {"block_size": 16, "worker_type": "prefill"},
              "decode_engine_args": {"block_size": 16, "worker_type": "decode"}, "trace_file": "t.jsonl"}
    s = setup_from_job(disagg)
    assert (s.num_workers, s.num_prefill_workers, s.num_decode_workers) == (1, 1, 2)
    with pytest.raises(InvalidInput) as exc:  # the runners would take it for disagg and fail
        setup_from_job(dict(agg, mode="aggregated"))
    assert exc.value.field == "mode"
    with pytest.raises(InvalidInput) as exc:  # num_workers comes before router_mode in the binding
        binding_arguments(dict(agg, num_workers=1.5, router_mode=None))
    assert exc.value.field == "num_workers"
    synthetic = {"mode": "agg", "synthetic": {"input_tokens": True, "output_tokens": 2, "request_count": 2,
                                              "inter_turn_delay_ms": 3}}
    assert binding_arguments(synthetic) == {"input_tokens": 1, "output_tokens": 2, "request_count": 2,
                                            "num_workers": 1, "router_mode": "round_robin",
                                            "arrival_speedup_ratio": 1.0, "arrival_interval_ms": 1.0,
                                            "inter_turn_delay_ms": 3.0}


def test_case_engine_args_are_constructor_keywords_and_cli_engine_args_json():
    """ARGS-13, DRV-19: a case's engine args are ``MockEngineArgs(**kwargs)`` (a boolean count is
    accepted, enumerations are case-sensitive); the CLI's are ``--extra-engine-args`` JSON."""
    from mocker_spec.reference import setup_from_job

    case = {"mode": "agg", "engine_args": {"block_size": 16, "max_num_seqs": True}, "trace_file": "t.jsonl"}
    assert setup_from_job(case).engine_args.max_num_seqs == 1
    with pytest.raises(InvalidInput) as exc:
        setup_from_job(dict(case, from_cli=True))
    assert exc.value.field == "engine_args.max_num_seqs"
    upper = {"mode": "agg", "engine_args": {"block_size": 16, "worker_type": "AGGREGATED"}, "trace_file": "t.jsonl"}
    with pytest.raises(InvalidInput) as exc:
        setup_from_job(upper)
    assert exc.value.field == "engine_args.worker_type"
    assert setup_from_job(dict(upper, from_cli=True)).engine_args.worker_type.value == "aggregated"


# ---------------------------------------------------------------------------------------------
# seeded fresh cases (mocker_spec/casegen.py; spec/fidelity.md) and the hangs they found
# ---------------------------------------------------------------------------------------------


def test_casegen_family_1_covers_the_fidelity_matrix_with_valid_setups():
    """The 220 cases of spec/fidelity.md: every engine/runtime kind and worker count, and only
    setups that pass DRV-1 (equal block sizes across the pools) and ARGS-9 (SGLang chunk sizes
    divisible by the block size), so no case is spent on a validation error."""
    from mocker_spec.casegen import KINDS, generate_case
    from mocker_spec.reference import setup_from_job

    kinds, agg_workers, pools, features = set(), set(), set(), set()
    for i in range(220):
        case, rows = generate_case(1, i)
        assert generate_case(1, i) == (case, rows)  # a pure function of (seed, index)
        args = [case["engine_args"]] if case["mode"] == "agg" else [case["prefill_engine_args"], case["decode_engine_args"]]
        kinds.add((case["mode"], args[0]["engine_type"]))
        if case["mode"] == "agg":
            agg_workers.add(case["num_workers"])
        else:
            pools.add((case["num_prefill_workers"], case["num_decode_workers"]))
            assert args[0]["block_size"] == args[1]["block_size"]
        check_setup(setup_from_job(case))
        longest = max(r["input_length"] for r in rows)
        for a in args:
            sg = a.get("sglang") or {}
            if "chunked_prefill_size" in sg:
                assert sg["chunked_prefill_size"] % a["block_size"] == 0
                if sg["chunked_prefill_size"] < longest:
                    features.add("sglang chunks")
            if sg.get("schedule_policy") == "lpm":
                features.add("lpm")
            if a["engine_type"] != "sglang" and a.get("max_num_batched_tokens", 8192) < longest:
                features.add("vllm chunks")
            if a["num_gpu_blocks"] <= 3 * -(-longest // a["block_size"]):
                features.add("tight kv")
        if len({tuple(r["hash_ids"][:1]) for r in rows}) < len(rows):
            features.add("prefix sharing")
        if case.get("arrival_speedup_ratio", 1.0) != 1.0:
            features.add("arrival speed-up")
    assert kinds == set(KINDS)
    assert agg_workers == {1, 2, 3}
    assert pools == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert features == {"sglang chunks", "lpm", "vllm chunks", "tight kv", "prefix sharing", "arrival speed-up"}


def test_generated_goldens_regenerate_byte_for_byte_from_their_family_and_index(tmp_path):
    """Every committed golden drawn by ``gen-cases`` (a ``gen*-S-IIII`` name: the variant letters,
    the family ``S``, the index ``IIII``) is rewritten byte for byte by ``write_cases`` today, and
    every variant letter occurs: the generator still draws the cases that spec/fidelity.md's
    families were measured on (each case a pure function of the seed, the index and the flags),
    so a changed draw anywhere in mocker_spec/casegen.py cannot pass unnoticed."""
    import re

    from mocker_spec.casegen import write_cases

    flags = {"c": "concurrency", "x": "extra_args", "s": "sessions", "l": "large", "t": "tiny", "p": "tight"}
    letters = set()
    dirs = [d for root in (GOLDENS, ROOT / "tests" / "goldens" / "divergent") for d in sorted(root.iterdir())]
    checked = 0
    for d in dirs:
        m = re.search(r"(?:^|-)gen([cxsltp]*)-(\d+)-(\d{4})$", d.name)
        if m is None:
            continue
        variant, seed, index = m.group(1), int(m.group(2)), int(m.group(3))
        kw = {flags[ch]: True for ch in variant}
        (out,) = write_cases(tmp_path / d.name, seed, 1, index, **kw)
        assert out.name == d.name[d.name.index("gen" + variant + "-"):]
        for name in ("case.json", "trace.jsonl"):
            assert (out / name).read_bytes() == (d / name).read_bytes(), (d.name, name)
        letters |= set(variant)
        checked += 1
    assert letters == set(flags) and checked >= 10


def test_casegen_concurrency_variant_keeps_the_base_case_and_draws_caps_and_orders():
    """``gen-cases --concurrency`` (spec/replay.md WL-20): each case is the plain case of the same
    index with, from a stream of its own, a cap of 1-8 and sometimes its rows shuffled; the plain
    family is unchanged, and both draws occur."""
    from mocker_spec.casegen import generate_case

    capped = shuffled = 0
    for i in range(60):
        base, base_rows = generate_case(41, i)
        case, rows = generate_case(41, i, concurrency=True)
        assert generate_case(41, i, concurrency=True) == (case, rows)
        assert "replay_concurrency" not in base
        cap = case.pop("replay_concurrency", None)
        assert case == base and sorted(map(json.dumps, rows)) == sorted(map(json.dumps, base_rows))
        capped += cap is not None
        assert cap is None or 1 <= cap <= 8
        shuffled += rows != base_rows
    assert 25 <= capped <= 55 and shuffled >= 5


def test_casegen_extra_args_variant_adds_only_valid_defaults_overrides():
    """``gen-cases --extra-args``: the plain case of the same index plus, per engine-args object,
    some of the arguments the plain cases leave at their defaults; every setup still passes the
    model's checks (ARGS-*, DRV-1), and each argument is drawn somewhere in 60 cases."""
    from mocker_spec.casegen import generate_case
    from mocker_spec.reference import setup_from_job

    extra = {"startup_time", "aic_tp_size", "aic_attention_dp_size", "kv_bytes_per_token",
             "kv_transfer_bandwidth", "kv_transfer_timing_mode", "router_queue_policy"}
    seen = set()
    for i in range(60):
        base, base_rows = generate_case(43, i)
        case, rows = generate_case(43, i, extra_args=True)
        assert rows == base_rows and case.keys() == base.keys()
        for key in ("engine_args", "prefill_engine_args", "decode_engine_args"):
            if key in case:
                added = set(case[key]) - set(base[key])
                assert added <= extra and {k: case[key][k] for k in base[key]} == base[key]
                seen |= added
        check_setup(setup_from_job(case))
    assert seen == extra


def test_casegen_sessions_variant_groups_rows_into_valid_multi_turn_sessions():
    """``gen-cases --sessions`` (spec/replay.md DRV-17): the plain case's rows, each given a session;
    some later turns trade their timestamp for a delay; every trace loads, and the family has
    multi-turn sessions on both paths (timestamps and delays)."""
    from mocker_spec.casegen import generate_case
    from model.workload import SessionWorkload, load_trace_workload

    multi = delays = 0
    for i in range(40):
        base, base_rows = generate_case(47, i)
        case, rows = generate_case(47, i, sessions=True)
        assert case == base and len(rows) == len(base_rows)
        for a, b in zip(rows, base_rows):
            assert {k: v for k, v in a.items() if k not in ("session_id", "delay", "timestamp")} == \
                {k: v for k, v in b.items() if k != "timestamp"}
        w = load_trace_workload(list(enumerate(rows, start=1)), case["trace_block_size"],
                                case.get("arrival_speedup_ratio", 1.0))
        multi += isinstance(w, SessionWorkload)
        delays += any("delay" in r for r in rows)
    assert multi >= 20 and delays >= 5


def test_casegen_large_variant_grows_traces_and_worker_counts_with_valid_setups():
    """``gen-cases --large``: the plain case's rows plus those of other cases of the family, later
    and in time order; every pool holds the longest prompt; more workers; every setup valid."""
    from mocker_spec.casegen import generate_case
    from mocker_spec.reference import setup_from_job

    sizes, workers = [], set()
    for i in range(30):
        base, base_rows = generate_case(61, i)
        case, rows = generate_case(61, i, large=True)
        assert len(rows) > len(base_rows) and all(r in rows for r in base_rows)
        assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
        longest = max(r["input_length"] for r in rows)
        for key in ("engine_args", "prefill_engine_args", "decode_engine_args"):
            if key in case:
                assert case[key]["num_gpu_blocks"] * case[key]["block_size"] >= longest
        workers.add(case.get("num_workers", 0))
        sizes.append(len(rows))
        check_setup(setup_from_job(case))
    assert min(sizes) >= 40 and max(sizes) >= 150 and max(workers) >= 6


def test_casegen_large_variant_grows_a_pool_exactly_to_the_longest_prompt():
    """A pool the appended rows outgrow gets the longest prompt's blocks plus one, and a pool that
    already holds it keeps its size.  Growth is rare (the plain pools are roomy), so this searches
    three large families for it; keeping the pools as they were passed every other test."""
    from mocker_spec.casegen import generate_case

    grown = 0
    for seed in (61, 193, 271):
        for i in range(60):
            base, _ = generate_case(seed, i)
            case, rows = generate_case(seed, i, large=True)
            longest = max(r["input_length"] for r in rows)
            for key in ("engine_args", "prefill_engine_args", "decode_engine_args"):
                if key in case:
                    before, bs = base[key]["num_gpu_blocks"], base[key]["block_size"]
                    need = -(-longest // bs) + 1
                    assert case[key]["num_gpu_blocks"] == max(before, need)
                    grown += need > before
    assert grown >= 2


def test_casegen_tiny_variant_draws_valid_edge_cases():
    """``gen-cases --tiny``: a case of its own per index (not the plain one), on pools of 1-8
    blocks with 1-4 requests, zero-output rows and prompts that outgrow the pool among them; every
    kind and valid setups only; it cannot be combined with ``--large``."""
    from mocker_spec.casegen import KINDS, generate_case
    from mocker_spec.reference import setup_from_job

    kinds, zero_output, too_long = set(), 0, 0
    for i in range(80):
        case, rows = generate_case(97, i, tiny=True)
        assert generate_case(97, i, tiny=True) == (case, rows) and (case, rows) != generate_case(97, i)
        assert 1 <= len(rows) <= 4
        args = [case["engine_args"]] if case["mode"] == "agg" else [case["prefill_engine_args"], case["decode_engine_args"]]
        kinds.add((case["mode"], args[0]["engine_type"]))
        assert all(1 <= a["num_gpu_blocks"] <= 8 for a in args)
        zero_output += any(r["output_length"] == 0 for r in rows)
        too_long += any(r["input_length"] > a["num_gpu_blocks"] * a["block_size"] for r in rows for a in args)
        check_setup(setup_from_job(case))
    assert kinds == set(KINDS) and zero_output >= 10 and too_long >= 10
    with pytest.raises(ValueError):
        generate_case(97, 0, large=True, tiny=True)


def test_casegen_tight_variant_cuts_every_pool_to_its_largest_request():
    """``gen-cases --tight``: the plain case of the same index with the same rows, each pool cut to
    what the largest request needs on it (prompt and output on an aggregated or decode worker, the
    prompt on a prefill worker) and at most half as much again; sequence and budget limits drawn on
    some pools; every kind; it cannot be combined with ``--tiny``."""
    from mocker_spec.casegen import KINDS, generate_case
    from mocker_spec.reference import setup_from_job

    kinds, exact, limited = set(), 0, 0
    for i in range(80):
        plain_case, plain_rows = generate_case(811, i)
        case, rows = generate_case(811, i, tight=True)
        assert generate_case(811, i, tight=True) == (case, rows) and rows == plain_rows
        sides = [("engine_args", True)] if case["mode"] == "agg" else [("prefill_engine_args", False),
                                                                      ("decode_engine_args", True)]
        for key, with_output in sides:
            a = case[key]
            need = max(-(-(r["input_length"] + (r["output_length"] if with_output else 0)) // a["block_size"])
                       for r in rows)
            assert need <= a["num_gpu_blocks"] <= max(1, need + need // 2 + 5)
            exact += a["num_gpu_blocks"] == need
            limited += a.get("max_num_seqs") != plain_case[key].get("max_num_seqs")
            if a.get("enable_chunked_prefill") is False:  # no budget below what it had
                assert a.get("max_num_batched_tokens") == plain_case[key].get("max_num_batched_tokens")
            assert {k: v for k, v in a.items() if k not in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")} \
                == {k: v for k, v in plain_case[key].items() if k not in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")}
        kinds.add((case["mode"], case[sides[0][0]]["engine_type"]))
        check_setup(setup_from_job(case))
    assert kinds == set(KINDS) and exact >= 5 and limited >= 20
    with pytest.raises(ValueError):
        generate_case(811, 0, tiny=True, tight=True)


@pytest.mark.parametrize("case, stage", [("gen-1-0136", "decode"), ("gen-1-0156", "prefill")])
def test_fresh_reference_hangs_are_diagnosed_on_the_right_pool(case, stage):
    """LIVE-5, FID-4, FID-8: the compiled build hangs on both (recorded as timeout). SGLang variant
    on the decode pool (a lone running request cannot reserve its next token slot, the snapshot
    still counts it as scheduled); vLLM on the prefill pool (a request admits itself and preempts
    itself back)."""
    from mocker_spec.reference import load_case, run_model

    job, ref = load_case(GOLDENS / case)
    assert ref.status == "timeout"
    ours = run_model(job)
    assert ours.status == "livelock"
    assert ours.message.startswith(f"livelock: {stage} worker"), ours.message.splitlines()[0]
    # LIVE-3 through the CORE-6 observers: the SGLang loop is one running request (listed); the
    # vLLM loop's request is back in waiting at the end of the pass, with nothing running
    lines = dict(line.strip().split(": ", 1) for line in ours.message.splitlines()[1:] if ": " in line)
    if stage == "decode":
        assert lines["running"] != "-" and lines["waiting"] == "-"
    else:
        assert lines["running"] == "-" and lines["waiting"] != "-"


DIVERGENT = ROOT / "tests" / "goldens" / "divergent"


#: FID-7: case -> {input_length: (model reuse, recorded reference reuse)} of the one request whose
#: re-admission reuse differs (the one preempted by its own partially allocated prefill chunk)
#: per FID-7 golden: the report field that shows the difference (the aggregated or prefill worker's
#: reuse, or the decode worker's) and, by input length, the one request's reuse (model, reference)
FID7_CASES = {
    "fid-7-partial-chunk-preemption": ("reused_input_tokens", {588: (576, 544)}),
    "fid-7-minimal": ("reused_input_tokens", {64: (60, 40)}),
    "fid-7-gen-113-0139": ("reused_input_tokens", {238: (192, 144)}),
    # case 264 of refusal_fuzz.py --seed 53 with its spoiled and idle arguments dropped and 15 of its
    # 30 requests kept (all that the difference needs): a decode worker of 127 blocks of 8
    "fid-7-decode-side": ("decode_reused_input_tokens", {121: (112, 72)}),
    # case 15 of gen-cases --tight --large --sessions --seed 1471 with four of its 137 requests kept:
    # the 627-token turn ends later in the reference, so the next turn of its session (361 tokens)
    # arrives later there too
    "fid-7-moved-session-turn": ("reused_input_tokens", {627: (608, 568)}),
}
#: per FID-7 golden whose difference moves the arrival of later session turns: their input lengths
FID7_MOVED = {"fid-7-moved-session-turn": {361}}


def test_fid9_delta_prompts_follow_the_pinned_source():
    """FID-9 (known difference): with ``mooncake-delta`` the pinned driver appends only each turn's
    own tokens to the session's prompt (WL-18, DRV-17): 16, 16+16, 32+8.  The compiled build also
    appends the tokens the previous turn generated (5, then 3): 16, 37, 48, and its third turn
    reuses 20 tokens on the worker that ran the first (the 16 prompt tokens and a full block of 4
    generated ones), which only matches if the appended tokens are the generated ones."""
    ours, ref, div = check_case(DIVERGENT / "fid-9-delta-generated-tokens")
    assert ref.status == "ok" and ours.status == "ok" and div is not None
    by_turn = lambda out: [(r["input_length"], r["reused_input_tokens"])
                           for r in sorted(out.records, key=lambda r: r["turn_index"])]
    assert by_turn(ours) == [(16, 0), (32, 0), (40, 16)]
    assert by_turn(ref) == [(16, 0), (16 + 5 + 16, 0), (37 + 3 + 8, 16 + 4)]


@pytest.mark.parametrize("case", sorted(FID7_CASES))
def test_fid7_partial_chunk_blocks_reused_per_pinned_source(case):
    """FID-7 (known difference): the pinned source keeps the blocks a failing prefill chunk did get
    (KV-6, VLLM-7), so after the self-preemption they are cached and the re-admission reuses them;
    the compiled build (newer source, all-or-nothing Use) takes none and reuses only the blocks held
    before the chunk.  Pins the difference exactly: only that request's reuse differs."""
    ours, ref, div = check_case(DIVERGENT / case)
    assert ref.status == "ok" and ours.status == "ok"
    assert div is not None
    field, pinned = FID7_CASES[case]
    moved = FID7_MOVED.get(case, set())
    # a moved turn is known by its lengths only, and it does move
    key = lambda r: (None if r["input_length"] in moved else r["arrival_time_ms"], r["input_length"], r["output_length"])
    arrivals = lambda out: {r["input_length"]: r["arrival_time_ms"] for r in out.records if r["input_length"] in moved}
    assert all(a != arrivals(ref)[isl] for isl, a in arrivals(ours).items())
    for name in ("reused_input_tokens", "decode_reused_input_tokens"):
        reuse = lambda out: {key(r): r[name] for r in out.records}
        mine, theirs = reuse(ours), reuse(ref)
        assert mine.keys() == theirs.keys() and len(mine) == len(ours.records)
        differing = {k[1]: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
        assert differing == (pinned if name == field else {}), name


def test_fid7_signature_names_the_request_and_nothing_else(capsys):
    """FID-7 detection in ``mocker-spec diff``: each FID-7 golden is flagged with the request its
    pin names (model reuse > reference reuse); FID-9's difference is not (there the model reuses
    less), nor is an agreeing case, nor an SGLang-only case whatever its reuse."""
    from mocker_spec.cli import main
    from mocker_spec.reference import Outcome, fid7_signature, load_case

    for case, (field, pinned) in FID7_CASES.items():
        job, _ref = load_case(DIVERGENT / case)
        ours, ref, _div = check_case(DIVERGENT / case)
        ((isl, (mine, theirs)),) = pinned.items()
        hint = fid7_signature(job, ours, ref)
        where = " on its decode worker" if field == "decode_reused_input_tokens" else ""
        assert hint is not None and f"(input {isl}) reuses {mine} tokens{where} in the model, {theirs} in the reference" in hint
    job, _ref = load_case(DIVERGENT / "fid-9-delta-generated-tokens")
    assert fid7_signature(job, *check_case(DIVERGENT / "fid-9-delta-generated-tokens")[:2]) is None
    shared = ROOT / "tests" / "goldens" / "refcases"
    some = sorted(p for p in shared.iterdir() if (p / "case.json").exists())[0]
    job, _ref = load_case(some)
    ours, ref, div = check_case(some)
    assert div is None and fid7_signature(job, ours, ref) is None
    row = {"arrival_time_ms": 0.0, "input_length": 64, "output_length": 1, "reused_input_tokens": 60}
    more, less = Outcome("ok", records=[row]), Outcome("ok", records=[dict(row, reused_input_tokens=40)])
    assert fid7_signature({"engine_args": {"engine_type": "sglang"}}, more, less) is None
    assert fid7_signature({"engine_args": {"engine_type": "trtllm"}}, more, less) is not None
    assert fid7_signature({"engine_args": None}, more, less) is not None  # the default engine is vLLM
    assert fid7_signature({"engine_args": {"engine_type": "vllm"}}, less, more) is None
    assert main(["diff", "--corpus", str(DIVERGENT)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{len(FID7_CASES)} of the {len(FID7_CASES) + 1} difference(s) carry FID-7's signature" in out


def test_fid7_signature_matches_moved_and_twin_rows_as_groups():
    """FID-7 detection when rows cannot be matched one to one (genslp-1471-0015: a session's later
    turns arrive when the turn before ends, so the difference moves their arrivals, and the hint
    once gave up). A row whose arrival moved, and rows identical in every identifying field, are
    compared as a group of equal lengths, session and turn, by the reuse they sum to (if the
    model's sum is larger, some request of the group reuses more however the rows pair up)."""
    from mocker_spec.reference import Outcome, fid7_evidence, fid7_signature

    vllm = {"engine_args": {"engine_type": "vllm"}}

    def row(arrival, isl, reuse):
        return {"arrival_time_ms": arrival, "input_length": isl, "output_length": 1, "reused_input_tokens": reuse}

    # the flagged request keeps its arrival; a later turn (32 tokens) moves from 10.0 to 10.5 ms
    ours = Outcome("ok", records=[row(0.0, 64, 60), row(10.0, 32, 0)])
    ref = Outcome("ok", records=[row(0.0, 64, 40), row(10.5, 32, 0)])
    assert fid7_signature(vllm, ours, ref) == ("FID-7 signature: the request arriving at 0.0 ms (input 64) "
                                               "reuses 60 tokens in the model, 40 in the reference")
    # the moved turn is the one that reuses more: named by its arrival in the reference
    ours = Outcome("ok", records=[row(0.0, 64, 40), row(10.0, 32, 32)])
    ref = Outcome("ok", records=[row(0.0, 64, 40), row(10.5, 32, 16)])
    found = fid7_evidence(vllm, ours, ref)
    assert (found.model, found.reference, found.rows[0]["arrival_time_ms"]) == (32, 16, 10.5)
    # twins: 60 + 0 against 0 + 40 is more in all; 0 + 40 against 40 + 0 is no claim
    twins = fid7_evidence(vllm, Outcome("ok", records=[row(0.0, 64, 60), row(0.0, 64, 0)]),
                          Outcome("ok", records=[row(0.0, 64, 0), row(0.0, 64, 40)]))
    assert (twins.model, twins.reference, len(twins.rows)) == (60, 40, 2)
    assert "the 2 requests of input 64 and output 1 arriving from 0.0 ms reuse 60 tokens in all" in twins.describe()
    assert fid7_evidence(vllm, Outcome("ok", records=[row(0.0, 64, 0), row(0.0, 64, 40)]),
                         Outcome("ok", records=[row(0.0, 64, 40), row(0.0, 64, 0)])) is None
    # a row of other lengths is another request: no claim
    assert fid7_evidence(vllm, Outcome("ok", records=[row(0.0, 64, 60), row(10.0, 33, 0)]),
                         Outcome("ok", records=[row(0.0, 64, 40), row(10.5, 32, 0)])) is None


def test_cli_diff_corpus_jobs_gives_the_same_table_in_the_same_order(tmp_path, capsys):
    """``diff --corpus --jobs N`` runs the cases in N worker processes: the table, its row order,
    the differences, the FID-7 count and the exit status are those of one process.  A corpus of
    identical, differing and hanging cases (the divergent goldens plus three goldens)."""
    import shutil

    for d in DIVERGENT.iterdir():
        if (d / "case.json").exists():
            shutil.copytree(d, tmp_path / d.name)
    for name in ("case-1-037", "gen-1-0136", "zero-output-vllm-single"):
        shutil.copytree(GOLDENS / name, tmp_path / name)
    runs = {}
    for jobs in ("1", "3"):
        assert cli.main(["diff", "--corpus", str(tmp_path), "--jobs", jobs]) == 1
        cap = capsys.readouterr()
        runs[jobs] = cap.out
        assert cap.err == ""  # no bar when standard error is not a terminal
    assert runs["1"] == runs["3"]
    total = sum(1 for d in tmp_path.iterdir() if (d / "case.json").exists())
    assert f"3/{total} identical" in runs["1"] and "differs" in runs["1"]
    assert cli.main(["diff", "--corpus", str(tmp_path), "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert "--jobs=0: must be at least 1" in err and len(err.strip().splitlines()) == 1


def test_disaggregated_session_trace_is_not_validated(tmp_path):
    """WL-9, WL-14: a multi-turn trace whose first turn has no prompt is refused by an aggregated
    replay but run by a disaggregated one, whose session path skips the check (recorded from the
    compiled build: `session a turn 0 must have a positive input_length` for one vLLM worker, and a
    completed replay for one prefill and one decode worker); a single-turn trace is validated on
    both."""
    from mocker_spec.reference import run_model

    def trace(name, rows):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    row = {"timestamp": 0.0, "input_length": 32, "output_length": 2, "hash_ids": [1, 2]}
    sessions = trace("sessions", [dict(row, session_id="a", input_length=0),
                                  dict(row, session_id="a", timestamp=5.0)])
    single = trace("single", [row, dict(row, timestamp=1.0, input_length=0)])
    args = {"block_size": 16, "num_gpu_blocks": 256}
    agg = {"mode": "agg", "num_workers": 1, "engine_args": args, "trace_block_size": 16}
    disagg = {"mode": "disagg", "num_prefill_workers": 1, "num_decode_workers": 1, "trace_block_size": 16,
              "prefill_engine_args": dict(args, worker_type="prefill"),
              "decode_engine_args": dict(args, worker_type="decode")}
    with pytest.raises(InvalidInput, match="session a turn 0 must have a positive input_length"):
        run_model(dict(agg, trace_file=sessions))
    done = run_model(dict(disagg, trace_file=sessions))
    assert done.status == "ok" and len(done.records) == 2
    for job in (agg, disagg):
        with pytest.raises(InvalidInput, match="session request_2 turn 0 must have a positive input_length"):
            run_model(dict(job, trace_file=single))


def test_error_messages_are_compared_without_their_end_blanks():
    """FID-10: a recorded expected.status loses the trailing blank of a message that ends with an
    empty session id (golden trace-empty-session-id-delay); the texts still agree, other texts do
    not."""
    from mocker_spec.reference import Outcome, compare

    ours = Outcome("error", "trace line 2 sets delay on the first turn of session ")
    assert compare(ours, Outcome("error", "trace line 2 sets delay on the first turn of session")) is None
    assert compare(ours, Outcome("error", "trace line 3 sets delay on the first turn of session")).where == "status"


#: DRV-1: synthetic jobs with a bad workload argument and a bad mode argument, and which one the
#: compiled build refuses (recorded from it): the binding builds the workload (WL-16/WL-17, the
#: workload path's speed-up included) before the entry point's mode checks, and normalizes flat
#: requests (WL-15's ratio check) only after them
_SYNTHETIC = {"input_tokens": 8, "output_tokens": 2, "request_count": 2}
_AGG = {"block_size": 16, "num_gpu_blocks": 64}
SYNTHETIC_ORDER_CASES = [
    ({"mode": "agg", "num_workers": 0, "engine_args": _AGG, "synthetic": dict(_SYNTHETIC, input_tokens=0)},
     "input_tokens must be at least 1"),
    ({"mode": "agg", "num_workers": 1, "router_mode": "kv_router", "engine_args": _AGG,
      "synthetic": dict(_SYNTHETIC, input_tokens=0)}, "input_tokens must be at least 1"),
    ({"mode": "agg", "num_workers": 0, "arrival_speedup_ratio": 0, "engine_args": _AGG,
      "synthetic": dict(_SYNTHETIC, turns_per_session=2)}, "ratio must be a finite positive number, got 0"),
    ({"mode": "disagg", "num_prefill_workers": 0, "prefill_engine_args": dict(_AGG, worker_type="prefill"),
      "decode_engine_args": dict(_AGG, worker_type="decode"), "synthetic": dict(_SYNTHETIC, input_tokens=0)},
     "input_tokens must be at least 1"),
    ({"mode": "agg", "num_workers": 0, "arrival_speedup_ratio": 0, "engine_args": _AGG, "synthetic": _SYNTHETIC},
     "trace replay requires num_workers >= 1"),
    ({"mode": "agg", "num_workers": 1, "arrival_speedup_ratio": 0, "engine_args": _AGG, "synthetic": _SYNTHETIC},
     "arrival_speedup_ratio must be a finite positive number, got 0"),
]


@pytest.mark.parametrize("job,message", SYNTHETIC_ORDER_CASES)
def test_synthetic_workload_is_built_between_the_binding_and_the_mode_checks(job, message):
    """DRV-1: the refusal the build gives for each pair (SYNTHETIC_ORDER_CASES)."""
    from mocker_spec.reference import model_outcome

    outcome = model_outcome(job)
    assert (outcome.status, outcome.message) == ("error", message)


def test_silent_steps_that_cannot_be_recorded_still_meet_the_budget(monkeypatch):
    """LIVE-4, LIVE-7: clock steps that emit and complete nothing but are never recordable (here:
    activity on every step, several pending events) count towards the budget too, so such a run
    stops as a suspected livelock instead of spinning; so do steps with an arrival still to come
    (odd-109-0240 looped towards an arrival at 10^12 ms). An emission, a released arrival or a cap
    resets the count."""
    import model.replay.livelock as L

    monkeypatch.setattr(L, "STEP_BUDGET", 50)

    class Events:
        def only_event(self):
            return None

        def quiet_completions(self):
            return None

    watch = L.TimedWatch()
    step = lambda ahead=False, released=0, capped=False: watch.step(Events(), capped, ahead, released, lambda: True)
    for i in range(49):
        watch.note_activity()  # a zero-duration pass, say: not a quiet step
        assert step() is None
    watch.note_emission()
    assert step() is None  # an emission resets the count
    for i in range(49):
        watch.note_activity()
        assert step() is None
    assert step(released=1) is None  # a released arrival resets it
    for i in range(49):
        assert step(ahead=True, released=1) is None  # an arrival to come does not
    assert step(ahead=True, released=1, capped=True) is None  # a cap does
    steps = [step(ahead=i % 2 == 0, released=1) for i in range(50)]
    assert steps[:-1] == [None] * 49
    det, one, pending, admitted = steps[-1]
    assert det.observe(lambda: None, 0.0) == (-1, 0.0)


def test_silent_budget_counts_silent_steps_until_a_release_or_an_emission(monkeypatch):
    """LIVE-4: the one counter every runtime keeps (``SilentBudget``): silent steps in a row are
    counted, a step that emits (``silent`` false) or releases an arrival restarts the count, and the
    budget is spent on the STEP_BUDGET-th silent step, not before."""
    import model.replay.livelock as L

    monkeypatch.setattr(L, "STEP_BUDGET", 5)
    budget = L.SilentBudget()
    assert [budget.tick(True, 0) for _ in range(4)] == [False] * 4
    assert budget.tick(False, 0) is False and budget.steps == 0  # an emission restarts it
    assert [budget.tick(True, 0) for _ in range(4)] == [False] * 4
    assert budget.tick(True, 1) is False and budget.steps == 0  # so does a released arrival
    assert [budget.tick(True, 1) for _ in range(5)] == [False] * 4 + [True]
