"""Ports of the engine-generic scenario tests of lib/mocker/src/scheduler/mod.rs (tests module, 526-1119).

Upstream loops each scenario over ``[EngineType::Vllm, EngineType::Sglang]``
(the loop index ``case`` offsets the ids).  Here the loop is a pytest
parameter with ids ``vllm`` / ``trtllm`` / ``sglang``:

* ``sglang`` runs the SGLang core (model/sglang_core.py);
* ``trtllm`` is not in upstream's loops.  Scenarios without destinations run
  unchanged on it (same core, TRT-LLM policy); scenarios that reserve a
  destination assert instead that TRT-LLM refuses the first reservation before
  touching anything (TRT-4), which is why upstream leaves it out.

The Welford tests of the same module (welford_acc_empty,
welford_acc_single_value, welford_acc_population_variance,
welford_acc_matches_python) are ported in tests/test_kernel_units.py.
"""

from __future__ import annotations

import pytest

from core_helpers import Core, args, request, u
from model.errors import DestinationUnsupported
from model.protocol import APPLIED, NOOP, DestinationAccepted, DestinationReserved, DirectRequest, ReserveDestination

SGLANG = pytest.param("sglang", id="sglang")
ENGINES = [pytest.param("vllm", id="vllm"), pytest.param("trtllm", id="trtllm"), SGLANG]
CASE = {"vllm": 0, "sglang": 1, "trtllm": 2}  # upstream's loop index (vllm 0, sglang 1); trtllm extra


def core(engine: str, worker_type: str, blocks: int) -> Core:
    """Upstream ``core()`` helper (mod.rs:532-548): bs 4, 16-token budget, one running slot."""
    return Core(
        args(
            engine_type=engine,
            block_size=4,
            num_gpu_blocks=blocks,
            max_num_batched_tokens=16,
            max_num_seqs=1,
            enable_prefix_caching=True,
            worker_type=worker_type,
            speedup_ratio=0.0,
        )
    )


def req(uuid, tokens):
    """Upstream ``request()`` helper (mod.rs:550-559): ``max_output_tokens`` 2."""
    return request(uuid, tokens, 2)


def trtllm_refuses_reservation(destination: Core, handoff: str, request_id: str, tokens) -> None:
    """TRT-4: the first reservation fails before id validation or any KV use."""
    before = destination.value
    with pytest.raises(DestinationUnsupported, match="not supported for TRT-LLM"):
        destination.reserve(handoff, req(request_id, tokens))
    assert destination.value == before
    assert destination.is_drained()
    assert destination.num_active_blocks() == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_unavailable_destination_keeps_source_held_until_both_owners_are_cancelled(engine):
    """mod.rs:618-697.  CMD-3, CMD-5, CMD-6, CMD-8, VGEN-2, VLLM-20, VLLM-24.

    A destination whose reservation cannot succeed (2-block pool already
    reserved) stays pending; cancelling both destinations and the held source
    drains both cores.
    """
    case = CASE[engine]
    source = core(engine, "prefill", 8)
    destination = core(engine, "decode", 2)
    held_handoff = u(30_000 + case)
    capacity_handoff = u(30_100 + case)
    request_id = u(30_200 + case)

    if engine == "trtllm":
        trtllm_refuses_reservation(destination, capacity_handoff, u(30_300 + case), range(100, 108))
        return

    accepted = destination.apply(ReserveDestination(capacity_handoff, req(u(30_300 + case), range(100, 108))))
    assert isinstance(accepted, DestinationAccepted)
    source.submit_prefill(held_handoff, req(request_id, range(0, 8)))
    now = 0.0
    for _ in range(8):
        p = source.hidden(now)
        now = p.end_ms
        if source.is_empty():
            break
    assert source.is_empty()
    assert not source.is_drained()

    assert destination.apply(ReserveDestination(held_handoff, req(request_id, range(0, 4)))) == DestinationAccepted(
        request_id
    )
    assert destination.cancel_destination(held_handoff).result == APPLIED
    assert destination.cancel_destination(capacity_handoff).result == APPLIED
    assert source.cancel_source(held_handoff) == APPLIED
    assert source.is_empty()
    assert source.is_drained()
    assert destination.is_empty()
    assert destination.is_drained()


def reserved_events(effects):
    return [(e.handoff_id.value, e.request_id.value) for e in effects.lifecycle_events if isinstance(e, DestinationReserved)]


