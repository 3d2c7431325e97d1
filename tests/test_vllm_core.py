"""Ports of lib/mocker/src/scheduler/vllm/tests.rs: the vLLM / TRT-LLM engine core.

Each test is named after the upstream test and cites the rules it covers
(spec/vllm-core.md; command rules CMD-n / RETRY-n are spec/core-commands.md).
Expected values are upstream's assertions, or derived by hand in a comment.

Adaptations, where upstream reads something the model does not have:

* physical block ids (``request_block_ids`` / ``destination_block_ids``): the
  model tracks block identities, not slot numbers (spec/kv-vllm.md), so the
  ports compare the reserved layout's block identities with the request's
  leading unique blocks and check that every one of them is held;
* router events carry no worker id in the model (a driver wraps them), so
  only the dp rank is checked;
* live-scheduler tests (tokio) are ported as their pure-core half where one
  exists, driven by an explicit pass loop instead of the async runtime.
"""

from __future__ import annotations

import random

import attrs
import pytest
from pyrsistent import pmap

from core_helpers import Collector, Core, RouterIndex, args, request, stored_hashes, u
from model import sequence as seqm
from model import timing
from model import vllm_kv as kvm
from model.errors import DestinationUnsupported, RequestAlreadyActive
from model.ids import hid, rid
from model.kv_events import KvStored
from model.protocol import (
    APPLIED,
    NOOP,
    DestinationAccepted,
    DestinationReserved,
    SourceHeld,
    Submit,
    SubmitHandoffPrefill,
)
from model.vllm_core import RequestStatus, VllmRequest


def make_args():
    """tests.rs:49-60."""
    return args(
        block_size=4,
        num_gpu_blocks=6,
        max_num_batched_tokens=8,
        max_num_seqs=3,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        speedup_ratio=0.0,
    )


def router_args():
    """tests.rs:62-73."""
    return args(
        block_size=4,
        num_gpu_blocks=12,
        max_num_batched_tokens=12,
        max_num_seqs=3,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        speedup_ratio=0.0,
    )


def admitted(p):
    return [a.uuid.value for a in p.admissions]


# =============================================================================================
# mod source_holds (tests.rs:75-211)
# =============================================================================================


def source_args():
    """tests.rs:78-90: a Prefill worker, bs 4, 8 blocks, one running slot."""
    return args(
        block_size=4,
        num_gpu_blocks=8,
        max_num_batched_tokens=8,
        max_num_seqs=1,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        worker_type="prefill",
        speedup_ratio=0.0,
    )


def source_request(uuid):
    return request(uuid, range(0, 8), 2)


def test_terminal_completion_holds_source_without_freeing_kv():
    """tests.rs:108-146.  VLLM-23, VGEN-2, CMD-3, CMD-4.

    The registered source's final token completes it: it leaves the scheduler,
    ``SourceHeld`` is emitted, and its KV stays held until ReleaseSource; a
    second release is a no-op.
    """
    core = Core(source_args())
    request_id, handoff_id = u(101), u(201)
    core.submit_prefill(handoff_id, source_request(request_id))

    first = core.execute(0.0)
    assert not first.output_signals[0].completed
    active_before_terminal = core.num_active_blocks()
    assert active_before_terminal > 0

    terminal = core.execute(first.end_ms)
    assert terminal.output_signals[0].completed
    assert len(terminal.lifecycle_events) == 1
    ev = terminal.lifecycle_events[0]
    assert isinstance(ev, SourceHeld) and ev.handoff_id == hid(handoff_id) and ev.request_id == rid(request_id)
    assert core.source_is_held(handoff_id)
    assert rid(request_id) not in core.requests
    assert core.num_active_blocks() == active_before_terminal

    core.release(handoff_id)
    assert not core.source_is_held(handoff_id)
    assert core.num_active_blocks() == 0
    assert core.release(handoff_id) == NOOP
    assert core.num_active_blocks() == 0


def test_cancel_and_early_release_cleanup_exactly_once():
    """tests.rs:148-191.  VGEN-2, CMD-4, CMD-5, VLLM-23.

    Cancelling a held source frees its KV once; a second cancel is a no-op.
    The handoff id can be reused; an early release only detaches the hold, so
    the request then completes like an ordinary one and frees its KV.
    """
    core = Core(source_args())
    first_id = u(202)
    core.submit_prefill(first_id, source_request(u(102)))
    first = core.execute(0.0)
    core.execute(first.end_ms)
    held_blocks = core.num_active_blocks()

    core.cancel_source(first_id)
    assert core.num_active_blocks() == 0
    assert core.cancel_source(first_id) == NOOP
    assert core.num_active_blocks() == 0
    assert held_blocks > 0

    second_id = first_id
    core.submit_prefill(second_id, source_request(u(103)))
    assert core.source_is_registered(second_id)
    assert core.release(second_id) == APPLIED
    assert not core.source_is_registered(second_id)

    first = core.execute(0.0)
    terminal = core.execute(first.end_ms)
    assert terminal.output_signals[0].completed
    assert terminal.lifecycle_events == ()
    assert not core.source_is_held(second_id)
    assert core.num_active_blocks() == 0


def test_active_request_id_is_rejected_before_source_hold_registration():
    """tests.rs:193-210.  CMD-1, CMD-3: an active id is rejected before the hold is registered."""
    core = Core(source_args())
    request_id, handoff_id = u(104), u(204)
    core.receive(source_request(request_id))
    before = core.value
    with pytest.raises(RequestAlreadyActive):
        core.apply(Submit(source_request(request_id)))
    with pytest.raises(RequestAlreadyActive):
        core.apply(SubmitHandoffPrefill(handoff_id, source_request(request_id)))
    assert core.value == before
    assert not core.source_is_registered(handoff_id)
    assert core.num_requests() == 1


# =============================================================================================
# mod destination_lifecycle (tests.rs:213-737)
# =============================================================================================


def dest_args(worker_type):
    """tests.rs:217-229."""
    return args(
        block_size=4,
        num_gpu_blocks=12,
        max_num_batched_tokens=16,
        max_num_seqs=1,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        worker_type=worker_type,
        speedup_ratio=0.0,
    )


def drive_source_to_hold(core: Core, handoff_id, req):
    """tests.rs:254-277."""
    core.submit_prefill(handoff_id, req)
    now = 0.0
    for _ in range(8):
        p = core.execute(now)
        now = p.end_ms
        if core.is_empty():
            break
    assert core.is_empty()
    assert core.source_is_held(handoff_id)
    assert not core.is_drained()


def reserved_blocks(core: Core, handoff_id):
    """``destination_block_ids``: the reserved layout's block identities (none if not reserved)."""
    reserved = core.value.ledger.destination_holds.get(hid(handoff_id))
    if reserved is None or reserved.kv.layout is None:
        return ()
    return tuple(reserved.kv.layout.blocks)


def request_blocks(core: Core, uuid):
    """``request_block_ids``: the request's held blocks, each checked to be held in the KV manager."""
    req = core.value.requests.get(rid(uuid))
    if req is None:
        return ()
    seq = req.sequence
    n = min(-(-seq.num_allocated_tokens // seq.block_size), len(seq.unique_blocks))
    blocks = tuple(seq.unique_blocks[:n])
    kv = core.value.kv
    for b in blocks:
        if isinstance(b, seqm.FullBlock):
            assert kvm.refcount(kv, b.seq_hash) >= 1
        else:
            assert b in kv.active_partial
    return blocks


def test_productive_zero_duration_live_pass_continues_without_external_wake():
    """tests.rs:279-309 (core half).  VLLM-14, VLLM-16, VLLM-18.

    Upstream checks that the live loop re-runs after a productive pass without
    an external wake (live-loop behaviour, not modelled).  The core half: on a
    Decode worker the pass that admits the request has no prefill time and
    emits its (only) token.
    """
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=4,
            max_num_batched_tokens=16,
            max_num_seqs=1,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            worker_type="decode",
            speedup_ratio=1000.0,
        )
    )
    uuid = u(31_001)
    core.receive(request(uuid, [1] * 4, 1))
    p = core.execute(0.0)
    assert admitted(p) == [uuid]
    assert any(s.uuid.value == uuid for s in p.output_signals)
    assert p.token_ms > p.now_ms  # decode time only (scaled by 1000)


