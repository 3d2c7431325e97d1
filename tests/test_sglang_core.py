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

from fractions import Fraction

import attrs
import pytest

from core_helpers import Core, RouterIndex, args, removed_event_count, request, stored_hashes, u
from invariants.sglang_core import lock_counts, queues_consistent, slot_conservation
from model import sglang_kv as skv
from model.engine_args import EngineArgs, SchedulePolicy, SglangArgs
from model.errors import DestinationPromptTooLarge, InternalInvariantBroken, RequestAlreadyActive
from model.hashing import block_hashes
from model.ids import hid, rid
from model.kv_events import KvRemoved, KvStored
from model.protocol import (
    APPLIED,
    NOOP,
    ActivateDestination,
    DestinationAccepted,
    DestinationReserved,
    SourceHeld,
    Submit,
    SubmitHandoffPrefill,
    Submitted,
)
from model.radix_cache import ROOT, allocate_slots
from model.sglang_core import _Txn, new_sglang_core
from model.sglang_request import (
    SglangRequest,
    ceil_to_block,
    floor_to_block,
    new_request,
    output_token,
    siphash13,
    uuid_bytes,
)

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


def test_lpm_in_batch_check_includes_exactly_32_cached_tokens():
    """SG-10 at its bound (policy.rs:41 ``prefix_len <= 32``), derived by hand.  With 32 cached
    tokens A and B (identical 40-token prompts) are still checked in-batch: A goes into the
    throw-away tree, B then matches 40 >= 32 of it and sorts last: A, C, B.  With 33 cached
    tokens neither is checked and the order is by cached length only: A, B, C."""
    for cached, expected in ((32, [1, 3, 2]), (33, [1, 2, 3])):
        kit = Kit(sg_args(block_size=1, speedup_ratio=1.0), total_tokens=1000, page_size=1,
                  schedule_policy=SchedulePolicy.LPM)
        tree = skv._Txn(kit.kv)
        tree.tree.insert(tuple(range(cached)), tuple(range(cached)))
        kit.core = attrs.evolve(kit.core, kv=tree.freeze())
        waiting = [sreq(u(1), range(40), 1), sreq(u(2), range(40), 1), sreq(u(3), range(100, 140), 1)]
        out = kit.apply_schedule_policy(waiting)
        assert [r.uuid.value for r in out] == [u(i) for i in expected], cached


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


def test_admitted_request_charges_its_output_reserve_against_the_rest_of_the_batch():
    """SG-13, by hand: pool of T token slots, page 1, no running request, so the batch starts
    with T to spend.  A (10-token prompt, 20 output tokens) costs 10 + 20 = 30 < T and is
    admitted; the batch then has T - 30 left, and B costs 30 too.  T = 45: 15 left, B waits
    (30 >= 15).  T = 61: 31 left, B is admitted."""
    for total, admitted in ((45, [1]), (61, [1, 2])):
        kit = Kit(sg_args(block_size=1, speedup_ratio=1.0), total_tokens=total, page_size=1)
        waiting = [sreq(u(1), [1] * 10, 20), sreq(u(2), [2] * 10, 20)]
        admit = kit.get_new_batch_prefill(waiting, 0.7)
        assert [r.uuid.value for r in admit.can_run] == [u(i) for i in admitted], total
        assert [r.uuid.value for r in waiting] == [u(i) for i in (1, 2) if i not in admitted]


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


def test_fpm_retracted_plain_request_is_a_queued_decode_beside_an_active_destination():
    """SG-17, SG-23, SG-24: with an activated destination D (4 tokens, 20 outputs) running, a plain
    request P (4 tokens, 20 outputs) received one pass later is admitted, and with conservativeness 0
    the 9-page pool runs out while both decode. The retraction takes the running request with the
    fewest outputs, P, which waits with its outputs kept. The snapshot counts P as a queued decode
    of prompt plus outputs, not as a queued prefill, although it is not a destination (the scan of
    the waiting queue that also asks for activated destinations, core.rs:663-718)."""
    core = SgCore(fpm_args(num_gpu_blocks=9, max_num_batched_tokens=32, worker_type="decode",
                           sglang={"page_size": 4, "chunked_prefill_size": 32, "schedule_conservativeness": 0.0}))
    hd, d, p = u(1), u(2), u(3)
    core.reserve(hd, request(d, range(4), 20))
    assert core.activate(hd) == APPLIED
    core.execute(0.0)
    core.receive(request(p, range(100, 104), 20))
    for i in range(1, 30):
        fpm = core.execute(float(i)).fpm
        waiting = core.value.waiting
        if any(r.output_ids for r in waiting):
            break
    else:
        pytest.fail("no retraction")
    (retracted,), (running,) = waiting, core.value.running
    assert (retracted.uuid.value, running.uuid.value) == (p, d) and len(retracted.output_ids) < len(running.output_ids)
    assert core.value.ledger.active_destinations.contains_request(running.uuid)
    assert (fpm.num_queued_prefill, fpm.num_queued_decode, fpm.sum_queued_decode_kv_tokens) == (
        0, 1, 4 + len(retracted.output_ids))


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