@pytest.mark.parametrize("engine", ENGINES)
def test_destination_cancellation_retries_the_blocked_fifo_head(engine):
    """mod.rs:699-759.  CMD-8, CMD-9, RETRY-1, VLLM-20, VLLM-22.

    The 2-block pool is reserved by the first destination; the second stays
    pending; cancelling the first (a held reservation) bumps the generation and
    the retry run by the Applied cancel reserves the second.
    """
    case = CASE[engine]
    destination = core(engine, "decode", 2)
    first_handoff = u(35_000 + case)
    second_handoff = u(35_100 + case)
    second_request = u(35_200 + case)
    if engine == "trtllm":
        trtllm_refuses_reservation(destination, first_handoff, u(35_300 + case), range(100, 108))
        return

    first = destination.reserve(first_handoff, req(u(35_300 + case), range(100, 108)))
    assert [h for h, _ in reserved_events(first)] == [first_handoff]

    second = destination.reserve(second_handoff, req(second_request, range(200, 204)))
    assert second.lifecycle_events == ()

    canceled = destination.cancel_destination(first_handoff)
    assert canceled.result == APPLIED
    assert reserved_events(canceled) == [(second_handoff, second_request)]


@pytest.mark.parametrize("engine", ENGINES)
def test_blocked_destination_head_prevents_fresh_kv_admission_without_spinning(engine):
    """mod.rs:761-867.  VLLM-11, VLLM-18, VLLM-21, VLLM-24, VLLM-25, VLLM-Q3, CMD-7, CMD-8, RETRY-3.

    While a destination is pending, a fresh request is not admitted and the
    pass does no work (``end_ms == now_ms``); an activated (prebuilt) request
    is admitted ahead of it; once nothing is pending the fresh request runs.
    """
    case = CASE[engine]
    destination = core(engine, "decode", 4)
    owner_handoff = u(36_000 + case)
    blocked_handoff = u(36_100 + case)
    owner_request = u(36_200 + case)
    fresh_request = u(36_400 + case)
    if engine == "trtllm":
        trtllm_refuses_reservation(destination, owner_handoff, owner_request, range(100, 108))
        return

    owner = destination.reserve(owner_handoff, req(owner_request, range(100, 108)))
    assert len(owner.lifecycle_events) == 1
    occupied_before = destination.metrics().active_decode_blocks
    assert occupied_before > 0

    blocked = destination.reserve(blocked_handoff, req(u(36_300 + case), range(200, 212)))
    assert blocked.lifecycle_events == ()
    assert destination.is_empty()
    assert not destination.is_drained()
    pending_only = destination.hidden(0.0)
    assert pending_only.end_ms == 0.0
    assert pending_only.admissions == ()
    assert pending_only.output_signals == ()

    destination.receive(req(fresh_request, range(300, 304)))
    p = destination.hidden(0.0)
    assert p.admissions == ()
    assert p.output_signals == ()
    assert p.end_ms == 0.0
    assert destination.num_requests() == 1
    assert destination.metrics().active_decode_blocks == occupied_before

    assert destination.activate(owner_handoff) == APPLIED
    materialized = destination.hidden(0.0)
    admitted = [a.uuid.value for a in materialized.admissions]
    assert owner_request in admitted
    assert fresh_request not in admitted

    assert destination.cancel_destination(blocked_handoff).result == APPLIED
    assert destination.cancel_destination(owner_handoff).result == APPLIED
    fresh = destination.hidden(1.0)
    assert fresh_request in [a.uuid.value for a in fresh.admissions]


@pytest.mark.parametrize("engine", ENGINES)
def test_unchanged_capacity_generation_does_not_reprobe_pending_destination(engine):
    """mod.rs:869-939.  RETRY-1, RETRY-3, VGEN-1, CMD-8.

    A failed probe marks the head tried at the current generation; retries at
    an unchanged generation do not probe (``destination_reservation_attempts``
    stays put); cancelling the owner bumps the generation and exactly one more
    probe reserves the pending head.
    """
    case = CASE[engine]
    destination = core(engine, "decode", 2)
    owner_handoff = u(36_500 + case)
    pending_handoff = u(36_600 + case)
    pending_request = u(36_700 + case)
    if engine == "trtllm":
        trtllm_refuses_reservation(destination, owner_handoff, u(36_800 + case), range(0, 8))
        return

    owner = destination.reserve(owner_handoff, req(u(36_800 + case), range(0, 8)))
    assert len(owner.lifecycle_events) == 1
    pending = destination.reserve(pending_handoff, req(pending_request, range(100, 104)))
    assert pending.lifecycle_events == ()

    attempts_after_initial_failure = destination.reservation_attempts()
    for _ in range(3):
        assert destination.retry() == []
    assert destination.reservation_attempts() == attempts_after_initial_failure

    cancellation = destination.cancel_destination(owner_handoff)
    assert reserved_events(cancellation) == [(pending_handoff, pending_request)]
    assert destination.reservation_attempts() == attempts_after_initial_failure + 1
    assert destination.cancel_destination(pending_handoff).result == APPLIED