def test_destination_lifecycle_is_counted_once_as_queued_decode():
    """tests.rs:311-391.  VLLM-19, VLLM-25, VLLM-21, VLLM-20, CMD-6, CMD-8.

    A destination counts once as a queued decode (and as waiting in the
    metrics) in each stage: reserved, pending, activated-but-waiting; never as
    a queued prefill.
    """
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=32,
            max_num_seqs=1,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            worker_type="decode",
            speedup_ratio=0.0,
        )
    )
    held_handoff, held_uuid = u(32_001), u(32_002)
    held = core.reserve(held_handoff, request(held_uuid, [1] * 4, 1))
    assert len(held.lifecycle_events) == 1
    assert core.metrics().waiting_requests == 1
    snap = core.execute(0.0).fpm
    assert snap.num_queued_decode == 1
    assert snap.sum_queued_decode_kv_tokens == 4
    assert snap.var_queued_decode_kv_tokens == 0.0

    pending_handoff = u(32_003)
    pending = core.reserve(pending_handoff, request(u(32_004), [2] * 24, 1))
    assert pending.lifecycle_events == ()
    assert core.metrics().waiting_requests == 2
    mixed = core.execute(0.0).fpm
    assert mixed.num_queued_decode == 2
    assert mixed.sum_queued_decode_kv_tokens == 28
    assert mixed.var_queued_decode_kv_tokens == 100.0  # population variance of [4, 24]

    assert core.cancel_destination(pending_handoff).result == APPLIED
    assert core.metrics().waiting_requests == 1

    core.receive(request(u(32_005), [3] * 4, 2))
    blocker = core.execute(1.0)
    assert core.metrics().running_requests == 1
    assert core.activate(held_handoff) == APPLIED
    assert core.metrics().waiting_requests == 1

    activated_pass = core.execute(blocker.end_ms)
    activated = activated_pass.fpm
    assert activated.num_queued_prefill == 0
    assert activated.num_queued_decode == 1
    assert activated.sum_queued_decode_kv_tokens == 4

    completed = core.execute(activated_pass.end_ms).fpm
    assert completed.num_queued_decode == 0
    assert completed.sum_queued_decode_kv_tokens == 0
    assert core.metrics().waiting_requests == 0


def test_destination_transfer_footprint_excludes_decode_headroom():
    """tests.rs:393-420.  VLLM-20: a 10-token prompt reserves ceil(10/4) = 3 blocks -> 12
    transferable tokens, whatever ``max_output_tokens`` is (no decode headroom)."""

    def footprint(max_output_tokens):
        core = Core(dest_args("decode"))
        eff = core.reserve(u(1), request(u(2), range(0, 10), max_output_tokens))
        (ev,) = eff.lifecycle_events
        assert isinstance(ev, DestinationReserved)
        return ev.transferable_prompt_tokens

    assert footprint(1) == 12
    assert footprint(128) == 12


def test_handoff_prefill_to_reserved_decode_owns_kv_until_normal_admission():
    """tests.rs:422-566.  VLLM-20, VLLM-21, VLLM-26, VLLM-11, VLLM-10, RETRY-2, VGEN-1, VGEN-2, CMD-4, CMD-6, CMD-7.

    Source and destination cores.  The reservation waits while the running slot
    is taken (the vLLM slot gate); it is made by the retry after the blocker
    completes (a completion bumps the generation), reuses the cached first
    prompt block (transferable 4 = one unpublished block), is published on
    activation (Stored events) and never re-published when the request is
    later admitted and runs.
    """
    logical_uuid, handoff_id = u(10_001), u(10_002)
    logical_tokens = range(0, 8)
    source = Core(dest_args("prefill"), capture_kv_events=True)
    destination = Core(dest_args("decode"), capture_kv_events=True)

    destination.receive(request(u(10_003), range(0, 4), 1))
    destination.execute(0.0)
    assert destination.is_empty()
    destination.drain_kv_events()

    blocker_uuid = u(10_004)
    destination.receive(request(blocker_uuid, range(100, 104), 3))
    blocker_first = destination.execute(1.0)
    assert len(destination.running) == 1
    destination.drain_kv_events()

    drive_source_to_hold(source, handoff_id, request(logical_uuid, logical_tokens, 2))

    usage_before_reservation = destination.num_active_blocks()
    reserve = destination.reserve(handoff_id, request(logical_uuid, logical_tokens, 2))
    assert reserve.result == DestinationAccepted(logical_uuid)
    assert reserve.lifecycle_events == ()
    assert destination.destination_is_held(handoff_id)
    assert not destination.is_drained()
    assert len(destination.running) == 1
    assert destination.num_active_blocks() == usage_before_reservation
    assert stored_hashes(destination.drain_kv_events()) == []

    now = blocker_first.end_ms
    blocker_completed = False
    for _ in range(16):
        p = destination.execute(now)
        now = p.end_ms
        if any(s.uuid.value == blocker_uuid and s.completed for s in p.output_signals):
            blocker_completed = True
            break
    assert blocker_completed
    usage_before_physical_reservation = destination.num_active_blocks()
    reserved = destination.retry()
    assert [(e.handoff_id.value, e.request_id.value, e.transferable_prompt_tokens) for e in reserved] == [
        (handoff_id, logical_uuid, 4)
    ]
    assert destination.num_active_blocks() > usage_before_physical_reservation
    reserved_block_ids = reserved_blocks(destination, handoff_id)
    assert reserved_block_ids

    activation_blocker_uuid = u(10_005)
    destination.receive(request(activation_blocker_uuid, range(200, 204), 3))
    activation_blocker_first = destination.execute(now)
    assert len(destination.running) == 1
    occupancy_before_activation = destination.num_active_blocks()
    assert destination.activate(handoff_id) == APPLIED
    assert not destination.destination_is_held(handoff_id)
    assert destination.num_active_blocks() == occupancy_before_activation
    assert destination.req(logical_uuid).status is RequestStatus.WAITING
    assert len(destination.running) == 1
    assert request_blocks(destination, logical_uuid) == reserved_block_ids
    activation_stores = stored_hashes(destination.drain_kv_events())
    assert activation_stores

    assert source.release(handoff_id) == APPLIED
    assert source.is_empty()
    assert source.is_drained()

    blocked = destination.execute(activation_blocker_first.end_ms)
    assert destination.req(logical_uuid).status is RequestStatus.WAITING
    assert request_blocks(destination, logical_uuid) == reserved_block_ids
    assert not set(stored_hashes(blocked.kv_events)) & set(activation_stores)

    blocker_terminal = destination.execute(blocked.end_ms)
    assert any(s.uuid.value == activation_blocker_uuid and s.completed for s in blocker_terminal.output_signals)
    assert destination.req(logical_uuid).status is RequestStatus.WAITING

    admitted_pass = destination.execute(blocker_terminal.end_ms)
    logical = destination.req(logical_uuid)
    assert logical.status is RequestStatus.RUNNING
    assert request_blocks(destination, logical_uuid)[: len(reserved_block_ids)] == reserved_block_ids
    assert logical.sequence.num_allocated_tokens >= logical.sequence.num_input_tokens
    assert not set(stored_hashes(admitted_pass.kv_events)) & set(activation_stores)

    terminal = destination.execute(admitted_pass.end_ms)
    assert any(s.uuid.value == logical_uuid and s.completed for s in terminal.output_signals)
    assert destination.is_empty()
    assert destination.is_drained()
    assert not destination.destination_is_held(handoff_id)
    assert destination.num_active_blocks() == 0