# ---------------------------------------------------------------------------------------------
# Rule tests (spec/sglang-core.md rules no upstream test isolates)
# ---------------------------------------------------------------------------------------------


def test_config_and_page_rounding():
    """SG-1, ARGS-12: page helpers; the new-token ratios in upstream's float order; defaults."""
    assert [ceil_to_block(t, 4) for t in (0, 1, 4, 5, 8)] == [0, 4, 4, 8, 8]
    assert [floor_to_block(t, 4) for t in (0, 3, 4, 7, 9)] == [0, 0, 4, 4, 8]
    cfg = new_sglang_core(sg_args(num_gpu_blocks=10, block_size=4, max_num_seqs=None,
                                  sglang={"page_size": 4, "schedule_conservativeness": 0.5})).config
    init = 0.7 * 0.5
    low = init * 0.14
    assert (cfg.init_new_token_ratio, cfg.min_new_token_ratio, cfg.new_token_ratio_decay_step) == (
        init, low, (init - low) / 600.0)
    assert (cfg.max_prefill_tokens, cfg.chunked_prefill_size, cfg.clip_max_new_tokens) == (16384, 8192, 4096)
    assert cfg.max_running_requests is None
    assert (cfg.block_size, cfg.total_kv_tokens) == (4, 40)


def test_request_state_and_derived_quantities():
    """SG-2: a new request holds no KV; the derived lengths; upstream's field assertions."""
    r = new_request(rid(u(1)), [1, 2, 3], 5)
    assert (r.output_ids, r.last_node, r.kv_indices, r.materialized_tokens, r.cached_tokens,
            r.allocated_tokens) == ((), None, (), 0, 0, 0)
    assert (r.extend_input_len, r.remaining_output_tokens, r.extra_reserved_tokens) == (3, 5, 0)
    assert r.field_problems(4) is None
    grown = attrs.evolve(r, output_ids=(7, 8), last_node=1, kv_indices=(0, 1, 2, 3), materialized_tokens=4,
                         allocated_tokens=4)
    assert (grown.current_sequence_len, grown.extend_input_len, grown.remaining_output_tokens) == (5, 1, 3)
    assert grown.sequence_prefix(4) == (1, 2, 3, 7) and grown.sequence_tokens() == (1, 2, 3, 7, 8)
    assert grown.field_problems(4) is None
    assert "extra tokens" in attrs.evolve(grown, allocated_tokens=8).field_problems(4)
    assert "last_node" in attrs.evolve(grown, last_node=None).field_problems(4)
    assert "not page aligned" in attrs.evolve(grown, cached_tokens=2).field_problems(4)


def test_new_core_state():
    """SG-4, SGKV-1: an empty core: pool of blocks x page tokens, ratio at its initial value,
    generation 0, no events unless captured; only the sglang engine type is accepted."""
    core = new_sglang_core(sg_args(num_gpu_blocks=5, block_size=4, sglang={"page_size": 4}), dp_rank=3)
    assert core.waiting == core.prebuilt_ready == core.running == ()
    assert core.new_token_ratio == core.config.init_new_token_ratio
    assert core.ledger.capacity_generation == 0 and core.is_drained()
    kv = core.kv
    assert (kv.total_tokens, kv.available_tokens, kv.page_size, kv.dp_rank) == (20, 20, 4, 3)
    assert (kv.publish_events, kv.next_event_id, len(kv.idx_to_block_hash), len(kv.block_hash_refcounts)) == (
        False, 0, 0, 0)
    assert kv.cache.num_nodes == 1 and kv.evictable_size == kv.protected_size == 0
    assert new_sglang_core(sg_args(block_size=4), capture_kv_events=True).kv.publish_events
    with pytest.raises(InternalInvariantBroken) as err:
        new_sglang_core(args(engine_type="vllm", block_size=4))
    assert err.value.rule == "SG-4"


