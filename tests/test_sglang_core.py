"""Ports of lib/mocker/src/scheduler/sglang/tests.rs: the SGLang engine core.

Each test is named after the upstream test and cites the rules it covers
(spec/sglang-core.md; command rules CMD-n / RETRY-n are spec/core-commands.md).
Expected values are upstream's assertions, or derived by hand in a comment.

Adaptations, where upstream reads something the model does not have:

* requests need ids in the model (CMD-1), so upstream's ``uuid: None`` requests get ``u(n)``;
* tests that call a pass step directly (``get_new_batch_prefill``,
  ``check_decode_mem``, ``simulate_decode_step``, ``apply_schedule_policy``,
  ``cache_materialized_prefix``) run the same step of the model's pass on a
  working copy (:class:`Kit`) with the queues and KV manager the test builds;
* router events carry no worker id in the model (a driver wraps them), so only
  the dp rank is checked;
* live-scheduler tests (tokio) are ported as their pure-core half, driven by an
  explicit pass loop instead of the async runtime;
* MTP (``aic_nextn``) is out of scope (spec/sglang-core.md §8): its two tests
  are not applicable; the lifecycle half of the second runs with burst 1.
"""

from __future__ import annotations

import attrs
import pytest

from core_helpers import Collector, Core, RouterIndex, args, removed_event_count, request, stored_hashes, u
from model import sglang_kv as skv
from model.engine_args import EngineArgs, SchedulePolicy, SglangArgs
from model.errors import DestinationPromptTooLarge, RequestAlreadyActive
from model.hashing import block_hashes
from model.ids import hid, rid
from model.kv_events import KvStored
from model.protocol import (
    APPLIED,
    NOOP,
    ActivateDestination,
    CancelDestination,
    DestinationAccepted,
    DestinationReserved,
    ReserveDestination,
    SourceHeld,
    Submit,
    SubmitHandoffPrefill,
    Submitted,
)
from model.sglang_core import SglangCore, _Txn, new_sglang_core
from model.sglang_request import SglangRequest, ceil_to_block, new_request, output_token, siphash13, uuid_bytes

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def sg_args(**kw) -> EngineArgs:
    kw.setdefault("engine_type", "sglang")
    if isinstance(kw.get("sglang"), dict):
        kw["sglang"] = SglangArgs(**kw["sglang"])
    return args(**kw)


def test_args(num_gpu_blocks, block_size, chunked_prefill_size) -> EngineArgs:
    """tests.rs:38-55."""
    return sg_args(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        speedup_ratio=1.0,
        sglang={"page_size": block_size, "chunked_prefill_size": chunked_prefill_size},
    )


test_args.__test__ = False  # a helper, not a test


class SgCore(Core):
    """``Core`` with the SGLang views upstream tests read (``core.waiting``, ``core.running``...)."""

    @property
    def waiting(self):
        return [r.uuid.value for r in self.value.waiting]

    @property
    def running(self):
        return [r.uuid.value for r in self.value.running]

    def running_requests(self):
        return list(self.value.running)

    def occupied_tokens(self) -> int:
        kv = self.value.kv
        return kv.total_tokens - kv.available_tokens

    def prebuilt_request(self, uuid):
        for r in self.value.prebuilt_ready:
            if r.uuid == rid(uuid):
                return r
        return None

    def destination_indices(self, handoff):
        held = self.value.ledger.destination_holds.get(hid(handoff))
        return () if held is None else held.kv.indices

    def evict(self, n: int) -> None:
        kv, _ = skv.evict(self.value.kv, n)
        self.value = attrs.evolve(self.value, kv=kv)

    def num_active_blocks(self) -> int:
        return self.value.metrics().active_decode_blocks

    def execute_internal(self, now_ms):
        return self.execute(now_ms)


class Kit:
    """One pass step run on a working copy with test-built queues (upstream calls the step's
    function directly on its own ``waiting`` / ``running`` / ``kv_manager``)."""

    def __init__(self, engine_args: EngineArgs, total_tokens=None, page_size=None, publish=False, **config):
        core = new_sglang_core(engine_args)
        if config:
            core = attrs.evolve(core, config=attrs.evolve(core.config, **config))
        if total_tokens is not None:
            core = attrs.evolve(core, kv=skv.new_kv_manager(total_tokens, page_size, publish_events=publish))
        self.core = core
        self.events = []

    @property
    def kv(self):
        return self.core.kv

    def _run(self, waiting, running, fn, ratio=None):
        core = self.core
        if ratio is not None:
            core = attrs.evolve(core, new_token_ratio=ratio)
        txn = _Txn(core)
        txn.waiting = waiting if waiting is not None else []
        txn.running = running if running is not None else []
        out = fn(txn)
        self.core = attrs.evolve(self.core, kv=txn.kv.freeze())
        self.events.extend(txn.kv.events)
        return txn, out

    def drain(self):
        out, self.events = self.events, []
        return out

    def allocate_for_request(self, tokens):
        kv, res = skv.allocate_for_request(self.core.kv, tokens)
        self.core = attrs.evolve(self.core, kv=kv)
        self.events.extend(res.events)
        return res.value

    def get_new_batch_prefill(self, waiting, ratio, running=()):
        """``get_new_batch_prefill``: ``waiting`` (a list) is changed in place."""
        running = list(running)
        _, out = self._run(waiting, running, lambda t: t.get_new_batch_prefill(), ratio)
        return out

    def cache_materialized_prefix(self, req):
        return self._run([], [], lambda t: t.cache_materialized_prefix(req))[1]

    def check_decode_mem(self, running):
        return self._run([], running, lambda t: t.check_decode_mem(1))[1]

    def simulate_decode_step(self, running, now_ms):
        """Upstream's test-only ``simulate_decode_step``: the decode step, then completion cleanup."""

        def step(t):
            d = t.decode_step(now_ms)
            for req in d.completed:
                t.cleanup_completed_request(req)
            running[:] = t.running
            return d

        return self._run([], running, step)[1]

    def apply_schedule_policy(self, waiting):
        txn, _ = self._run(waiting, [], lambda t: t.apply_schedule_policy())
        return txn.waiting

    def make_decoded_request(self, prompt, max_output_tokens, uuid):
        """tests.rs:68-90: allocate the prompt, decode one token."""
        alloc = self.allocate_for_request(prompt)
        req = attrs.evolve(
            new_request(rid(uuid), prompt, max_output_tokens),
            last_node=alloc.last_node,
            kv_indices=alloc.kv_indices,
            materialized_tokens=len(prompt),
            allocated_tokens=ceil_to_block(len(prompt), self.core.config.block_size),
        )
        running = [req]
        result = self.simulate_decode_step(running, 0.0)
        assert len(result.signals) == 1
        return running.pop()