def test_retry_behind_a_closed_slot_gate_marks_the_head_without_probing():
    """RETRY-2, RETRY-3, PEND-5, CORE-7: with the only running slot taken, the retry a reservation
    runs (CMD-6) marks the pending head tried at the current generation and probes nothing (the
    attempt counter stays 0). The mark is part of the state, so a second retry at the same
    generation finds no head due and returns the core unchanged; only a generation bump (the
    blocker's completion) makes the head due again, and that retry probes once and reserves it."""
    h, r = u(10_201), u(10_202)
    core = Core(dest_args("decode"))
    blocker = u(10_203)
    core.receive(request(blocker, range(100, 104), 3))
    first = core.execute(0.0)
    assert len(core.running) == 1  # max_num_seqs 1: the gate is closed

    eff = core.reserve(h, request(r, range(0, 8), 2))
    assert eff.result == DestinationAccepted(r) and eff.lifecycle_events == ()
    led = core.value.ledger
    assert led.pending_destinations.entry(hid(h)).last_attempt_generation == led.capacity_generation
    assert core.value.destination_reservation_attempts == 0

    before = core.value
    assert core.retry() == []
    assert core.value is before

    now = first.end_ms
    for _ in range(16):
        p = core.execute(now)
        now = p.end_ms
        if not core.running:
            break
    assert not core.running and core.value.ledger.capacity_generation > led.capacity_generation
    assert [e.handoff_id.value for e in core.retry()] == [h]
    assert core.value.destination_reservation_attempts == 1


def test_destination_cancel_reaches_activated_request_exactly_once():
    """tests.rs:568-606.  VLLM-17, VLLM-21, CMD-8: cancelling an activated (now running)
    destination drops the request and frees its KV; a second cancel is a Noop."""
    request_id, handoff_id = u(10_101), u(10_102)
    core = Core(dest_args("decode"), capture_kv_events=True)
    reserve = core.reserve(handoff_id, request(request_id, range(0, 8), 4))
    assert [type(e) for e in reserve.lifecycle_events] == [DestinationReserved]
    assert core.activate(handoff_id) == APPLIED
    core.execute(0.0)
    assert rid(request_id) in core.requests

    assert core.cancel_destination(handoff_id).result == APPLIED
    assert core.is_empty()
    assert core.is_drained()
    assert core.num_active_blocks() == 0
    assert core.cancel_destination(handoff_id).result == NOOP


def test_cancel_running_destination_immediately_retries_pending_head():
    """tests.rs:608-672.  VLLM-17, VGEN-1, RETRY-2, CMD-8, CMD-9.

    With the only running slot taken by an activated destination, a new
    reservation stays pending (slot gate).  Cancelling the running destination
    frees the slot and bumps the generation; the retry of that Applied cancel
    reserves the pending head at once.
    """
    core = Core(dest_args("decode"))
    running_handoff, pending_handoff = u(10_201), u(10_202)
    running_request, pending_request = u(10_203), u(10_204)

    reserved = core.reserve(running_handoff, request(running_request, range(0, 4), 8))
    assert len(reserved.lifecycle_events) == 1
    assert core.activate(running_handoff) == APPLIED
    core.execute(0.0)
    assert core.metrics().running_requests == 1

    pending = core.reserve(pending_handoff, request(pending_request, range(100, 104), 2))
    assert pending.lifecycle_events == ()

    canceled = core.cancel_destination(running_handoff)
    assert [(e.handoff_id.value, e.request_id.value) for e in canceled.lifecycle_events] == [
        (pending_handoff, pending_request)
    ]
    assert core.cancel_destination(pending_handoff).result == APPLIED


def test_trtllm_destination_reservation_fails_without_acquiring_kv():
    """tests.rs:674-736.  TRT-4: the error text is upstream's; nothing is held or acquired."""
    core = Core(attrs.evolve(dest_args("decode"), engine_type="trtllm"))
    handoff_id = u(10_005)
    with pytest.raises(DestinationUnsupported) as err:
        core.reserve(handoff_id, request(u(10_006), range(0, 8), 2), allow=True)
    assert str(err.value) == "destination reservation is not supported for TRT-LLM"
    assert not core.destination_is_held(handoff_id)
    assert core.num_active_blocks() == 0
    assert core.is_drained()


# =============================================================================================
# mod core_behavior (tests.rs:739-1337)
# =============================================================================================


def test_unified_pass_keeps_partial_prefill_in_running():
    """tests.rs:741-804.  VLLM-4, VLLM-5, VLLM-6, VLLM-7, VLLM-10, VLLM-11, VLLM-12, VLLM-16.

    Budget 12: r1 takes 8 (whole prompt, emits its first token), r2 gets the
    remaining 4 as a chunk and stays Running (chunked prefill lives in
    ``running``).  Blocks: r1 2 full + 1 partial (9th token), r2 1 = 4.
    """
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=12,
            max_num_seqs=3,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            speedup_ratio=0.0,
        )
    )
    r1, r2 = u(1), u(2)
    core.receive(request(r1, range(0, 8), 2))
    core.receive(request(r2, range(100, 108), 2))
    p = core.execute(0.0)
    assert len(p.output_signals) == 1
    assert core.waiting == []
    assert p.metrics.running_requests == 2
    assert p.metrics.waiting_requests == 0
    assert core.running == [r1, r2]
    assert core.req(r1).num_computed_tokens == 8
    assert core.req(r2).num_computed_tokens == 4
    assert core.req(r1).sequence.generated_tokens == 1
    assert core.req(r2).status is RequestStatus.RUNNING
    assert core.num_active_blocks() == 4


def test_running_requests_consume_budget_before_waiting():
    """tests.rs:806-848.  VLLM-5, VLLM-6, VLLM-12: with budget 4, r1's running continuation takes the
    whole budget in pass 2, so the waiting r2 computes nothing."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=16,
            max_num_batched_tokens=4,
            max_num_seqs=3,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            speedup_ratio=0.0,
        )
    )
    r1, r2 = u(1), u(2)
    core.receive(request(r1, range(0, 8), 2))
    core.receive(request(r2, range(100, 108), 2))
    core.execute(0.0)
    p = core.execute(1.0)
    assert any(s.uuid.value == r1 for s in p.output_signals)
    assert core.req(r2).num_computed_tokens == 0


def test_execute_pass_batches_two_ready_requests_together():
    """tests.rs:850-909.  VLLM-10, VLLM-9, VLLM-14, VLLM-18: both are admitted at the pass start and their
    first tokens share the pass's token time."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=16,
            max_num_batched_tokens=8,
            max_num_seqs=4,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            speedup_ratio=0.0,
        )
    )
    r1, r2 = u(101), u(202)
    core.receive(request(r1, [1] * 4, 1))
    core.receive(request(r2, [2] * 4, 1))
    collector = Collector()
    p = core.execute(0.0, collector)
    assert len(p.admissions) == 2
    assert r1 in admitted(p) and r2 in admitted(p)
    first, second = collector.snapshot(r1), collector.snapshot(r2)
    assert first.first_admit_ms is not None and second.first_admit_ms is not None
    assert first.first_token_ms is not None and second.first_token_ms is not None
    assert first.first_admit_ms == second.first_admit_ms
    assert first.first_token_ms == second.first_token_ms