def test_empty_drained_and_request_count():
    """SG-5: emptiness counts the three queues only; drained also needs every handoff structure
    empty; ``num_requests`` is the three queue lengths."""
    core = SgCore(sg_args(num_gpu_blocks=16, block_size=4, worker_type="decode", max_num_seqs=1))
    core.reserve(u(1), request(u(2), range(8), 2))
    assert core.value.ledger.destination_holds.contains(hid(u(1)))
    assert core.is_empty() and not core.is_drained() and core.num_requests() == 0
    assert core.metrics().waiting_requests == 1
    core.receive(request(u(3), range(100, 104), 2))
    assert not core.is_empty() and core.num_requests() == 1
    core.activate(u(1))
    assert core.num_requests() == 2 and len(core.value.prebuilt_ready) == 1
    drive(core)
    assert core.is_empty() and core.is_drained() and core.num_requests() == 0


def test_new_token_ratio_decays_every_pass_and_resets_on_retraction():
    """SG-9, SG-24, SGGEN-5: every pass, even an empty one, lowers the ratio by one step down to
    the floor; a retraction resets it to the initial value, decayed once in the same pass, bumps
    the generation and puts the victim (outputs kept, no KV) at the front of ``waiting``."""
    core = SgCore(sg_args(num_gpu_blocks=3, block_size=4, speedup_ratio=1.0,
                          sglang={"page_size": 4, "clip_max_new_tokens": 1}))
    cfg = core.value.config
    p = core.execute(0.0)
    assert p.end_ms == 0.0 and p.admissions == ()
    assert core.value.new_token_ratio == cfg.init_new_token_ratio - cfg.new_token_ratio_decay_step
    for _ in range(700):
        core.execute(0.0)
    assert core.value.new_token_ratio == cfg.min_new_token_ratio

    # two 4-token prompts fill two of the three pages; each first token needs a new page, the
    # pool has one: the fewest-output request (a tie, so the first running one) is retracted
    core.receive(request(u(1), [1, 2, 3, 4], 20))
    core.receive(request(u(2), [5, 6, 7, 8], 20))
    generation = core.value.ledger.capacity_generation
    p = core.execute(0.0)
    assert [a.uuid.value for a in p.admissions] == [u(1), u(2)]
    assert [s.uuid.value for s in p.output_signals] == [u(2)]
    assert core.waiting == [u(1)] and core.running == [u(2)]
    victim = core.value.waiting[0]
    assert (victim.kv_indices, victim.materialized_tokens, victim.last_node) == ((), 0, None)
    assert core.value.ledger.capacity_generation == generation + 1
    assert core.value.new_token_ratio == cfg.init_new_token_ratio - cfg.new_token_ratio_decay_step