def sreq(uuid, prompt, max_out, **fields) -> SglangRequest:
    return attrs.evolve(new_request(rid(uuid), prompt, max_out), **fields)


def drive(core: SgCore, now=0.0, limit=100):
    passes = []
    for _ in range(limit):
        if core.is_empty():
            break
        p = core.execute(now)
        passes.append(p)
        now = p.end_ms
    return passes


# ---------------------------------------------------------------------------------------------
# source_holds (tests.rs:92-248)
# ---------------------------------------------------------------------------------------------


def holds_args(worker_type="prefill"):
    """tests.rs:95-110 / 254-269."""
    return sg_args(
        num_gpu_blocks=16,
        block_size=4,
        max_num_seqs=1,
        worker_type=worker_type,
        speedup_ratio=0.0,
        sglang={"page_size": 4, "chunked_prefill_size": 16},
    )


def holds_request(uuid):
    return request(uuid, range(8), 2)


def test_terminal_completion_holds_source_without_running_cleanup():
    """tests.rs:132-168.  SG-22, SGGEN-1, CMD-4: a registered source that completes is held with its
    KV (SourceHeld, no cleanup); release frees it once; a second release is a no-op."""
    core = SgCore(holds_args())
    request_id, handoff = u(301), u(401)
    core.submit_prefill(handoff, holds_request(request_id))
    first = core.execute(0.0)
    assert not first.output_signals[0].completed
    terminal = core.execute(first.end_ms)
    assert terminal.output_signals[0].completed
    assert [(type(e), e.handoff_id.value, e.request_id.value) for e in terminal.lifecycle_events] == [
        (SourceHeld, handoff, request_id)
    ]
    assert core.source_is_held(handoff)
    assert core.running == []
    held_tokens = core.occupied_tokens()
    core.release(handoff)
    assert not core.source_is_held(handoff)
    released = core.occupied_tokens()
    assert released < held_tokens
    core.release(handoff)
    assert core.occupied_tokens() == released


def test_cancel_and_early_release_cleanup_exactly_once():
    """tests.rs:170-213.  CMD-4, CMD-5, SGGEN-2: cancel of a held source frees once; an early
    release only detaches the registration (upstream S15)."""
    core = SgCore(holds_args())
    first_id = u(402)
    core.submit_prefill(first_id, holds_request(u(302)))
    first = core.execute(0.0)
    core.execute(first.end_ms)
    held_tokens = core.occupied_tokens()
    core.cancel_source(first_id)
    cancelled = core.occupied_tokens()
    assert cancelled < held_tokens
    core.cancel_source(first_id)
    assert core.occupied_tokens() == cancelled

    core.evict(cancelled)
    second_id = first_id
    core.submit_prefill(second_id, holds_request(u(303)))
    assert core.source_is_registered(second_id)
    core.release(second_id)
    assert not core.source_is_registered(second_id)
    first = core.execute(0.0)
    terminal = core.execute(first.end_ms)
    assert terminal.output_signals[0].completed
    assert not core.source_is_held(second_id)


def test_ordinary_completion_keeps_default_cleanup():
    """tests.rs:215-225.  SG-22: an ordinary completion keeps its full pages cached (8 tokens)."""
    core = SgCore(holds_args())
    core.receive(holds_request(u(306)))
    first = core.execute(0.0)
    terminal = core.execute(first.end_ms)
    assert terminal.output_signals[0].completed
    assert core.occupied_tokens() == 8


def test_active_request_id_is_rejected_before_source_hold_registration():
    """tests.rs:227-247.  CMD-1, SG-25: an active id is rejected before SRC-1 registers anything."""
    core = SgCore(holds_args())
    request_id, handoff = u(307), u(407)
    core.receive(holds_request(request_id))
    with pytest.raises(RequestAlreadyActive):
        core.apply(Submit(holds_request(request_id)))
    with pytest.raises(RequestAlreadyActive):
        core.apply(SubmitHandoffPrefill(handoff, holds_request(request_id)))
    assert not core.source_is_registered(handoff)
    assert core.num_requests() == 1


# ---------------------------------------------------------------------------------------------
# destination_lifecycle (tests.rs:250-800)
# ---------------------------------------------------------------------------------------------


def test_destination_lifecycle_is_counted_once_as_queued_decode():
    """tests.rs:282-365.  SG-6, SG-23, CMD-6, CMD-7, CMD-8: pending and reserved destinations count
    once in ``waiting_requests`` and as queued decodes of their prompt length; an activated one
    waiting for the running slot counts once as a queued decode."""
    core = SgCore(sg_args(num_gpu_blocks=6, block_size=4, max_num_seqs=1, worker_type="decode",
                          speedup_ratio=0.0, sglang={"page_size": 4, "chunked_prefill_size": 32}))
    held_handoff, held_uuid = u(33_001), u(33_002)
    held = core.reserve(held_handoff, request(held_uuid, [1] * 4, 1))
    assert len(held.lifecycle_events) == 1
    assert core.metrics().waiting_requests == 1
    snap = core.execute(0.0).fpm
    assert (snap.num_queued_decode, snap.sum_queued_decode_kv_tokens, snap.var_queued_decode_kv_tokens) == (1, 4, 0.0)

    pending_handoff = u(33_003)
    pending = core.reserve(pending_handoff, request(u(33_004), [2] * 24, 1))
    assert pending.lifecycle_events == ()
    assert core.metrics().waiting_requests == 2
    mixed = core.execute(0.0).fpm
    assert (mixed.num_queued_decode, mixed.sum_queued_decode_kv_tokens, mixed.var_queued_decode_kv_tokens) == (
        2, 28, 100.0)

    assert core.cancel_destination(pending_handoff).result == APPLIED
    assert core.metrics().waiting_requests == 1

    core.receive(request(u(33_005), [3] * 4, 2))
    blocker = core.execute(1.0)
    assert core.metrics().running_requests == 1
    assert core.activate(held_handoff) == APPLIED
    assert core.metrics().waiting_requests == 1

    activated_pass = core.execute(blocker.end_ms)
    activated = activated_pass.fpm
    assert activated.num_queued_prefill == 0
    assert (activated.num_queued_decode, activated.sum_queued_decode_kv_tokens) == (1, 4)

    completed = core.execute(activated_pass.end_ms).fpm
    assert (completed.num_queued_decode, completed.sum_queued_decode_kv_tokens) == (0, 0)
    assert core.metrics().waiting_requests == 0