def test_prefill_completion_emits_handoff_delay():
    """tests.rs:911-944.  VLLM-16: Prefill worker, 8 tokens x 1e6 bytes / (1 GB/s) = 8.0 ms."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=8,
            max_num_batched_tokens=8,
            max_num_seqs=1,
            enable_chunked_prefill=True,
            worker_type="prefill",
            kv_transfer_bandwidth=1.0,
            kv_bytes_per_token=1_000_000,
            speedup_ratio=0.0,
        )
    )
    core.receive(request(u(81), [1] * 8, 1))
    p = core.execute(0.0)
    signal = p.output_signals[0]
    assert signal.completed
    assert signal.handoff_delay_ms == 8.0
    assert p.token_ms == p.end_ms  # a Prefill worker has no decode time


def test_first_token_can_arrive_on_prompt_completion_pass():
    """tests.rs:946-974.  VLLM-16: the pass that computes the last prompt token emits the first."""
    core = Core(make_args())
    uuid = u(11)
    core.receive(request(uuid, range(0, 8), 2))
    p = core.execute(0.0)
    assert len(p.output_signals) == 1
    assert p.output_signals[0].uuid.value == uuid
    assert not p.output_signals[0].completed
    assert core.req(uuid).sequence.generated_tokens == 1


def test_preemption_requeues_newest_running_request():
    """tests.rs:976-1020.  VLLM-15, VGEN-1: LIFO preempts r2 (the newest): Preempted, computed 0,
    one preemption, at the waiting front."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=16,
            max_num_seqs=2,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            preemption_mode="lifo",
            speedup_ratio=0.0,
        )
    )
    r1, r2 = u(1), u(2)
    core.receive(request(r1, range(0, 8), 8))
    core.receive(request(r2, range(100, 108), 8))
    now = 0.0
    preemptions_before = 0
    for _ in range(16):
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        preemptions_before = p.metrics.vllm_preemptions_total
        if preemptions_before > 0:
            break
    req2 = core.req(r2)
    assert req2.status is RequestStatus.PREEMPTED
    assert req2.num_computed_tokens == 0
    assert req2.num_preemptions == 1
    assert core.waiting[0] == r2
    assert preemptions_before == 1


def test_waiting_full_isl_gate_blocks_without_preemption_then_admits():
    """tests.rs:1022-1108.  VLLM-11, VLLM-12, VLLM-13 (full-ISL gate): the 3-block head waits behind the
    4-of-6-block holder (2 free); the 1-block follower must not skip it; no preemption."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=16,
            max_num_seqs=3,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            preemption_mode="lifo",
            speedup_ratio=0.0,
        )
    )
    holder, blocked, follower = u(1), u(2), u(3)
    core.receive(request(holder, range(0, 16), 1))
    core.receive(request(blocked, range(100, 112), 1))
    core.receive(request(follower, range(200, 204), 1))
    collector = Collector()
    pass1 = core.execute(0.0, collector)
    assert blocked in core.waiting and follower in core.waiting
    assert core.waiting[0] == blocked
    assert blocked not in admitted(pass1)
    assert follower not in admitted(pass1)
    assert any(s.uuid.value == holder and s.completed for s in pass1.output_signals)
    assert core.req(blocked).num_computed_tokens == 0
    assert pass1.metrics.vllm_preemptions_total == 0

    pass2 = core.execute(max(pass1.end_ms, 1.0), collector)
    assert blocked in admitted(pass2)
    assert pass2.metrics.vllm_preemptions_total == 0


def test_fresh_request_larger_than_pool_is_rejected_and_follower_runs():
    """tests.rs:1110-1150.  VLLM-12, VLLM-13, VLLM-17, VLLM-18: 20 tokens need 5 > 4 blocks -> rejected
    (terminal ``completed and rejected``), the follower is admitted in the same pass."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=4,
            max_num_batched_tokens=32,
            max_num_seqs=2,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            speedup_ratio=0.0,
        )
    )
    oversized, follower = u(1), u(2)
    core.receive(request(oversized, range(0, 20), 1))
    core.receive(request(follower, range(100, 104), 1))
    p = core.execute(0.0)
    assert any(s.uuid.value == oversized and s.completed and s.rejected for s in p.output_signals)
    assert follower in admitted(p)
    assert p.metrics.vllm_preemptions_total == 0
    # VLLM-18: the rejection signal comes after every emitted token
    assert p.output_signals[-1].rejected and not any(s.rejected for s in p.output_signals[:-1])


def test_running_request_catches_up_decode_tail_before_promote():
    """tests.rs:1152-1209.  VLLM-6, VLLM-7, VLLM-14, VLLM-16.

    A running request (6-token prompt, 6 generated, only the prompt's 2 blocks
    re-allocated, 9 tokens computed) owes 3 tokens: the pass allocates block 2
    (re-matching its own inactive block), computes to 12, then emits the 13th
    token, which opens a new partial block: 4 active blocks, 13 allocated.
    """
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=8,
            max_num_batched_tokens=8,
            max_num_seqs=1,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            speedup_ratio=0.0,
        )
    )
    uuid = u(99)
    kv = core.value.kv
    seq = seqm.new_sequence(99, tuple(range(0, 6)), 16, block_size=4, enable_prefix_caching=True)
    seq, signal = seqm.take_creation_signal(seq)
    kv, res = kvm.process(kv, signal)
    assert res.count == 2
    for _ in range(6):
        seq, signals = seqm.generate(seq)
        for sig in signals:
            kv, _ = kvm.process(kv, sig)
        if seq.generated_tokens < seq.max_output_tokens:
            seq = seqm.commit_allocation(seq, len(seq))
    seq, free = seqm.reset_with_signal(seq)
    for sig in free:
        kv, _ = kvm.process(kv, sig)
    prompt_only = seqm.prepare_allocation(seq, seq.num_input_tokens)
    kv, res = kvm.process(kv, prompt_only)
    assert res.count == 2
    seq = seqm.commit_allocation(seq, seq.num_input_tokens)

    r = rid(uuid)
    state = VllmRequest(r, seq, RequestStatus.RUNNING, num_computed_tokens=9, num_preemptions=1)
    core.install_running(kv, [state])
    p = core.execute(0.0)
    req = core.req(uuid)
    assert len(p.output_signals) == 1
    assert req.num_computed_tokens == 12
    assert req.sequence.num_allocated_tokens == 13
    assert core.num_active_blocks() == 4


def test_completion_returns_scheduler_to_idle():
    """tests.rs:1211-1233.  VLLM-2, VLLM-23, VLLM-24: both complete; queues and KV are empty."""
    core = Core(make_args())
    for uuid in (u(1), u(2)):
        core.receive(request(uuid, range(0, 8), 2))
    while not core.is_empty():
        core.execute(0.0)
    assert core.waiting == [] and core.running == []
    # the deques themselves hold no stale ids either once compacted/drained
    assert len(core.value.running) == 0
    assert core.num_active_blocks() == 0


# =============================================================================================
# mod router_events (tests.rs:1337-1560)
# =============================================================================================


def test_vllm_pass_visibility_is_pass_start():
    """tests.rs:1340-1365.  VLLM-18: visibility ``pass_start``; the pass's KV events are returned,
    all for dp rank 0 (the worker id is added by the driver, not modelled)."""
    core = Core(router_args(), capture_kv_events=True)
    core.receive(request(u(71), range(0, 8), 2))
    p = core.execute(0.0)
    assert p.router_event_visibility == "pass_start"
    assert p.kv_events
    assert all(e.dp_rank == 0 for e in p.kv_events)


def test_completion_events_apply_cleanly():
    """tests.rs:1367-1395.  VLLM-18, VLLM-23: events of a request's whole life apply to a router
    view without errors or duplicate stores; the KV ends empty."""
    index = RouterIndex()
    core = Core(router_args(), capture_kv_events=True)
    core.receive(request(u(41), range(0, 8), 4))
    now = 0.0
    saw_store = False
    while not core.is_empty():
        p = core.execute(now)
        saw_store |= bool(stored_hashes(p.kv_events))
        now = p.end_ms
        index.apply(p.kv_events)
    assert saw_store
    assert index.stored_ok > 0
    assert core.num_active_blocks() == 0
    index.assert_no_event_warnings()