def test_prefill_allocation_failure_restores_the_request_and_flags_oom():
    """SG-13, SG-9: when allocation fails after the budget check (reachable only when a negative
    ratio inflates the budget, upstream S15) the request goes back to the front unchanged and the
    pass is flagged ``oom``."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=8, page_size=4)
    alloc = kit.allocate_for_request([1, 2, 3, 4])
    running = [sreq(u(1), [1, 2, 3, 4], 10, last_node=alloc.last_node, kv_indices=alloc.kv_indices,
                    materialized_tokens=4, allocated_tokens=4)]
    big = sreq(u(2), range(10, 18), 0)
    waiting = [big]
    admit = kit.get_new_batch_prefill(waiting, -1.0, running)
    assert admit.oom and admit.can_run == [] and admit.admissions == []
    assert waiting == [big]
    assert kit.kv.available_tokens == 4


def test_lpm_keeps_queue_order_above_128_waiting():
    """SG-10: LPM leaves the order alone when more than 128 requests wait, and sorts at 128."""
    kit = Kit(sg_args(block_size=1, speedup_ratio=1.0), total_tokens=1000, page_size=1,
              schedule_policy=SchedulePolicy.LPM)
    tree = skv._Txn(kit.kv)
    tree.tree.insert((1, 2, 3, 4), (0, 1, 2, 3))
    kit.core = attrs.evolve(kit.core, kv=tree.freeze())

    def queue(n):
        out = [sreq(u(10 + i), [500 + i], 1) for i in range(n - 1)]
        out.append(sreq(u(1), [1, 2, 3, 4], 1))
        return out

    frozen = kit.apply_schedule_policy(queue(129))
    assert [r.uuid.value for r in frozen] == [r.uuid.value for r in queue(129)]
    assert kit.apply_schedule_policy(queue(128))[0].uuid.value == u(1)


@pytest.mark.parametrize("policy,expected", [
    ("lpm", SchedulePolicy.LPM), ("LPM", SchedulePolicy.FIFO), ("Lpm", SchedulePolicy.FIFO),
    ("fifo", SchedulePolicy.FIFO), ("fcfs", SchedulePolicy.FIFO), ("random", SchedulePolicy.FIFO),
    (None, SchedulePolicy.FIFO),
])
def test_schedule_policy_name_is_exact(policy, expected):
    """SG-10, ARGS-12: only the exact lower-case ``lpm`` selects LPM; everything else is FIFO."""
    core = new_sglang_core(sg_args(block_size=4, sglang={"page_size": 4, "schedule_policy": policy}))
    assert core.config.schedule_policy is expected


def test_head_that_does_not_fit_blocks_the_queue():
    """SG-11, SG-15: the budget counts the page-rounded prompt plus the output reserve; a head
    that does not fit is put back at the front and nothing behind it is admitted, although the
    next request would fit; it is not rejected and the pass is not ``oom``."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=16, page_size=4)
    big, small = sreq(u(1), range(16), 1), sreq(u(2), range(100, 104), 1)
    waiting = [big, small]
    admit = kit.get_new_batch_prefill(waiting, 0.7)
    assert admit.can_run == [] and not admit.oom
    assert waiting == [big, small]
    waiting = [small, big]
    admit = kit.get_new_batch_prefill(waiting, 0.7)
    assert [r.uuid.value for r in admit.can_run] == [u(2)]
    assert waiting == [big]


def test_decode_runs_the_whole_running_list_one_token_each():
    """SG-18, SG-19, SG-20: the decode step covers every running request, including the one
    admitted in this pass, in running order, one token each (no MTP)."""
    core = SgCore(sg_args(num_gpu_blocks=64, block_size=4, speedup_ratio=1.0))
    core.receive(request(u(1), range(6), 5))
    p1 = core.execute(0.0)
    assert [s.uuid.value for s in p1.output_signals] == [u(1)]
    core.receive(request(u(2), range(100, 103), 5))
    p2 = core.execute(p1.end_ms)
    assert [a.uuid.value for a in p2.admissions] == [u(2)]
    assert [s.uuid.value for s in p2.output_signals] == [u(1), u(2)]
    assert p2.fpm.num_decode_requests == 2
    first, second = core.value.running
    assert (first.output_len, first.materialized_tokens, first.allocated_tokens) == (2, 8, 8)
    assert (second.output_len, second.materialized_tokens, second.allocated_tokens) == (1, 4, 4)


def _ns(ms: float) -> int:
    """TIME-1 written out: ``Duration::from_secs_f64(ms / 1000)`` in whole nanoseconds."""
    return round(Fraction(ms / 1000.0) * 10**9)