def test_destination_transfer_footprint_excludes_decode_headroom():
    """tests.rs:367-394.  SG-31, SGQ-8: the transferable count is the page-padded prompt (10 -> 12),
    whatever the output length (no decode headroom, upstream S9)."""

    def footprint(max_out):
        core = SgCore(holds_args("decode"))
        eff = core.reserve(u(1), request(u(2), range(10), max_out))
        (event,) = eff.lifecycle_events
        assert isinstance(event, DestinationReserved)
        return event.transferable_prompt_tokens

    assert footprint(1) == 12
    assert footprint(128) == 12


def test_kv_blocked_live_scheduler_waits_and_cancel_wakes_it():
    """tests.rs:413-499 (live; its pure-core half).  SG-9, SG-23, CMD-8, ADM-1: while the reserved
    destination fills the pool... the fresh request cannot be admitted; a blocked pass does no work
    (``end_ms == now``, no admission) and shows the request as a queued prefill; cancelling the
    reservation lets it run.  (The live loop's "no repeated zero-work publishes" is a driver
    property, not modelled.)"""
    core = SgCore(sg_args(num_gpu_blocks=2, block_size=4, max_num_seqs=2, worker_type="decode",
                          speedup_ratio=1000.0, sglang={"page_size": 4, "chunked_prefill_size": 16}))
    handoff, reserved_uuid = u(30_001), u(30_002)
    accepted = core.reserve(handoff, request(reserved_uuid, [1] * 8, 1))
    assert accepted.result == DestinationAccepted(reserved_uuid)
    assert [e.handoff_id.value for e in accepted.lifecycle_events] == [handoff]

    blocked_uuid = u(30_003)
    core.receive(request(blocked_uuid, [2] * 4, 1))
    blocked = core.execute(5.0)
    assert blocked.fpm.num_queued_prefill > 0
    assert blocked.admissions == () and blocked.end_ms == 5.0 and blocked.output_signals == ()
    again = core.execute(5.0)
    assert again.admissions == () and again.end_ms == 5.0

    assert core.cancel_destination(handoff).result == APPLIED
    out = core.execute(5.0)
    assert any(s.uuid.value == blocked_uuid for s in out.output_signals)


def drive_source_to_hold(core: SgCore, handoff, req):
    assert isinstance(core.submit_prefill(handoff, req), Submitted)
    now = 0.0
    for _ in range(8):
        p = core.execute(now)
        now = p.end_ms
        if core.is_empty():
            break
    assert core.is_empty()
    assert core.source_is_held(handoff)
    assert not core.is_drained()


def test_handoff_prefill_to_reserved_decode_owns_kv_until_prebuilt_admission():
    """tests.rs:539-677.  SG-8, SG-31, SG-32, SGGEN-4, CMD-6, CMD-7: the reservation owns KV (and
    publishes nothing) until activation; activation publishes the prompt once; the activated
    request waits in ``prebuilt_ready`` while the single slot is busy and then runs on the
    reserved slots; everything drains with no lock left."""
    logical_uuid, handoff = u(20_001), u(20_002)
    logical_tokens = list(range(8))
    source = SgCore(holds_args("prefill"), capture_kv_events=True)
    destination = SgCore(holds_args("decode"), capture_kv_events=True)

    destination.receive(request(u(20_003), range(4), 1))
    destination.execute(0.0)
    assert destination.is_empty()
    destination.drain_kv_events()

    blocker_uuid = u(20_004)
    destination.receive(request(blocker_uuid, range(100, 104), 3))
    blocker_first = destination.execute(1.0)
    assert len(destination.running) == 1

    drive_source_to_hold(source, handoff, request(logical_uuid, logical_tokens, 2))

    before = destination.occupied_tokens()
    reserved = destination.reserve(handoff, request(logical_uuid, logical_tokens, 2))
    assert reserved.result == DestinationAccepted(logical_uuid)
    assert [(e.handoff_id.value, e.request_id.value, e.transferable_prompt_tokens)
            for e in reserved.lifecycle_events] == [(handoff, logical_uuid, 4)]
    assert destination.destination_is_held(handoff)
    assert not destination.is_drained()
    assert len(destination.running) == 1
    assert destination.occupied_tokens() > before
    assert stored_hashes(destination.drain_kv_events()) == []

    reserved_indices = destination.destination_indices(handoff)
    protected_before = destination.value.kv.protected_size
    assert reserved_indices
    assert destination.activate(handoff) == APPLIED
    ready = destination.prebuilt_request(logical_uuid)
    assert ready is not None and ready.kv_indices == reserved_indices
    assert len(destination.running) == 1
    assert destination.value.kv.protected_size >= protected_before
    activation_stores = stored_hashes(destination.drain_kv_events())
    assert activation_stores

    assert source.release(handoff) == APPLIED
    assert source.is_empty() and source.is_drained()

    blocked = destination.execute(blocker_first.end_ms)
    assert all(a.uuid.value != logical_uuid for a in blocked.admissions)
    ready = destination.prebuilt_request(logical_uuid)
    assert ready is not None and ready.kv_indices == reserved_indices
    assert not set(stored_hashes(blocked.kv_events)) & set(activation_stores)

    blocker_terminal = destination.execute(blocked.end_ms)
    assert all(a.uuid.value != logical_uuid for a in blocker_terminal.admissions)
    assert any(s.uuid.value == blocker_uuid and s.completed for s in blocker_terminal.output_signals)
    assert destination.prebuilt_request(logical_uuid) is not None

    admitted = destination.execute(blocker_terminal.end_ms)
    mine = [a for a in admitted.admissions if a.uuid.value == logical_uuid]
    assert len(mine) == 1 and mine[0].reused_input_tokens == 0
    running = next(r for r in destination.running_requests() if r.uuid.value == logical_uuid)
    assert running.kv_indices[: len(reserved_indices)] == reserved_indices
    assert not set(stored_hashes(admitted.kv_events)) & set(activation_stores)

    terminal = destination.execute(admitted.end_ms)
    assert any(s.uuid.value == logical_uuid and s.completed for s in terminal.output_signals)
    assert destination.is_empty() and destination.is_drained()
    assert not destination.destination_is_held(handoff)
    assert destination.value.kv.protected_size == 0