def test_preemption_recompute_events_apply_cleanly():
    """tests.rs:1397-1467.  VLLM-15, VLLM-11: r2 is preempted (LIFO), waits at the front, and is
    re-admitted for recompute; its events stay clean throughout."""
    index = RouterIndex()
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=16,
            max_num_seqs=2,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            preemption_mode="lifo",
            speedup_ratio=0.0,
        ),
        capture_kv_events=True,
    )
    r1, r2 = u(51), u(52)
    core.receive(request(r1, range(0, 8), 8))
    core.receive(request(r2, range(100, 108), 8))
    now = 0.0
    saw_preemption = False
    for _ in range(16):
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        index.apply(p.kv_events)
        if rid(r2) in core.requests and core.req(r2).status is RequestStatus.PREEMPTED:
            saw_preemption = True
            break
    assert saw_preemption
    req2 = core.req(r2)
    assert req2.status is RequestStatus.PREEMPTED
    assert req2.num_computed_tokens == 0
    assert req2.num_preemptions == 1
    assert core.waiting[0] == r2

    readmitted = False
    for _ in range(32):
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        readmitted |= r2 in admitted(p)
        index.apply(p.kv_events)
        if readmitted:
            break
    assert readmitted
    index.assert_no_event_warnings()


# =============================================================================================
# mod live_scheduler (tests.rs:1562-1923): pure-core halves
# =============================================================================================


def _drain(core: Core, max_passes: int, index=None, arrivals=None):
    """An offline driver: submit arrivals due at ``now``, run passes back to back, jump to the
    next arrival when idle.  Returns the number of emitted (non-rejected) signals."""
    arrivals = sorted(arrivals or [], key=lambda a: a[0])
    now = 0.0
    tokens = 0
    for _ in range(max_passes):
        while arrivals and arrivals[0][0] <= now:
            core.receive(arrivals.pop(0)[1])
        if core.is_empty():
            if not arrivals:
                break
            now = arrivals[0][0]
            continue
        p = core.execute(now)
        tokens += sum(1 for s in p.output_signals if not s.rejected)
        if index is not None:
            index.apply(p.kv_events)
        now = max(p.end_ms, now)
    assert core.is_empty() and not arrivals
    return tokens