def test_vllm_prebuilt_waiting_request_runs_before_blocked_pending_destination():
    """mod.rs:941-1020 (vLLM only upstream).  VLLM-11, VLLM-21, VLLM-23, VGEN-1, VLLM-Q3, RETRY-1.

    An activated request queued behind a fresh one is admitted first while a
    destination is pending (prefer-materialized); the fresh request is not.
    Once the activated request completes (a completion always bumps the
    generation) the post-pass retry reserves the pending destination.
    """
    destination = core("vllm", "decode", 4)
    ready_handoff = u(36_900)
    pending_handoff = u(36_901)
    ready_request = u(36_902)
    pending_request = u(36_903)
    fresh_request = u(36_904)

    destination.receive(req(fresh_request, range(200, 204)))
    assert destination.apply(ReserveDestination(ready_handoff, req(ready_request, range(0, 8)))) == DestinationAccepted(
        ready_request
    )
    assert destination.activate(ready_handoff) == APPLIED
    pending = destination.reserve(pending_handoff, req(pending_request, range(100, 112)))
    assert pending.lifecycle_events == ()

    first_pass = destination.hidden(0.0)
    admitted = [a.uuid.value for a in first_pass.admissions]
    assert ready_request in admitted
    assert fresh_request not in admitted

    reservation_events = []
    for now_ms in range(1, 5):
        destination.hidden(float(now_ms))
        reservation_events.extend(destination.retry())
        if reservation_events:
            break
    assert [(e.handoff_id.value, e.request_id.value) for e in reservation_events] == [
        (pending_handoff, pending_request)
    ]
    assert destination.cancel_destination(pending_handoff).result == APPLIED


@pytest.mark.parametrize("engine", ENGINES)
def test_activated_waiting_destination_cancels_without_consuming_the_running_slot(engine):
    """mod.rs:1022-1084.  VLLM-21, VLLM-17, CMD-7, CMD-8.

    Activation moves the reservation's blocks to the request without changing
    occupancy; cancelling the activated (still waiting) destination removes it
    once and leaves the running request alone.
    """
    case = CASE[engine]
    destination = core(engine, "decode", 16)
    handoff_id = u(38_000 + case)
    request_id = u(38_100 + case)
    if engine == "trtllm":
        trtllm_refuses_reservation(destination, handoff_id, request_id, range(0, 8))
        return

    reserved = destination.reserve(handoff_id, req(request_id, range(0, 8)))
    assert len(reserved.lifecycle_events) == 1
    assert destination.metrics().active_decode_blocks > 0

    destination.receive(DirectRequest(tuple(range(100, 108)), 8, u(38_200 + case)))
    p = destination.hidden(0.0)
    assert len(p.admissions) == 1
    before_activation = destination.metrics().active_decode_blocks
    assert destination.activate(handoff_id) == APPLIED
    assert destination.metrics().active_decode_blocks == before_activation
    assert destination.cancel_destination(handoff_id).result == APPLIED
    assert destination.cancel_destination(handoff_id).result == NOOP
    assert destination.num_requests() == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_preterminal_source_cancel_removes_scheduled_request_once(engine):
    """mod.rs:1086-1118.  CMD-3, CMD-5, VLLM-17, VLLM-24.

    Cancelling a registered source before it completes drops the scheduled
    request (it never ran, so nothing is freed); a second cancel is a Noop.
    Runs on TRT-LLM too: source commands are engine-neutral.
    """
    case = CASE[engine]
    source = core(engine, "prefill", 8)
    handoff_id = u(40_000 + case)
    request_id = u(40_100 + case)
    source.submit_prefill(handoff_id, req(request_id, range(0, 8)))
    assert source.num_requests() == 1
    assert source.cancel_source(handoff_id) == APPLIED
    assert source.is_empty()
    assert source.is_drained()
    assert source.cancel_source(handoff_id) == NOOP