def test_destination_cancel_reaches_activated_request_exactly_once():
    """tests.rs:679-722.  SG-29, CMD-8: cancelling an activated, running destination removes it;
    a second cancel is ``Noop``."""
    core = SgCore(holds_args("decode"), capture_kv_events=True)
    request_id, handoff = u(20_101), u(20_102)
    eff = core.reserve(handoff, request(request_id, range(8), 4))
    assert [type(e) for e in eff.lifecycle_events] == [DestinationReserved]
    assert core.activate(handoff) == APPLIED
    core.execute(0.0)
    assert request_id in core.running
    assert core.cancel_destination(handoff).result == APPLIED
    assert core.is_empty() and core.is_drained()
    assert core.cancel_destination(handoff).result == NOOP


def test_activation_surplus_immediately_retries_pending_head():
    """tests.rs:724-799.  SGGEN-4, CMD-7, CMD-9, RETRY-1: activation returns the reservation's page
    padding to the pool, which bumps the generation, so the Applied activation's retry reserves
    the pending head at once."""
    core = SgCore(sg_args(num_gpu_blocks=3, block_size=4, max_num_seqs=1, worker_type="decode",
                          speedup_ratio=0.0, sglang={"page_size": 4, "chunked_prefill_size": 16}))
    kv, res = skv.allocate_decode_token(core.value.kv)
    blocker = res.value
    core.value = attrs.evolve(core.value, kv=kv)
    owner, follower, follower_request = u(20_201), u(20_202), u(20_203)
    assert len(core.reserve(owner, request(u(20_204), range(5), 2)).lifecycle_events) == 1
    assert core.reserve(follower, request(follower_request, range(100, 104), 2)).lifecycle_events == ()
    activated = core.effects(ActivateDestination(owner))
    assert [(e.handoff_id.value, e.request_id.value) for e in activated.lifecycle_events] == [
        (follower, follower_request)
    ]
    assert core.cancel_destination(follower).result == APPLIED
    assert core.cancel_destination(owner).result == APPLIED
    kv, _ = skv.free_indices(core.value.kv, [blocker])
    core.value = attrs.evolve(core.value, kv=kv)
    assert core.value.kv.available_tokens + core.value.kv.evictable_size == 12


# ---------------------------------------------------------------------------------------------
# scheduling (tests.rs:802-954)
# ---------------------------------------------------------------------------------------------


def test_sglang_scheduler_fifo_ordering():
    """tests.rs:805-856 (live; pure-core half).  SG-7, SG-10: five requests, three tokens each, all
    complete (15 signals)."""
    core = SgCore(sg_args(num_gpu_blocks=100, block_size=64, speedup_ratio=100.0))
    for i in range(5):
        core.receive(request(u(900 + i), [i] * 10, 3))
    signals = [s for p in drive(core) for s in p.output_signals]
    assert len(signals) == 15


def test_lpm_reorders_by_current_sequence_prefix_match():
    """tests.rs:858-905.  SG-10: LPM scores the whole current sequence (prompt and outputs)."""
    kit = Kit(sg_args(speedup_ratio=1.0), total_tokens=1000, page_size=1, schedule_policy=SchedulePolicy.LPM)
    tree = skv._Txn(kit.kv)
    tree.tree.insert((1, 2, 3, 4, 5), (0, 1, 2, 3, 4))
    kit.core = attrs.evolve(kit.core, kv=tree.freeze())
    no_match, match = u(1), u(2)
    waiting = [sreq(no_match, [9, 8, 7], 1), sreq(match, [1, 2, 3, 4, 5], 1, output_ids=(6, 7))]
    out = kit.apply_schedule_policy(waiting)
    assert [r.uuid.value for r in out] == [match, no_match]


def test_lpm_deprioritizes_duplicate_short_prefixes():
    """tests.rs:907-953.  SG-10: a request whose sequence shares >= 32 tokens with an earlier
    in-batch request (and has <= 32 cached) sorts after the others."""
    kit = Kit(sg_args(block_size=1, speedup_ratio=1.0), total_tokens=1000, page_size=1,
              schedule_policy=SchedulePolicy.LPM)
    waiting = [sreq(u(i + 1), range(32), 1) for i in range(33)]
    unique = u(100)
    waiting.append(sreq(unique, range(100, 132), 1))
    out = kit.apply_schedule_policy(waiting)
    assert [r.uuid.value for r in out].index(unique) == 1


# ---------------------------------------------------------------------------------------------
# core_behavior (tests.rs:956-1371)
# ---------------------------------------------------------------------------------------------


def test_chunked_prefill_budget_is_page_aware():
    """tests.rs:959-988.  SG-12, SG-14: a 6-token prompt materializes 6 tokens and allocates 8."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=10000, page_size=4, chunked_prefill_size=8)
    waiting = [sreq(u(1), [1] * 6, 3)]
    admit = kit.get_new_batch_prefill(waiting, 0.7)
    assert len(admit.can_run) == 1
    assert (admit.can_run[0].materialized_tokens, admit.can_run[0].allocated_tokens) == (6, 8)


def test_chunked_prefill_admits_next_chunk_when_full_prompt_does_not_fit():
    """tests.rs:990-1018.  SG-12, SG-13: a 16-token prompt in a 12-token pool gets an 8-token chunk
    (a partial chunk reserves no output)."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=12, page_size=4, chunked_prefill_size=8)
    waiting = [sreq(u(1), [1] * 16, 2)]
    admit = kit.get_new_batch_prefill(waiting, 0.7)
    assert len(admit.can_run) == 1
    assert admit.can_run[0].materialized_tokens == 8