@pytest.mark.parametrize(
    "use_shared_tokens,enable_prefix_caching,enable_chunked_prefill",
    [(s, p, c) for c in (False, True) for s in (False, True) for p in (False, True)],
    ids=[f"case_{i}" for i in range(1, 9)],
)
def test_scheduler_token_generation_patterns(use_shared_tokens, enable_prefix_caching, enable_chunked_prefill):
    """tests.rs:1562-1633 (scaled-down pure-core port).  VLLM-15, VLLM-16, VLLM-23, VLLM-25.

    Upstream: 200 random requests of 1000 tokens x 100 outputs on 500 blocks of
    64, through the live scheduler.  Here: 24 requests of 100 tokens x 10
    outputs on 40 blocks of 16 (tight enough to preempt), seeded tokens, an
    offline pass loop.  Same assertions: every token arrives, the KV ends
    idle, router events apply without errors, Stored events exist iff prefix
    caching is on.
    """
    rng = random.Random(1000 * use_shared_tokens + 10 * enable_prefix_caching + enable_chunked_prefill)
    core = Core(
        args(
            num_gpu_blocks=40,
            block_size=16,
            speedup_ratio=1000.0,
            enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill,
        ),
        capture_kv_events=True,
    )
    n, input_len, max_out = 24, 100, 10
    shared = [rng.randrange(50_000) for _ in range(input_len // 2)] if use_shared_tokens else None
    for i in range(n):
        if shared is not None:
            tokens = shared + [rng.randrange(50_000) for _ in range(input_len // 2)]
        else:
            tokens = [rng.randrange(50_000) for _ in range(input_len)]
        core.receive(request(u(1 + i), tokens, max_out))
    index = RouterIndex()
    assert _drain(core, 5000, index) == n * max_out
    m = core.metrics()
    assert m.active_decode_blocks == 0 and m.gpu_cache_usage_perc == 0.0 and m.total_blocks > 0
    index.assert_no_event_errors()
    if enable_prefix_caching:
        assert index.stored_ok > 0
    else:
        assert index.stored_ok == 0 and index.removed_ok == 0


def test_cache_hit_rate_with_identical_requests():
    """tests.rs:1669-1733 (pure-core port).  VLLM-6, VLLM-10, VLLM-25.

    10 identical 65-token requests arriving 100 ms apart, 10 outputs each: every
    token arrives and the worker ends idle (upstream's assertions).  Derived by
    hand: each request finishes long before the next arrives, so from the second
    on the prompt's one full block is an inactive cache hit and the admission
    reports 64 reused tokens.
    """
    core = Core(args(num_gpu_blocks=100, block_size=64, speedup_ratio=10.0))
    tokens = list(range(65))
    arrivals = [(100.0 * i, request(u(1 + i), tokens, 10)) for i in range(10)]
    reused = []

    real_execute = core.execute

    def execute(now, collector=None):
        p = real_execute(now, collector)
        reused.extend(a.reused_input_tokens for a in p.admissions)
        return p

    core.execute = execute
    assert _drain(core, 1000, arrivals=arrivals) == 100
    m = core.metrics()
    assert m.active_decode_blocks == 0 and m.gpu_cache_usage_perc == 0.0 and m.total_blocks > 0
    assert reused == [0] + [64] * 9


def test_live_scheduler_forwards_buffered_kv_token_ids():
    """tests.rs:1788-1842 (core half).  VLLM-18: with ``zmq_kv_events_port`` set, Stored events
    carry the token ids of every stored block."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=12,
            max_num_batched_tokens=8,
            max_num_seqs=1,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            speedup_ratio=1000.0,
            zmq_kv_events_port=12345,
        ),
        capture_kv_events=True,
    )
    core.receive(request(u(72), range(0, 8), 1))
    p = core.execute(0.0)
    assert p.output_signals[0].completed
    stored = next(e.data.token_ids for e in p.kv_events if isinstance(e.data, KvStored))
    assert stored
    assert all(len(block) > 0 for block in stored)


def test_stored_events_carry_token_ids_only_with_a_kv_events_port():
    """VLLM-18, SEQ-3, SEQ-6: a Stored event carries the stored blocks' tokens only when
    ``zmq_kv_events_port`` is set (and prefix caching is on); otherwise ``token_ids`` is None.
    By hand: the prompt 0..7 in blocks of 4 is stored in one pass as the blocks (0, 1, 2, 3) and
    (4, 5, 6, 7); the one output token fills no block."""
    def stored(**kw):
        core = Core(args(block_size=4, num_gpu_blocks=12, max_num_batched_tokens=8, max_num_seqs=1,
                         enable_chunked_prefill=True, enable_prefix_caching=True, speedup_ratio=1000.0, **kw),
                    capture_kv_events=True)
        core.receive(request(u(73), range(0, 8), 1))
        p = core.execute(0.0)
        assert p.output_signals[0].completed
        return [e.data.token_ids for e in p.kv_events if isinstance(e.data, KvStored)]

    assert stored() == [None]
    assert stored(zmq_kv_events_port=12345) == [((0, 1, 2, 3), (4, 5, 6, 7))]


def test_live_pathological_load_no_router_event_errors():
    """tests.rs:1844-1922 (pure-core port).  VLLM-15, VLLM-18: 8 identical 8-token requests on a
    6-block pool (heavy sharing and preemption): all 32 tokens arrive, events apply cleanly."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=8,
            max_num_seqs=3,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            speedup_ratio=1000.0,
        ),
        capture_kv_events=True,
    )
    for i in range(8):
        core.receive(request(u(500 + i), [42] * 8, 4))
    index = RouterIndex()
    assert _drain(core, 2000, index) == 32
    index.assert_no_event_errors()
    assert index.stored_ok > 0


# =============================================================================================
# mod forward_pass_metrics (tests.rs:1925-2357)
# =============================================================================================


def fpm_args(**kw):
    """tests.rs:1913-1925."""
    base = dict(
        block_size=4,
        num_gpu_blocks=16,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        speedup_ratio=0.0,
    )
    base.update(kw)
    return args(**base)


def test_fpm_single_prefill_request():
    """tests.rs:1927-1950.  VLLM-19: one prefill of 8 tokens, nothing queued, positive wall time."""
    core = Core(fpm_args())
    core.receive(request(u(1), range(0, 8), 1))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests == 1
    assert fpm.sum_prefill_tokens == 8
    assert fpm.sum_prefill_kv_tokens == 0
    assert fpm.num_decode_requests == 0
    assert fpm.num_queued_prefill == 0
    assert fpm.num_queued_decode == 0
    assert fpm.wall_time_secs > 0.0


def test_fpm_prefill_and_decode_mixed_batch():
    """tests.rs:1952-1996.  VLLM-19: pass 2 holds r1's decode and r2's 4-token prefill."""
    core = Core(fpm_args())
    r1, r2 = u(1), u(2)
    core.receive(request(r1, range(0, 4), 3))
    fpm1 = core.execute(0.0).fpm
    assert fpm1.num_prefill_requests == 1
    assert fpm1.sum_prefill_tokens == 4
    core.receive(request(r2, range(100, 104), 3))
    fpm2 = core.execute(1.0).fpm
    assert fpm2.num_prefill_requests == 1
    assert fpm2.num_decode_requests == 1
    assert fpm2.sum_prefill_tokens == 4
    assert fpm2.sum_decode_kv_tokens > 0
    assert fpm2.sum_decode_kv_tokens == 5  # hand-derived: r1's length at schedule time, 4 + 1


def test_fpm_completed_requests_metrics_correct():
    """tests.rs:1998-2028.  VLLM-19: a request completing in the pass still reports its prefill
    (captured at schedule time)."""
    core = Core(fpm_args())
    core.receive(request(u(1), range(0, 4), 1))
    p = core.execute(0.0)
    assert p.fpm.num_prefill_requests == 1
    assert p.fpm.sum_prefill_tokens == 4
    assert p.completed_requests > 0


def test_fpm_completed_decode_request_has_kv_context():
    """tests.rs:2030-2073.  VLLM-19: the completing decode reports its KV context (5 = 4 + 1)."""
    core = Core(fpm_args())
    core.receive(request(u(1), range(0, 4), 2))
    core.execute(0.0)
    fpm2 = core.execute(1.0).fpm
    assert fpm2.num_decode_requests == 1
    assert fpm2.sum_decode_kv_tokens > 0
    assert fpm2.sum_decode_kv_tokens == 5


def test_fpm_queued_requests():
    """tests.rs:2075-2121.  VLLM-19, VLLM-13.

    Upstream only asserts that something is scheduled.  Derived by hand: r1
    (2 blocks) is admitted with the whole 8-token budget; r2 is then gated by
    the budget-free capacity check (2 + 2 <= 4 fits) and blocked by the zero
    budget, so it stays queued as a prefill.
    """
    core = Core(fpm_args(num_gpu_blocks=4, max_num_batched_tokens=8, max_num_seqs=2))
    core.receive(request(u(1), range(0, 8), 1))
    core.receive(request(u(2), range(100, 108), 1))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests + fpm.num_decode_requests >= 1
    assert (fpm.num_prefill_requests, fpm.num_queued_prefill, fpm.sum_queued_prefill_tokens) == (1, 1, 8)


def test_fpm_var_prefill_length_with_multiple_requests():
    """tests.rs:2123-2166.  VLLM-19: population variance of prompt lengths [4, 12] is 16."""
    core = Core(fpm_args(num_gpu_blocks=32, max_num_batched_tokens=32))
    core.receive(request(u(1), range(0, 4), 1))
    core.receive(request(u(2), range(100, 112), 1))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests == 2
    assert abs(fpm.var_prefill_length - 16.0) < 1e-6


def test_fpm_chunked_prefill_reports_chunk_not_full_prompt():
    """tests.rs:2168-2233.  VLLM-19, VLLM-6, VLLM-9: a 16-token prompt in two 8-token chunks."""
    core = Core(fpm_args(max_num_batched_tokens=8))
    core.receive(request(u(1), range(0, 16), 2))
    fpm1 = core.execute(0.0).fpm
    assert fpm1.num_prefill_requests == 1
    assert 0 < fpm1.sum_prefill_tokens <= 8
    fpm2 = core.execute(1.0).fpm
    assert fpm2.num_prefill_requests == 1
    assert fpm2.sum_prefill_tokens <= 8
    assert fpm1.sum_prefill_tokens + fpm2.sum_prefill_tokens == 16
    assert fpm1.var_prefill_length == 0.0
    assert fpm2.var_prefill_length == 0.0
    assert fpm2.sum_prefill_kv_tokens == 8  # the second chunk's prefix is the first chunk


def test_fpm_preemption_creates_queued_decode():
    """tests.rs:2235-2299.  VLLM-19, VLLM-15, VLLM-16.

    Upstream's assertions are conditional.  Derived by hand: after 3 passes r1
    holds 2 blocks (4 + 3 tokens); r2 (16 tokens, 4 blocks) fits the 4 free
    blocks and is admitted, filling the pool.  In the emission r1's 8th token
    needs no block, but r2's first token (the 17th) opens a new block, the
    allocation fails and LIFO preempts r2 itself (VLLM-14): the snapshot shows
    one prefill (r2), one decode (r1) and r2 queued as a decode with
    P + G = 16 KV tokens.
    """
    core = Core(fpm_args(num_gpu_blocks=6, max_num_batched_tokens=32, max_num_seqs=3, preemption_mode="lifo"))
    core.receive(request(u(1), range(0, 4), 20))
    core.execute(0.0)
    core.execute(1.0)
    core.execute(2.0)
    core.receive(request(u(2), range(100, 116), 5))
    p = core.execute(3.0)
    fpm = p.fpm
    if fpm.num_queued_prefill + fpm.num_queued_decode > 0 and fpm.num_queued_decode > 0:
        assert fpm.sum_queued_decode_kv_tokens > 0
    assert fpm.num_prefill_requests + fpm.num_decode_requests >= 1
    assert (fpm.num_prefill_requests, fpm.num_decode_requests) == (1, 1)
    assert (fpm.num_queued_prefill, fpm.num_queued_decode, fpm.sum_queued_decode_kv_tokens) == (0, 1, 16)
    assert core.req(u(2)).status is RequestStatus.PREEMPTED
    assert p.metrics.vllm_preemptions_total == 1


def test_fpm_sent_through_sink():
    """tests.rs:2301-2357 (core half).  VLLM-19: the first pass's snapshot reports the prefill
    (publishing through a sink is the live loop's job)."""
    core = Core(fpm_args())
    core.receive(request(u(1), range(0, 8), 2))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests == 1
    assert fpm.sum_prefill_tokens > 0
    assert fpm.wall_time_secs > 0.0


# =============================================================================================
# Rule tests: rules and reproduced quirks that no upstream test isolates (expected values derived
# by hand in each docstring)
# =============================================================================================


def test_new_core_state_request_keys_and_construction():
    """VLLM-1, VLLM-3: an empty core; request keys come from the ids (the UUID's integer, else
    XXH3-128 of the id); vLLM keeps ``max_output_tokens``; an empty prompt is vacuously prebuilt;
    the vLLM core refuses an SGLang engine type."""
    import xxhash

    from model import vllm_core as vc
    from model.errors import InternalInvariantBroken

    core = Core(make_args())
    v = core.value
    assert (v.requests, tuple(v.waiting), tuple(v.running), v.preemptions_total) == (pmap(), (), (), 0)
    assert v.ledger.capacity_generation == 0 and v.destination_reservation_attempts == 0
    assert vc.request_key(rid(u(5))) == 5
    assert vc.request_key(rid("abc")) == xxhash.xxh3_128_intdigest(b"abc")
    core.receive(request(u(5), range(0, 6), 1000))
    req = core.req(u(5))
    assert req.sequence.request_key == 5
    assert req.sequence.max_output_tokens == 1000  # no clamp under vLLM (TRT-1 is TRT-LLM only)
    assert (req.status, req.num_computed_tokens, req.num_preemptions) == (RequestStatus.WAITING, 0, 0)
    assert core.waiting == [u(5)]
    empty = VllmRequest(rid("e"), seqm.new_sequence(7, (), 1, block_size=4), RequestStatus.WAITING)
    assert empty.prompt_is_prebuilt()
    with pytest.raises(InternalInvariantBroken):
        vc.new_vllm_core(args(engine_type="sglang"))


def test_s17_empty_prompts_pass_the_pending_gate_and_reserve_without_transfer():
    """Upstream S17 (spec/model-checking.md §6), VLLM-1, VLLM-Q3, VLLM-20. Derived by hand on a
    decode core of 3 blocks of 4 tokens: X (8 tokens) reserves 2 blocks, so Y (8 tokens) stays the
    pending head. F (2 tokens, 1 output: one block) arrives before the empty E. While Y is
    pending only prebuilt requests are admitted: E, vacuously prebuilt, is admitted ahead of the
    older F, and F waits even after E has finished and its block is free again; without Y, F is
    admitted in the first pass. An empty reservation at the head of a full pool is reserved at
    once, with 0 transferable tokens."""

    def decode_core(blocks):
        return Core(args(block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=16, max_num_seqs=4,
                         enable_chunked_prefill=True, enable_prefix_caching=False, worker_type="decode",
                         speedup_ratio=0.0))

    def setup(with_pending):
        core = decode_core(3)
        assert len(core.reserve(u(1), request(u(11), range(0, 8), 2)).lifecycle_events) == 1
        if with_pending:
            assert core.reserve(u(2), request(u(12), range(100, 108), 2)).lifecycle_events == ()
        core.receive(request(u(13), range(200, 202), 1))  # F
        core.receive(request(u(14), (), 2))  # E
        return core

    core = setup(with_pending=True)
    assert core.waiting == [u(13), u(14)]
    first = core.execute(0.0)
    assert [a.uuid.value for a in first.admissions] == [u(14)]
    for now in (1.0, 2.0, 3.0):
        core.execute(now)
    assert rid(u(14)) not in core.requests and core.waiting == [u(13)]
    assert core.num_active_blocks() == 2  # X's reservation only: F would fit in the free block
    assert core.destination_is_held(u(2))

    control = setup(with_pending=False)
    assert [a.uuid.value for a in control.execute(0.0).admissions][:1] == [u(13)]

    full = decode_core(2)
    full.reserve(u(1), request(u(11), range(0, 8), 2))
    (ev,) = full.reserve(u(3), request(u(15), (), 2)).lifecycle_events
    assert isinstance(ev, DestinationReserved) and ev.transferable_prompt_tokens == 0
    assert full.num_active_blocks() == 2


def _fifo_lifo_scenario(mode):
    """Pass 0 seeds a cached block (S); pass 1 admits A (4 tokens), B (a 4-token chunk of 16) and,
    with the budget spent, the fully cached D (VLLM-Q7).  5 of 6 blocks are then held (A 2, B 1,
    D 2).  In pass 2, B's next chunk (7 tokens, 2 new blocks) gets 1 block and preemption runs."""
    core = Core(
        args(
            block_size=4,
            num_gpu_blocks=6,
            max_num_batched_tokens=8,
            max_num_seqs=4,
            enable_prefix_caching=True,
            preemption_mode=mode,
            speedup_ratio=0.0,
        )
    )
    core.receive(request("S", range(500, 504), 1))
    core.execute(0.0)
    for name, tokens, max_out in [("A", range(0, 4), 50), ("B", range(100, 116), 5), ("D", range(500, 504), 5)]:
        core.receive(request(name, tokens, max_out))
    first = core.execute(1.0)
    assert [(a.uuid.value, a.reused_input_tokens) for a in first.admissions] == [("A", 0), ("B", 0), ("D", 4)]
    assert [s.uuid.value for s in first.output_signals] == ["A", "D"]
    assert core.running == ["A", "B", "D"] and core.num_active_blocks() == 5
    return core, core.execute(2.0)


def test_fifo_preemption_skips_the_request_after_the_current_one():
    """VLLM-Q1, VLLM-8, VLLM-5.  FIFO pops A (index 0, already scheduled: its work and budget are
    undone); B slides to index 0 and succeeds; ``i += 1`` then skips D, which slid into index 1:
    D gets no work and no token although one budget token is left.  The snapshot holds B only."""
    core, p = _fifo_lifo_scenario("fifo")
    assert p.output_signals == ()
    assert core.running == ["B", "D"] and core.waiting == ["A"]
    assert core.req("A").status is RequestStatus.PREEMPTED
    assert (core.req("D").num_computed_tokens, len(core.req("D").sequence)) == (4, 5)
    assert core.req("B").num_computed_tokens == 11
    assert (p.fpm.num_prefill_requests, p.fpm.num_decode_requests) == (1, 0)
    assert p.metrics.vllm_preemptions_total == 1


def test_lifo_preemption_victim_is_the_unscheduled_back():
    """VLLM-8, VLLM-15 (contrast with VLLM-Q1).  LIFO pops D from the back (not yet scheduled, so
    nothing is undone); A keeps its decode token and emits; B gets its chunk; D waits at the
    front; no admission follows a scheduling-phase preemption."""
    core, p = _fifo_lifo_scenario("lifo")
    assert [s.uuid.value for s in p.output_signals] == ["A"]
    assert core.running == ["A", "B"] and core.waiting == ["D"]
    assert core.req("D").status is RequestStatus.PREEMPTED
    assert (p.fpm.num_prefill_requests, p.fpm.num_decode_requests) == (1, 1)
    assert p.admissions == ()


def test_zero_budget_admission_rejects_then_admits_a_fully_cached_prompt():
    """VLLM-Q7, VLLM-12, VLLM-18.  A takes the whole 4-token budget; the waiting loop goes on:
    the oversized O (28 tokens = 7 > 6 blocks) is rejected, and D, whose 4-token prompt is one
    cached block, is admitted with ``used = 0`` and emits in the same pass.  Only A's prompt
    enters the prefill batch; the rejection signal comes last."""
    core = Core(
        args(block_size=4, num_gpu_blocks=6, max_num_batched_tokens=4, max_num_seqs=4,
             enable_prefix_caching=True, speedup_ratio=0.0)
    )
    core.receive(request("S", range(500, 504), 1))
    core.execute(0.0)
    core.receive(request("A", range(0, 4), 3))
    core.receive(request("O", range(1000, 1028), 1))
    core.receive(request("D", range(500, 504), 2))
    p = core.execute(1.0)
    assert [(a.uuid.value, a.reused_input_tokens) for a in p.admissions] == [("A", 0), ("D", 4)]
    assert [(s.uuid.value, s.rejected) for s in p.output_signals] == [("A", False), ("D", False), ("O", True)]
    assert (p.fpm.num_prefill_requests, p.fpm.sum_prefill_tokens, p.fpm.num_decode_requests) == (1, 4, 1)


def test_resubmitted_id_revives_its_stale_waiting_entry():
    """VLLM-Q8, VLLM-2, VLLM-19.  One running slot (X).  p (a registered source) and Y wait;
    cancelling p's source drops it but leaves its deque entry; submitting p again appends a second
    entry.  The old entry is live again: the snapshot counts three queued prefills for two waiting
    requests, and p is admitted before Y."""
    core = Core(args(block_size=4, num_gpu_blocks=16, max_num_seqs=1, speedup_ratio=0.0))
    core.receive(request("X", range(0, 4), 5))
    core.execute(0.0)
    core.submit_prefill("h", request("p", range(10, 14), 2))
    core.receive(request("Y", range(20, 24), 2))
    assert core.cancel_source("h") == APPLIED
    core.receive(request("p", range(30, 34), 2))
    assert [x.value for x in core.value.waiting] == ["p", "Y", "p"]
    p = core.execute(1.0)
    assert (p.fpm.num_queued_prefill, p.metrics.waiting_requests) == (3, 2)
    order = []
    now = 2.0
    while len(order) < 2:
        order += admitted(core.execute(now))
        now += 1.0
    assert order == ["p", "Y"]


def test_zero_max_output_tokens_never_completes():
    """VLLM-Q4, VLLM-14.  The prompt is computed in pass 1; the request is then never ready: no
    token, no completion, and later passes do no timed work (``end == now``)."""
    core = Core(make_args())
    core.receive(request("z", range(0, 4), 0))
    first = core.execute(0.0)
    assert first.output_signals == () and first.end_ms > 0.0
    for now in (10.0, 11.0, 12.0):
        p = core.execute(now)
        assert p.output_signals == () and p.end_ms == now
    assert core.req("z").num_computed_tokens == 4 and not core.is_empty()


def test_final_token_allocation_can_preempt_the_request_itself():
    """VLLM-Q6, VLLM-16, VLLM-15.  One block of 4: the 4-token prompt fills it; the only (final)
    token starts a new block (L = 5), its Use fails before the cleanup could free anything, and
    LIFO preempts the request itself: no token, one preemption, the request back at the front."""
    core = Core(args(block_size=4, num_gpu_blocks=1, max_num_batched_tokens=8, max_num_seqs=1,
                     enable_prefix_caching=False, speedup_ratio=0.0))
    core.receive(request("f", range(0, 4), 1))
    p = core.execute(0.0)
    assert p.output_signals == ()
    assert p.metrics.vllm_preemptions_total == 1
    assert core.waiting == ["f"] and core.req("f").status is RequestStatus.PREEMPTED
    assert core.num_active_blocks() == 0


def test_trtllm_failed_allocation_keeps_partial_blocks_without_preempting():
    """VLLM-Q2, TRT-3, VLLM-8, VLLM-9.  A state built directly (as upstream's
    test_running_request_catches_up_decode_tail_before_promote does): TRT-LLM, 4 blocks of 4,
    prefix caching on; block [500..503] is cached (inactive) and the 3 other slots are held by a
    foreign allocation.  Running X (prompt 500..507, nothing computed) re-activates the cached
    block but gets no slot for its second: no preemption (TRT-3), ``actual = 4 = E`` so
    ``used = 0`` and the request is Blocked, keeping the re-activated block, which the cost model
    now counts as an *active* cached prefix."""
    core = Core(args(engine_type="trtllm", block_size=4, num_gpu_blocks=4, max_num_batched_tokens=16,
                     max_num_seqs=4, enable_prefix_caching=True, speedup_ratio=0.0))
    core.receive(request("S", range(500, 504), 1))
    core.execute(0.0)
    assert core.is_empty() and kvm.num_inactive_blocks(core.value.kv) == 1
    kv = core.value.kv
    foreign = seqm.new_sequence(999, tuple(range(2000, 2012)), 1, block_size=4)
    _, use = seqm.take_creation_signal(foreign)
    kv, res = kvm.process(kv, use)
    assert res.count == 3
    seq = seqm.new_sequence(4242, tuple(range(500, 508)), 4, block_size=4)
    r = rid("X")
    state = VllmRequest(r, seq, RequestStatus.RUNNING)
    core.install_running(kv, [state])
    p = core.execute(1.0)
    x = core.req("X")
    assert p.output_signals == () and p.metrics.vllm_preemptions_total == 0
    assert (x.num_computed_tokens, x.sequence.num_allocated_tokens) == (4, 4)
    assert core.num_active_blocks() == 4
    assert kvm.get_prefill_cost(core.value.kv, x.sequence).active_cached_tokens == 4
    assert (p.fpm.num_prefill_requests, p.fpm.num_decode_requests) == (0, 0)



def test_fifo_victim_scheduled_with_prompt_tokens_leaves_the_prefill_batch():
    """VLLM-8 (the undo of a victim's prompt work), VLLM-15, VLLM-9, VLLM-18.  No replay reaches
    this (spec/fidelity.md §1, *Reach*), so the state is built directly: vLLM with ``fifo``, 5
    blocks of 4, a 16-token budget, chunked prefill, no prefix caching; running V (12-token
    prompt) then F (20-token prompt), each with 4 tokens computed in its one block.  V's chunk
    (tokens 4..12) takes 2 of the 3 free blocks and 8 of the budget; F's chunk (4..12, the other
    8) needs 2 and gets 1, so FIFO preempts the front, V, which was already scheduled: its 8
    tokens go back to the budget and its prompt work leaves the batch.  F's retry gets V's freed
    blocks.  The batch is then F alone (count 1, isl 4 + 8 = 12, prefix 4); no request finishes
    its prompt, so no decode time is added."""
    a = args(block_size=4, num_gpu_blocks=5, max_num_batched_tokens=16, max_num_seqs=4,
             enable_chunked_prefill=True, enable_prefix_caching=False, preemption_mode="fifo")
    core = Core(a)
    kv = core.value.kv
    reqs = []
    for name, key, prompt in (("V", 7001, range(0, 12)), ("F", 7002, range(100, 120))):
        seq, use = seqm.allocate_blocks_for_chunk(seqm.new_sequence(key, tuple(prompt), 2, block_size=4), 4)
        kv, res = kvm.process(kv, use)
        assert res.count == 1
        reqs.append(VllmRequest(rid(name), seq, RequestStatus.RUNNING, 4))
    core.install_running(kv, reqs)
    assert core.num_active_blocks() == 2
    p = core.execute(0.0)
    assert p.metrics.vllm_preemptions_total == 1
    assert core.running == ["F"] and core.waiting == ["V"]
    assert core.req("F").num_computed_tokens == 12
    alone = timing.prefill_duration_ns(1, 12, 4, a)
    both = timing.prefill_duration_ns(2, 24, 8, a)  # what the batch would be without the undo
    assert alone != both
    assert p.end_ms == timing.advance_ms(0.0, alone)
    assert p.fpm.num_prefill_requests == 1


def test_dropping_a_request_that_never_allocated_does_not_bump_the_generation():
    """VLLM-17, VGEN-1: cancelling a pending source that is still waiting (no pass ran, so it holds
    no block and is no running member) frees nothing and leaves the capacity generation at 0. A
    40-token source with an 8-token chunked budget is still prefilling after one pass: it holds
    blocks and runs, so its cancel bumps the generation (the pass itself bumps nothing: it neither
    frees nor preempts)."""
    core = Core(args(worker_type="prefill", block_size=4, num_gpu_blocks=64, max_num_batched_tokens=8,
                     enable_chunked_prefill=True))
    core.submit_prefill(u(1), request(u(11), range(0, 40), 1))
    assert core.cancel_source(u(1)) == APPLIED
    assert core.is_drained() and core.value.ledger.capacity_generation == 0
    core.submit_prefill(u(2), request(u(12), range(0, 40), 1))
    core.execute(0.0)
    assert core.running == [u(12)] and core.num_active_blocks() == 2
    before = core.value.ledger.capacity_generation
    assert before == 0
    assert core.cancel_source(u(2)) == APPLIED and core.value.ledger.capacity_generation == before + 1