def _ms(ns: int) -> float:
    """TIME-2 written out: ``as_secs_f64`` times 1000."""
    return (float(ns // 10**9) + float(ns % 10**9) / 1e9) * 1000.0


def _prefill_ms(n: int, isl: int, prefix: int) -> float:
    t = float(n * (isl - prefix))
    return 4.209989e-07 * (t * t) + 1.518344e-02 * t + 1.650142e01


def _decode_ms(active: int, total: int) -> float:
    x = active / total
    return max(-25.74 * (x * x) + 54.01 * x + 5.74, 1.0)


@pytest.mark.parametrize("worker", ["aggregated", "prefill", "decode"])
def test_pass_timing_uses_floored_means_and_the_whole_running_list(worker):
    """SG-21, SG-26, SG-27, TIME-3: prompts of 5 and 8 tokens prefill as 2 x floor(13 / 2) = 12
    tokens, not 13; decode is charged for a context of 5 + 8 tokens over a 256-token pool.  A
    Decode worker charges no prefill; a Prefill worker is still charged the decode step.  Every
    token of the pass carries the pass end."""
    core = SgCore(sg_args(num_gpu_blocks=64, block_size=4, speedup_ratio=1.0, worker_type=worker))
    core.receive(request(u(1), range(5), 2))
    core.receive(request(u(2), range(100, 108), 2))
    p = core.execute(3.0)
    prefill = 0 if worker == "decode" else _ns(_prefill_ms(2, 13 // 2, 0))
    decode = _ns(_decode_ms(13, 256))
    assert p.end_ms == (3.0 + _ms(prefill)) + _ms(decode)
    assert p.token_ms == p.end_ms and len(p.output_signals) == 2
    if worker != "decode":
        assert _ns(_prefill_ms(2, 13 // 2, 0)) != _ns(_prefill_ms(1, 13, 0))  # the floor is visible


def test_pending_destination_blocks_chunk_continuation():
    """SG-28, ADM-1 (upstream handoff notes S8): while a destination is pending no fresh prefill
    runs, not even the continuation of a chunked prompt that holds KV; a blocked pass with
    nothing running does no work (``end_ms == now``) but still decays the ratio.  Cancelling the
    pending destination lets the continuation run."""
    core = SgCore(sg_args(num_gpu_blocks=5, block_size=4, worker_type="decode", max_num_seqs=2,
                          speedup_ratio=1.0, sglang={"page_size": 4, "chunked_prefill_size": 8}))
    core.receive(request(u(1), range(16), 1))
    first = core.execute(0.0)
    assert [a.reused_input_tokens for a in first.admissions] == [0]
    assert core.waiting == [u(1)] and core.value.waiting[0].materialized_tokens == 8
    eff = core.reserve(u(2), request(u(3), range(100, 116), 1))
    assert eff.lifecycle_events == ()  # 16 fresh slots needed, 12 reservable: stays pending
    for now in (5.0, 6.0):
        ratio = core.value.new_token_ratio
        blocked = core.execute(now)
        assert blocked.admissions == () and blocked.output_signals == () and blocked.end_ms == now
        assert core.value.waiting[0].materialized_tokens == 8
        assert core.value.new_token_ratio < ratio
    assert core.cancel_destination(u(2)).result == APPLIED
    resumed = core.execute(7.0)
    assert [(a.uuid.value, a.reused_input_tokens) for a in resumed.admissions] == [(u(1), 8)]
    assert [s.completed for s in resumed.output_signals] == [True]


def test_activated_request_waiting_for_a_slot_blocks_fresh_admission():
    """SG-8, SG-28: activated requests are promoted first while running slots remain; one left
    in ``prebuilt_ready`` blocks fresh prefill even with no pending destination and a pool that
    would fit the fresh request."""
    core = SgCore(sg_args(num_gpu_blocks=16, block_size=4, worker_type="decode", max_num_seqs=1,
                          speedup_ratio=1.0, sglang={"page_size": 4}))
    core.receive(request(u(1), range(100, 104), 3))
    core.execute(0.0)
    assert core.running == [u(1)]
    core.reserve(u(2), request(u(3), range(8), 2))
    assert core.activate(u(2)) == APPLIED
    core.receive(request(u(4), range(200, 204), 1))
    p = core.execute(1.0)
    assert p.admissions == ()
    assert core.waiting == [u(4)] and core.running == [u(1)] and len(core.value.prebuilt_ready) == 1
    assert not core.value.ledger.pending_destinations.has_pending()
    p = core.execute(p.end_ms)  # the blocker completes in this pass's decode
    p = core.execute(p.end_ms)
    assert [(a.uuid.value, a.reused_input_tokens) for a in p.admissions] == [(u(3), 0)]
    assert core.waiting == [u(4)]


def test_cancel_bumps_the_generation_only_when_kv_was_held():
    """SG-29, SGGEN-3: cancelling a pending source whose request waits without KV does not bump;
    cancelling one whose request runs frees its KV, unlocks and bumps."""
    core = SgCore(sg_args(num_gpu_blocks=16, block_size=4, worker_type="prefill", max_num_seqs=1,
                          speedup_ratio=1.0, sglang={"page_size": 4}))
    core.submit_prefill(u(10), request(u(1), range(8), 3))
    core.submit_prefill(u(11), request(u(2), range(100, 108), 3))
    core.execute(0.0)
    assert core.running == [u(1)] and core.waiting == [u(2)]
    gen = core.value.ledger.capacity_generation
    assert core.cancel_source(u(11)) == APPLIED
    assert core.value.ledger.capacity_generation == gen and core.waiting == []
    used = core.occupied_tokens()
    assert core.cancel_source(u(10)) == APPLIED
    assert core.value.ledger.capacity_generation == gen + 1
    assert core.is_empty() and core.occupied_tokens() < used
    assert core.value.kv.protected_size == 0


def test_continuation_chunk_reports_materialized_prefix_as_reuse():
    """SGQ-1: a continuation chunk does no radix match; its admission reports the tokens already
    materialized as reused, and the pass's cache-hit metric counts them."""
    core = SgCore(sg_args(num_gpu_blocks=32, block_size=4, speedup_ratio=1.0,
                          sglang={"page_size": 4, "chunked_prefill_size": 8}))
    core.receive(request(u(1), range(16), 1))
    p1 = core.execute(0.0)
    assert [a.reused_input_tokens for a in p1.admissions] == [0]
    p2 = core.execute(p1.end_ms)
    assert [a.reused_input_tokens for a in p2.admissions] == [8]
    assert (p2.metrics.sglang_cache_hit_tokens, p2.metrics.sglang_cache_total_tokens) == (8, 16)


def test_same_prompt_admitted_in_one_pass_is_not_shared():
    """SGQ-2: two requests with the same prompt admitted in one pass both get fresh slots; the
    first one's pages enter the tree at its first token, the second keeps its own duplicate slots
    below its ``cached_tokens``.  A third request, admitted later, reuses the tree's pages."""
    core = SgCore(sg_args(num_gpu_blocks=16, block_size=4, speedup_ratio=1.0))
    core.receive(request(u(1), range(8), 3))
    core.receive(request(u(2), range(8), 3))
    p = core.execute(0.0)
    assert [a.reused_input_tokens for a in p.admissions] == [0, 0]
    a, b = core.value.running
    assert not set(a.kv_indices) & set(b.kv_indices)
    assert a.cached_tokens == b.cached_tokens == 8
    tree = skv._Txn(core.value.kv).tree
    assert tree.path_indices(b.last_node) == a.kv_indices[:8] != b.kv_indices[:8]
    core.receive(request(u(3), range(8), 3))
    p = core.execute(p.end_ms)
    assert [(x.uuid.value, x.reused_input_tokens) for x in p.admissions] == [(u(3), 8)]


def test_cancel_leaks_duplicate_slots_below_cached_tokens():
    """SGQ-3, SG-34: cancelling the duplicate request of SGQ-2 frees only its slots at and above
    ``cached_tokens``; the eight duplicate slots below stay out of the pool (ghost counter)."""
    core = SgCore(sg_args(num_gpu_blocks=16, block_size=4, speedup_ratio=1.0))
    core.receive(request(u(1), range(8), 3))
    core.submit_prefill(u(9), request(u(2), range(8), 3))
    core.execute(0.0)
    dup = core.value.running[1]
    free_before = core.value.kv.available_tokens
    assert core.cancel_source(u(9)) == APPLIED
    assert core.value.kv.available_tokens == free_before + 1
    assert not set(dup.kv_indices[:8]) & set(core.value.kv.cache.pool.free_list)
    assert (core.value.leaked_slots, core.value.double_freed_slots) == (8, 0)
    assert slot_conservation(core.value) is None


def test_same_pass_retraction_after_prefix_hit_double_frees():
    """SGQ-4, SG-17, SG-34: a request admitted with a prefix hit and retracted in the same pass
    still has ``cached_tokens == 0``, so retraction frees the tree's prefix slots while the tree
    keeps them: the free list then holds slots the tree owns."""
    core = SgCore(sg_args(num_gpu_blocks=4, block_size=4, speedup_ratio=1.0,
                          sglang={"page_size": 4, "clip_max_new_tokens": 1}))
    core.receive(request(u(1), [1, 2, 3, 4], 1))
    p = core.execute(0.0)  # completes; its page stays cached
    prefix_slots = skv._Txn(core.value.kv).tree.path_indices(core.value.kv.cache.nodes[ROOT].children[(1, 2, 3, 4)])
    core.receive(request(u(2), [1, 2, 3, 4, 5, 6, 7, 8], 5))
    core.receive(request(u(3), [9, 9, 9, 9], 5))
    p = core.execute(p.end_ms)
    assert [(a.uuid.value, a.reused_input_tokens) for a in p.admissions] == [(u(2), 4), (u(3), 0)]
    assert core.waiting == [u(2)] and core.running == [u(3)]
    assert set(prefix_slots) <= set(core.value.kv.cache.pool.free_list)
    assert core.value.double_freed_slots == 4
    assert slot_conservation(core.value) is None


def test_active_blocks_wrap_when_double_frees_overfill_the_free_list():
    """SG-6, SGQ-4: after the double free above drains, a 16-token source with no output takes the
    whole pool (evicting the tree) and its cancel frees all 16 slots: the free list then holds 20
    entries for a 16-token pool. Upstream computes ``total - available`` in usize, which wraps in
    release builds, so the metric is ceil((2^64 - 4) / 4) = 2^62 - 1 blocks, not -1."""
    core = SgCore(sg_args(num_gpu_blocks=4, block_size=4, speedup_ratio=1.0,
                          sglang={"page_size": 4, "clip_max_new_tokens": 1}))
    core.receive(request(u(1), [1, 2, 3, 4], 1))
    p = core.execute(0.0)
    core.receive(request(u(2), [1, 2, 3, 4, 5, 6, 7, 8], 5))
    core.receive(request(u(3), [9, 9, 9, 9], 5))
    now = core.execute(p.end_ms).end_ms
    while not core.is_empty():
        now = max(now, core.execute(now).end_ms) + 1.0
    assert core.value.double_freed_slots == 4 and core.value.kv.available_tokens == 4
    core.submit_prefill("h1", request(u(9), list(range(100, 116)), 0))
    core.execute(now)
    assert core.metrics().active_decode_blocks == 3  # (16 tokens - 4 on the free list) / 4
    core.cancel_source("h1")
    assert (core.value.kv.available_tokens, core.value.kv.total_tokens) == (20, 16)
    assert core.metrics().active_decode_blocks == 2**62 - 1


def test_prefill_eviction_runs_before_the_prefix_match():
    """SGQ-5: the pool shortfall is evicted before the request matches its prefix, so the least
    recently used page (here the request's own prefix) is lost and the request reuses nothing."""
    kit = Kit(sg_args(block_size=4, speedup_ratio=1.0), total_tokens=12, page_size=4)
    for tokens in ([1, 2, 3, 4], [9, 9, 9, 9]):  # [1, 2, 3, 4] is the older page
        alloc = kit.allocate_for_request(tokens)
        kv, _ = skv.cache_finished_req(kit.core.kv, tokens, alloc.kv_indices, alloc.last_node, 0)
        kit.core = attrs.evolve(kit.core, kv=kv)
    assert (kit.kv.available_tokens, kit.kv.evictable_size) == (4, 8)
    waiting = [sreq(u(1), [1, 2, 3, 4, 5, 6, 7, 8], 1)]
    admit = kit.get_new_batch_prefill(waiting, 0.7)
    assert [a.reused_input_tokens for a in admit.admissions] == [0]
    assert skv.prefix_match_len(kit.kv, [1, 2, 3, 4]) == 0
    assert skv.prefix_match_len(kit.kv, [9, 9, 9, 9]) == 4


def test_empty_prompt_blocks_the_queue():
    """SGQ-7: an empty prompt at the head is put back on every pass and nothing behind it runs."""
    core = SgCore(sg_args(num_gpu_blocks=8, block_size=4, speedup_ratio=1.0))
    core.receive(request(u(1), [], 2))
    core.receive(request(u(2), [1, 2, 3], 2))
    for now in (0.0, 1.0, 2.0):
        p = core.execute(now)
        assert p.admissions == () and p.output_signals == () and p.end_ms == now
        assert core.waiting == [u(1), u(2)]


def test_reservation_without_headroom_stalls_decode():
    """SGQ-8, SGQ-9: a destination may reserve the whole pool (no decode headroom); once it runs
    alone, its decode slot cannot be reserved, retraction never takes the last request, and each
    pass emits nothing and charges no time."""
    core = SgCore(sg_args(num_gpu_blocks=2, block_size=4, worker_type="decode", speedup_ratio=1.0,
                          sglang={"page_size": 4}))
    eff = core.reserve(u(1), request(u(2), range(8), 3))
    assert [e.transferable_prompt_tokens for e in eff.lifecycle_events] == [8]
    assert core.value.kv.available_tokens == 0
    assert core.activate(u(1)) == APPLIED
    generation = core.value.ledger.capacity_generation
    promoted = core.execute(10.0)
    assert [a.uuid.value for a in promoted.admissions] == [u(2)]
    for p in (promoted, core.execute(10.0), core.execute(10.0)):
        assert p.output_signals == () and p.end_ms == 10.0
    assert core.running == [u(2)] and core.value.ledger.capacity_generation == generation


def test_activated_empty_prompt_destination_holds_the_root():
    """SGQ-10: an activated empty-prompt destination holds the root as its locked node with nothing
    materialized (upstream's field assertion would fail; the queue invariant allows exactly this
    case), runs, and completes normally."""
    core = SgCore(sg_args(num_gpu_blocks=8, block_size=4, worker_type="decode", speedup_ratio=1.0))
    eff = core.reserve(u(10), request(u(11), [], 2))
    assert [e.transferable_prompt_tokens for e in eff.lifecycle_events] == [0]
    assert core.activate(u(10)) == APPLIED
    (ready,) = core.value.prebuilt_ready
    assert (ready.last_node, ready.materialized_tokens, ready.kv_indices) == (ROOT, 0, ())
    assert ready.field_problems(4) is not None
    assert queues_consistent(core.value) is None
    signals = [s.completed for p in drive(core) for s in p.output_signals]
    assert signals == [False, True] and core.is_drained()


def test_finished_request_publishes_stored_then_removed():
    """SGKV-19: ``cache_finished_req`` publishes its Stored event before the Removed event of the
    duplicate pages it releases.  The duplicate page is made advertisable once (its twin is
    cached while publishing is off) so that its removal is visible."""
    mgr = skv.new_kv_manager(16, 2)
    mgr, twin = skv.allocate_for_request(mgr, [1, 2])
    mgr = skv.set_publish_events(mgr, True)
    mgr, dup = skv.allocate_for_request(mgr, [1, 2, 3])
    assert [type(e.data) for e in dup.events] == [KvStored]
    mgr = skv.set_publish_events(mgr, False)
    mgr, _ = skv.cache_finished_req(mgr, [1, 2], twin.value.kv_indices, twin.value.last_node, 0)
    mgr = skv.set_publish_events(mgr, True)
    cache, extra = allocate_slots(mgr.cache, 1)
    mgr = attrs.evolve(mgr, cache=cache)
    kv = dup.value.kv_indices + extra
    mgr, done = skv.cache_finished_req(mgr, [1, 2, 3, 9], kv, dup.value.last_node, 0)
    assert [type(e.data) for e in done.events] == [KvStored, KvRemoved]
    assert [e.event_id for e in done.events] == [1, 2]
    assert kv[0] in mgr.cache.pool.free_list and kv[1] in mgr.cache.pool.free_list


def test_tree_structure_locks_and_slots_hold_through_mixed_passes():
    """RADIX-2, SG-34, SG-35: with chunking, LPM, shared prefixes and a retraction on a small
    pool, after every pass every non-root node's key is a whole number of pages, its value has one
    slot per token and its parent maps the key's first page to it; lock counts and slot
    conservation hold; every request finishes."""
    core = SgCore(sg_args(num_gpu_blocks=6, block_size=4, speedup_ratio=1.0, max_num_seqs=4,
                          sglang={"page_size": 4, "chunked_prefill_size": 8, "schedule_policy": "lpm",
                                  "clip_max_new_tokens": 2}), capture_kv_events=True)
    prompts = [list(range(13)), list(range(9)), list(range(6)) + [50, 51], [7] * 10, list(range(13)) + [99]]
    for i, prompt in enumerate(prompts):
        core.receive(request(u(i + 1), prompt, 6))
    now, tokens, retractions = 0.0, 0, 0
    for _ in range(200):
        if core.is_empty():
            break
        p = core.execute(now)
        now = p.end_ms
        tokens += len(p.output_signals)
        head = core.value.waiting[0] if core.value.waiting else None
        retractions += bool(head is not None and head.output_ids and not head.kv_indices)
        cache = core.value.kv.cache
        for node_id, node in cache.nodes.items():
            if node_id == cache.root:
                continue
            assert node.key and len(node.key) % 4 == 0 and len(node.value) == len(node.key)
            assert cache.nodes[node.parent].children[node.key[:4]] == node_id
        assert lock_counts(core.value) is None
        assert slot_conservation(core.value) is None
    assert core.is_empty() and tokens == 30 and retractions >= 1