def test_chunked_prefill_subpage_budget_defers_next_request():
    """tests.rs:1020-1066.  SG-12, SGQ-6: after a 7-token prompt (charged 8) the chunk budget is 0;
    the next request goes back to the queue front."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=10000, page_size=4, chunked_prefill_size=8)
    first, second = u(1), u(2)
    waiting = [sreq(first, [1] * 7, 3), sreq(second, [2] * 8, 3)]
    admit = kit.get_new_batch_prefill(waiting, 0.7)
    assert [r.uuid.value for r in admit.can_run] == [first]
    assert [r.uuid.value for r in waiting] == [second]


def test_decode_allocation_is_page_aware():
    """tests.rs:1068-1104.  SG-19: ``allocated_tokens`` grows by a page only when a token crosses it."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=64, page_size=4)
    alloc = kit.allocate_for_request([1, 2, 3, 4, 5, 6])
    running = [sreq(u(1), [1, 2, 3, 4, 5, 6], 4, last_node=alloc.last_node, kv_indices=alloc.kv_indices,
                    materialized_tokens=6, cached_tokens=4, allocated_tokens=8)]
    first = kit.simulate_decode_step(running, 0.0)
    assert running[0].allocated_tokens == 8 and running[0].output_len == 1 and len(first.signals) == 1
    kit.simulate_decode_step(running, 0.0)
    assert running[0].allocated_tokens == 8
    kit.simulate_decode_step(running, 0.0)
    assert running[0].allocated_tokens == 12


def test_decode_speedup_ratio_scales_sglang_decode_time():
    """tests.rs:1106-1174.  SG-18, TIME-7, TIME-11: ``decode_speedup_ratio`` 4 makes decode 4x faster."""

    def end(decode_speedup):
        kit = Kit(sg_args(block_size=4, speedup_ratio=2.0, decode_speedup_ratio=decode_speedup),
                  total_tokens=64, page_size=4)
        alloc = kit.allocate_for_request([1, 2, 3, 4])
        running = [sreq(u(1), [1, 2, 3, 4], 4, last_node=alloc.last_node, kv_indices=alloc.kv_indices,
                        materialized_tokens=4, allocated_tokens=4)]
        return kit.simulate_decode_step(running, 0.0).end_ms

    base, fast = end(1.0), end(4.0)
    assert base > fast
    assert abs(base / fast - 4.0) < 1e-3


def test_check_decode_mem_preserves_generated_output_on_retract():
    """tests.rs:1176-1220.  SG-17, SG-24: the fewest-output request is retracted; its outputs are
    kept and its KV fields cleared."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=8, page_size=4)
    tree = skv._Txn(kit.kv)
    first = tree.tree.pool.allocate(4)
    second = tree.tree.pool.allocate(4)
    kit.core = attrs.evolve(kit.core, kv=tree.freeze())
    running = [
        sreq(u(1), [1, 2, 3, 4], 10, output_ids=(11, 12, 13), kv_indices=first, materialized_tokens=7,
             cached_tokens=4, allocated_tokens=8),
        sreq(u(2), [9, 8, 7, 6], 10, output_ids=(21,), kv_indices=second, materialized_tokens=5,
             cached_tokens=4, allocated_tokens=8),
    ]
    retracted = kit.check_decode_mem(running)
    assert len(retracted) == 1
    assert retracted[0].output_ids == (21,)
    assert retracted[0].materialized_tokens == 0
    assert retracted[0].kv_indices == ()


def test_unfinished_decode_request_is_cached_after_output():
    """tests.rs:1222-1249.  SG-16: after a decode token the page-aligned prefix is in the tree."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=64, page_size=4)
    alloc = kit.allocate_for_request([1, 2, 3, 4])
    running = [sreq(u(1), [1, 2, 3, 4], 4, last_node=alloc.last_node, kv_indices=alloc.kv_indices,
                    materialized_tokens=4, allocated_tokens=4)]
    kit.simulate_decode_step(running, 0.0)
    assert skv.prefix_match_len(kit.kv, running[0].sequence_prefix(4)) == 4


def test_active_decode_blocks_tracks_page_reserved_occupancy_in_blocks():
    """tests.rs:1251-1278.  SG-6: 6 prompt + 1 decode token occupy 7 slots, allocated 8 -> 2 pages."""
    core = SgCore(sg_args(num_gpu_blocks=32, block_size=4, speedup_ratio=1.0,
                          sglang={"chunked_prefill_size": 8, "page_size": 4}))
    core.receive(request(u(1), [1] * 6, 2))
    p = core.execute(0.0)
    assert p.completed_requests == 0
    assert p.metrics.active_decode_blocks == 2


@pytest.mark.skip(reason="not applicable: MTP speculative decoding (aic_nextn) is out of scope (spec/sglang-core.md §8)")
def test_mtp_batch_applies_request_bursts_in_stable_order():
    """tests.rs:1280-1353."""


def test_sglang_pass_visibility_is_pass_end():
    """tests.rs:1355-1371.  SG-23: SGLang events are visible at pass end; all carry dp rank 0."""
    core = SgCore(test_args(32, 4, 4), capture_kv_events=True)
    core.receive(request(u(1), [1, 2, 3, 4], 1))
    p = core.execute(0.0)
    assert p.router_event_visibility == "pass_end"
    assert p.kv_events
    assert all(e.dp_rank == 0 for e in p.kv_events)


# ---------------------------------------------------------------------------------------------
# router_events (tests.rs:1427-1871)
# ---------------------------------------------------------------------------------------------


def completes_all(core: SgCore, num_requests, prompt_len, max_out, shared):
    """tests.rs:1373-1425 (pure-core half): every request emits all its tokens; the metrics are sane."""
    shared_prefix = [1] * (prompt_len // 2)
    for i in range(num_requests):
        tokens = list(shared_prefix) if shared else []
        unique = prompt_len - len(tokens)
        tokens.extend(i * unique + j + 1000 for j in range(unique))
        core.receive(request(u(50_000 + i), tokens, max_out))
    received = 0
    now = 0.0
    last = None
    for _ in range(100_000):
        if core.is_empty():
            break
        last = core.execute(now)
        now = last.end_ms
        received += len(last.output_signals)
    assert received == num_requests * max_out
    m = last.metrics
    assert m.total_blocks > 0
    assert 0.0 <= m.gpu_cache_usage_perc <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("shared,policy,page", [
    (False, "fifo", 1), (True, "fifo", 1), (False, "lpm", 1), (True, "lpm", 1),
    (False, "fifo", 4), (True, "fifo", 4), (False, "lpm", 4), (True, "lpm", 4),
])
def test_sglang_scheduler_token_generation_patterns(shared, policy, page):
    """tests.rs:1429-1475 (live; pure-core half).  SG-7, SG-10, SG-17: 200 requests of 1000 tokens,
    100 outputs each, all complete.  Upstream's args keep the vLLM engine type with block size 64,
    so ``page_size`` is ignored there (ARGS-2 applies the alias only to the sglang engine type):
    the page size is 64 in every case; the cases differ in policy and prompt sharing."""
    del page
    core = SgCore(sg_args(num_gpu_blocks=500, block_size=64, speedup_ratio=1000.0,
                          sglang={"schedule_policy": policy}))
    completes_all(core, 200, 1000, 100, shared)


def test_chunked_prefill_events_apply_cleanly():
    """tests.rs:1477-1500.  SG-13, SG-16, SGKV-3: a chunked prompt's first page is stored at
    allocation, the rest as its chunks are cached; the router sees no duplicate."""
    harness = RouterIndex()
    core = SgCore(test_args(32, 4, 4), capture_kv_events=True)
    core.receive(request(u(1), [1, 2, 3, 4, 5, 6], 2))
    p1 = core.execute(0.0)
    prompt_hashes = stored_hashes(p1.kv_events)
    assert len(prompt_hashes) == 1
    harness.apply(p1.kv_events)
    p2 = core.execute(p1.end_ms)
    prompt_hashes.extend(nth_stored_hashes(p2.kv_events, 0))
    harness.apply(p2.kv_events)
    p3 = core.execute(p2.end_ms)
    prompt_hashes.extend(nth_stored_hashes(p3.kv_events, 0))
    harness.apply(p3.kv_events)
    assert len(prompt_hashes) == 2
    assert harness.stored_ok >= 2
    harness.assert_no_event_warnings()


def nth_stored_hashes(events, n):
    """test_utils.rs: the local hashes of the n-th Stored event (empty if there is none)."""
    stored = [e for e in events if isinstance(e.data, KvStored)]
    if n >= len(stored):
        return []
    return [b.tokens_hash for b in stored[n].data.blocks]


def test_decode_growth_events_apply_cleanly():
    """tests.rs:1502-1524.  SG-16, SG-22: decode-grown pages are stored once each."""
    harness = RouterIndex()
    core = SgCore(test_args(32, 4, 16), capture_kv_events=True)
    core.receive(request(u(1), [7, 8, 9, 10], 5))
    p = core.execute(0.0)
    hashes = stored_hashes(p.kv_events)
    harness.apply(p.kv_events)
    now = p.end_ms
    for _ in range(3):
        p = core.execute(now)
        now = p.end_ms
        hashes.extend(stored_hashes(p.kv_events))
        harness.apply(p.kv_events)
    assert len(hashes) == 2
    assert harness.stored_ok >= 2
    harness.assert_no_event_warnings()


def test_completed_output_block_uses_router_token_identity():
    """tests.rs:1526-1567.  SG-3, SG-22: the stored blocks hash the u32 tokens SGLang generated."""
    uuid = u(0x5A17)
    prompt = [101, 202]
    first = output_token(uuid_bytes(rid(uuid)), 0)
    second = output_token(uuid_bytes(rid(uuid)), 1)
    expected_tokens = prompt + [first, second]
    expected = block_hashes(expected_tokens, 4)
    core = SgCore(test_args(32, 4, 16), capture_kv_events=True)
    core.receive(request(uuid, prompt, 2))
    hashes = [h for p in drive(core) for h in stored_hashes(p.kv_events)]
    assert hashes == expected


def test_retract_frees_do_not_leave_stale_blocks():
    """tests.rs:1569-1595.  SG-17, SG-24: retracting the first of two decoded requests frees only
    its uncached tail: its prompt block stays in the router's view."""
    harness = RouterIndex()
    kit = Kit(test_args(8, 4, 16), total_tokens=10, page_size=4, publish=True)
    req1 = kit.make_decoded_request([1, 2, 3, 4], 4, u(1))
    ev1 = kit.drain()
    req1_hashes = stored_hashes(ev1)
    harness.apply(ev1)
    req2 = kit.make_decoded_request([9, 8, 7, 6], 4, u(2))
    harness.apply(kit.drain())
    running = [req1, req2]
    retracted = kit.check_decode_mem(running)
    assert len(retracted) == 1
    harness.apply(kit.drain())
    assert sum(1 for h in req1_hashes if h in {x for x in harness_local(harness, req1_hashes)}) == 1


def harness_local(harness: RouterIndex, local_hashes):
    """The local hashes (of a root-first chain) whose chained block hash the router holds
    (``overlap_for_hashes``: the matched prefix)."""
    from model.hashing import chain_hash

    out = []
    parent = None
    for h in local_hashes:
        block = h if parent is None else chain_hash(parent, h)
        if block not in harness.present:
            break
        out.append(h)
        parent = block
    return out


def test_completion_tail_free_does_not_remove_unpublished_blocks():
    """tests.rs:1597-1620.  SG-22: freeing the partial tail at completion removes no advertised block."""
    harness = RouterIndex()
    core = SgCore(test_args(32, 4, 16), capture_kv_events=True)
    core.receive(request(u(1), [11, 12, 13, 14], 3))
    p1 = core.execute(0.0)
    prompt_hashes = nth_stored_hashes(p1.kv_events, 0)
    full = stored_hashes(p1.kv_events)
    harness.apply(p1.kv_events)
    p2 = core.execute(p1.end_ms)
    full.extend(stored_hashes(p2.kv_events))
    harness.apply(p2.kv_events)
    p3 = core.execute(p2.end_ms)
    assert removed_event_count(p3.kv_events) == 0
    full.extend(stored_hashes(p3.kv_events))
    harness.apply(p3.kv_events)
    assert len(prompt_hashes) == 1
    assert len(full) >= len(prompt_hashes)


def test_mixed_chunk_decode_retract_reprefill_complete_events_apply_cleanly():
    """tests.rs:1622-1709.  SG-13, SG-16, SG-17, SG-24: chunk, decode, retract, re-prefill and
    completion produce a clean event stream with at least one Removed."""
    harness = RouterIndex()
    kit = Kit(test_args(8, 4, 4), total_tokens=12, page_size=4, publish=True)
    waiting = [sreq(u(1), [1, 2, 3, 4, 5, 6], 3)]
    chunk1 = kit.get_new_batch_prefill(waiting, 0.7)
    req1 = kit.cache_materialized_prefix(chunk1.can_run[0])
    waiting.insert(0, req1)
    harness.apply(kit.drain())
    chunk2 = kit.get_new_batch_prefill(waiting, 0.7)
    running = list(chunk2.can_run)
    decode1 = kit.simulate_decode_step(running, 0.0)
    assert len(decode1.signals) == 1
    harness.apply(kit.drain())
    req1 = running.pop()
    req2 = kit.make_decoded_request([9, 10, 11, 12], 3, u(2))
    harness.apply(kit.drain())
    running = [req1, req2]
    retracted = kit.check_decode_mem(running)
    assert len(retracted) == 1
    harness.apply(kit.drain())
    waiting = [retracted.pop()]
    now = 0.0
    saw_remove = harness.removed_ok > 0
    for _ in range(100):
        admit = kit.get_new_batch_prefill(waiting, 0.7, running)
        for req in admit.can_run:
            if req.materialized_tokens < req.current_sequence_len:
                waiting.insert(0, kit.cache_materialized_prefix(req))
            else:
                running.append(req)
        events = kit.drain()
        saw_remove |= removed_event_count(events) > 0
        harness.apply(events)
        if not running:
            if not waiting:
                break
            continue
        d = kit.simulate_decode_step(running, now)
        now = d.end_ms
        waiting[0:0] = d.retracted
        events = kit.drain()
        saw_remove |= removed_event_count(events) > 0
        harness.apply(events)
        if not running and not waiting:
            break
    assert not running and not waiting
    assert saw_remove
    harness.assert_no_event_errors()
    harness.assert_no_event_warnings()


def test_mtp_lifecycle_drains_with_clean_router_events():
    """tests.rs:1711-1773.  MTP is out of scope (spec/sglang-core.md §8); the lifecycle half runs
    with burst 1: two requests on a 20-token pool drain with every token emitted, a clean event
    stream and at least one Removed.  SG-7, SG-17."""
    harness = RouterIndex()
    core = SgCore(sg_args(num_gpu_blocks=5, block_size=4, max_num_batched_tokens=8, max_num_seqs=4,
                          speedup_ratio=0.0, sglang={"page_size": 4, "chunked_prefill_size": 4}),
                  capture_kv_events=True)
    core.receive(request(u(1), [1, 2, 3, 4, 5, 6], 7))
    core.receive(request(u(2), [9, 10, 11, 12], 5))
    now = 0.0
    tokens = 0
    saw_remove = False
    for _ in range(100):
        if core.is_empty():
            break
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        tokens += len(p.output_signals)
        saw_remove |= removed_event_count(p.kv_events) > 0
        harness.apply(p.kv_events)
    assert core.is_empty()
    assert tokens == 12
    assert saw_remove
    harness.assert_no_event_errors()
    harness.assert_no_event_warnings()


def test_live_pathological_load_no_router_event_errors():
    """tests.rs:1775-1832 (live; pure-core half).  SG-17, SG-24, SGQ-2: eight one-token prompts
    with four outputs each on a 16-token pool all complete; the router sees no event error and at
    least one Removed."""
    harness = RouterIndex()
    core = SgCore(sg_args(num_gpu_blocks=4, block_size=4, speedup_ratio=1000.0,
                          sglang={"page_size": 4, "chunked_prefill_size": 4}), capture_kv_events=True)
    for i in range(8):
        core.receive(request(u(700 + i), [42], 4))
    seen = 0
    for p in drive(core, limit=1000):
        seen += len(p.output_signals)
        harness.apply(p.kv_events)
    assert seen == 32
    harness.assert_no_event_errors()
    assert harness.removed_ok > 0


def test_prefill_completion_emits_handoff_delay():
    """tests.rs:1834-1871.  SG-21, TIME-16: a Prefill worker's completing token carries the
    full-prompt transfer delay (8 tokens x 1e6 B / 1 GB/s = 8 ms)."""
    core = SgCore(sg_args(num_gpu_blocks=64, block_size=4, worker_type="prefill", kv_transfer_bandwidth=1.0,
                          kv_bytes_per_token=1_000_000, speedup_ratio=0.0,
                          sglang={"page_size": 4, "chunked_prefill_size": 16}))
    core.receive(request(u(91), [1] * 8, 1))
    p = core.execute(0.0)
    signal = p.output_signals[0]
    assert signal.completed
    assert signal.handoff_delay_ms == 8.0


# ---------------------------------------------------------------------------------------------
# forward_pass_metrics (tests.rs:1873-2322)
# ---------------------------------------------------------------------------------------------


def fpm_args(**over):
    kw = dict(block_size=4, num_gpu_blocks=16, max_num_batched_tokens=16, max_num_seqs=4, speedup_ratio=0.0,
              sglang={"page_size": 4, "chunked_prefill_size": 16})
    kw.update(over)
    return sg_args(**kw)


def test_fpm_single_prefill_request():
    """tests.rs:1893-1920.  SG-23: the prefilled request joins the same pass's decode step."""
    core = SgCore(fpm_args())
    core.receive(request(u(1), range(8), 1))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests == 1 and fpm.sum_prefill_tokens > 0
    assert fpm.num_decode_requests == 1
    assert (fpm.num_queued_prefill, fpm.num_queued_decode) == (0, 0)
    assert fpm.wall_time_secs > 0.0


def test_fpm_prefill_and_decode_mixed_batch():
    """tests.rs:1922-1964.  SG-23."""
    core = SgCore(fpm_args())
    core.receive(request(u(1), range(4), 3))
    assert core.execute(0.0).fpm.num_prefill_requests == 1
    core.receive(request(u(2), range(100, 104), 3))
    fpm2 = core.execute(1.0).fpm
    assert fpm2.num_prefill_requests == 1
    assert fpm2.num_decode_requests == 2
    assert fpm2.sum_decode_kv_tokens > 0


def test_mocker_metrics_reports_prefix_cache_reuse():
    """tests.rs:1966-1999.  SG-6, SG-23: cache-hit and total prefill tokens of the pass."""
    core = SgCore(fpm_args())
    core.receive(request(u(1), range(8), 2))
    p1 = core.execute(0.0)
    assert (p1.metrics.sglang_cache_hit_tokens, p1.metrics.sglang_cache_total_tokens) == (0, 8)
    core.receive(request(u(2), range(8), 1))
    p2 = core.execute(p1.end_ms)
    assert 0 < p2.metrics.sglang_cache_hit_tokens <= p2.metrics.sglang_cache_total_tokens


def test_fpm_empty_pass_is_zeroed():
    """tests.rs:2001-2017.  SG-23, CORE-3."""
    core = SgCore(fpm_args())
    fpm = core.hidden(0.0).fpm
    assert (fpm.num_prefill_requests, fpm.num_decode_requests, fpm.num_queued_prefill,
            fpm.num_queued_decode, fpm.sum_prefill_tokens, fpm.sum_decode_kv_tokens) == (0, 0, 0, 0, 0, 0)


def test_fpm_queued_requests():
    """tests.rs:2019-2071.  SG-11, SG-23: with a 16-token pool the second 8-token request queues."""
    core = SgCore(fpm_args(num_gpu_blocks=4, max_num_batched_tokens=8, max_num_seqs=2,
                           sglang={"page_size": 4, "chunked_prefill_size": 8}))
    core.receive(request(u(1), range(8), 1))
    core.receive(request(u(2), range(100, 108), 1))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests + fpm.num_decode_requests >= 1
    assert fpm.num_queued_prefill + fpm.num_queued_decode >= 1


def test_fpm_var_prefill_length_with_multiple_requests():
    """tests.rs:2073-2120.  SG-23: population variance of prompt lengths [4, 12] is 16."""
    core = SgCore(fpm_args(num_gpu_blocks=32, max_num_batched_tokens=32,
                           sglang={"page_size": 4, "chunked_prefill_size": 32}))
    core.receive(request(u(1), range(4), 1))
    core.receive(request(u(2), range(100, 112), 1))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests == 2
    assert abs(fpm.var_prefill_length - 16.0) < 1e-6


def test_fpm_chunked_prefill_reports_chunk_not_full_prompt():
    """tests.rs:2122-2181.  SG-13, SG-23: each chunk reports its own size; together the prompt."""
    core = SgCore(fpm_args(num_gpu_blocks=32, max_num_batched_tokens=32,
                           sglang={"page_size": 4, "chunked_prefill_size": 8}))
    core.receive(request(u(1), range(16), 2))
    f1 = core.execute(0.0).fpm
    assert f1.num_prefill_requests == 1 and 0 < f1.sum_prefill_tokens <= 8
    f2 = core.execute(1.0).fpm
    assert f2.num_prefill_requests == 1 and f2.sum_prefill_tokens <= 8
    assert f1.sum_prefill_tokens + f2.sum_prefill_tokens == 16


def test_fpm_retracted_decode_becomes_queued_decode():
    """tests.rs:2183-2260.  SG-17, SG-23: a retracted request (outputs kept) is a queued decode with
    KV context; as upstream, a run without retraction only has to keep producing snapshots."""
    core = SgCore(fpm_args(num_gpu_blocks=6, max_num_batched_tokens=32,
                           sglang={"page_size": 4, "chunked_prefill_size": 32}))
    core.receive(request(u(1), range(4), 20))
    core.receive(request(u(2), range(100, 104), 20))
    for i in range(4):
        core.execute(float(i))
    core.receive(request(u(3), range(200, 212), 10))
    saw = False
    for i in range(4, 10):
        fpm = core.execute(float(i)).fpm
        if fpm.num_queued_decode > 0:
            saw = True
            assert fpm.sum_queued_decode_kv_tokens > 0
            break
    if not saw:
        assert core.hidden(10.0).fpm is not None


def test_fpm_sent_through_sink():
    """tests.rs:2262-2322 (live FPM sink; pure-core half).  SG-23: the first pass's snapshot."""
    core = SgCore(fpm_args())
    core.receive(request(u(1), range(8), 2))
    fpm = core.execute(0.0).fpm
    assert fpm.num_prefill_requests == 1 and fpm.sum_prefill_tokens > 0 and fpm.wall_time_secs > 0.0


# ---------------------------------------------------------------------------------------------
# Model-only checks (rules with no upstream test of their own)
# ---------------------------------------------------------------------------------------------


def test_output_token_is_siphash13_of_uuid_and_position():
    """SG-3: SipHash-1-3 against values computed with an independent implementation (the
    ``siphash24`` package's ``siphash13``): key bytes 0..15 with the empty and the 15-byte
    message 0..14, and the output-token layout with keys (0, 0)."""
    k = bytes(range(16))
    k0, k1 = int.from_bytes(k[:8], "little"), int.from_bytes(k[8:], "little")
    assert siphash13(b"", k0, k1) == 0xABAC0158050FC4DC
    assert siphash13(bytes(range(15)), k0, k1) == 0xD320D86D2A519956
    r = rid(u(7))
    assert output_token(uuid_bytes(r), 3) == 0xF01E78DA


def test_destination_prompt_larger_than_pool_is_rejected():
    """SG-30: ``ceil(P / bs) * bs > total_kv_tokens`` rejects the reservation; the core is unchanged."""
    core = SgCore(sg_args(num_gpu_blocks=2, block_size=4, worker_type="decode"))
    before = core.value
    with pytest.raises(DestinationPromptTooLarge):
        core.reserve(u(1), request(u(2), range(9), 1))
    assert core.value == before
    core.reserve(u(1), request(u(2), range(8), 1))
