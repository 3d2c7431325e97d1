"""The SGLang engine core: one scheduling pass and the handoff commands.

Spec: spec/sglang-core.md (rules SG-n, quirks SGQ-n, generation bumps SGGEN-n).
Upstream: lib/mocker/src/scheduler/sglang/{core,prefill,decode,policy,request,config}.rs
at a822423412a0.

The core is a frozen value (:class:`SglangCore`).  Public operations are pure
functions ``(core, input) -> (core, result)``.  Internally each operation works
on a :class:`_Txn`, a short-lived mutable working copy whose algorithm follows
upstream step by step: plain lists for the three queues, one open KV-manager
transaction (``model.sglang_kv``) for every KV step of the operation, frozen
into a new core at the end.  Nothing mutable escapes it.

Out of scope: upstream's MTP speculative decoding (``aic_nextn``); the model's
engine arguments have no such field, so the burst size is always 1 (SG-20).
"""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Any, ClassVar, List, Optional, Tuple

import attrs

from . import handoff_commands as hc
from . import sglang_kv as skv
from . import timing
from .admission import AdmissionInvariant, AdmissionStage
from .core import Deferred, MockerMetrics, PassResult
from .engine_args import EngineArgs, EngineType, SchedulePolicy, SglangConfig, WorkerType
from .errors import DestinationPromptTooLarge, InternalInvariantBroken, RequestAlreadyActive
from .fpm import accept_length_sample, build_fpm_snapshot
from .ids import HandoffId, RequestId
from .ledger import HandoffLedger
from .protocol import AdmissionEvent, Command, DirectRequest, OutputSignal, SourceHeld
from .radix_cache import CacheTxn, new_radix_cache
from .sglang_request import SglangRequest, ceil_to_block, floor_to_block, new_request
from .source_holds import Held, Release

USIZE_MAX = 2**64 - 1

_UUID_VALUE = attrgetter("uuid.value")

#: SG-10: LPM keeps the queue order above this many waiting requests (config.rs:15)
LPM_FALLBACK_THRESHOLD = 128
#: SG-10: in-batch prefix checks apply to requests whose cache hit is at most this (config.rs:16)
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
#: SG-10: an in-batch prefix of at least this many tokens deprioritises a request (config.rs:17)
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


@attrs.frozen
class HeldSglangPrefill:
    """SGGEN-1: a completed source kept (with its slots and radix lock) until release (core.rs:53-55)."""

    request: SglangRequest


@attrs.frozen
class ReservedSglangDecode:
    """SG-31: a destination with its KV reservation (core.rs:57-60)."""

    request: SglangRequest
    kv: skv.DestinationReservation


@attrs.frozen
class SglangCore:
    """SG-4: the whole state of one SGLang core (core.rs:33-51).

    ``waiting`` is upstream's deque (front = index 0), ``prebuilt_ready`` the activated
    destinations not yet running, ``running`` the running vector in order.
    ``destination_reservation_attempts`` is upstream's test-only probe counter (RETRY-3); it
    does not take part in equality.  ``leaked_slots`` and ``double_freed_slots`` are ghost
    counters of the two slot quirks (SGQ-3, SGQ-4): they change no behaviour, take no part in
    equality, and let the slot-conservation invariant (SG-34) stay exact.
    """

    args: EngineArgs
    config: SglangConfig
    dp_rank: int
    kv: skv.SglangKvManager
    new_token_ratio: float
    waiting: Tuple[SglangRequest, ...] = ()
    prebuilt_ready: Tuple[SglangRequest, ...] = ()
    running: Tuple[SglangRequest, ...] = ()
    ledger: HandoffLedger = HandoffLedger()
    destination_reservation_attempts: int = attrs.field(default=0, eq=False)
    leaked_slots: int = attrs.field(default=0, eq=False)
    double_freed_slots: int = attrs.field(default=0, eq=False)

    ops: ClassVar[Any]

    # -- queries (SG-5, SG-6) --

    def is_empty(self) -> bool:
        """SG-5: waiting, prebuilt and running are all empty (core.rs:478-480)."""
        return not self.waiting and not self.prebuilt_ready and not self.running

    def is_drained(self) -> bool:
        """SG-5: empty and every handoff structure empty (core.rs:482-489)."""
        return self.is_empty() and self.ledger.is_empty()

    def num_requests(self) -> int:
        """SG-5: the three queue lengths summed (core.rs:491-493)."""
        return len(self.waiting) + len(self.prebuilt_ready) + len(self.running)

    def active_kv_blocks(self) -> int:
        """SG-6: pages in use, counting every queued request's page-rounding slack (core.rs:747-766)."""
        reserved = 0
        for queue in (self.waiting, self.prebuilt_ready, self.running):
            for r in queue:  # extra_reserved_tokens, inlined
                extra = r.allocated_tokens - len(r.kv_indices)
                if extra > 0:
                    reserved += extra
        # usize arithmetic, which wraps in release builds (the root Cargo.toml's release profile
        # keeps the default, no overflow checks): once SGQ-4's double frees have put more slots on
        # the free list than the pool holds, `total - available` wraps (core.rs:763-765)
        used = (self.kv.total_tokens - self.kv.available_tokens) % (USIZE_MAX + 1)
        return -(-((used + reserved) % (USIZE_MAX + 1)) // self.config.block_size)

    def metrics(self, hit_tokens: int = 0, cache_total_tokens: int = 0) -> MockerMetrics:
        """SG-6: the SGLang metrics (core.rs:495-516).  ``waiting_requests`` counts waiting,
        prebuilt, pending and reserved destinations; ``total_blocks`` is
        ``ceil(total_kv_tokens / block_size)``."""
        led = self.ledger
        pre = len(led.pending_destinations) + len(led.destination_holds)
        cfg = self.config
        return MockerMetrics.from_parts(
            self.dp_rank,
            self.active_kv_blocks(),
            -(-cfg.total_kv_tokens // cfg.block_size),
            len(self.running),
            len(self.waiting) + len(self.prebuilt_ready) + pre,
            0,
            hit_tokens,
            cache_total_tokens,
        )

    def requests(self) -> Tuple[SglangRequest, ...]:
        """Every scheduler-owned request: waiting, then prebuilt, then running."""
        return self.waiting + self.prebuilt_ready + self.running

    def find(self, request_id: RequestId) -> Optional[SglangRequest]:
        for r in self.requests():
            if r.uuid == request_id:
                return r
        return None


def new_sglang_core(args: EngineArgs, *, dp_rank: int = 0, capture_kv_events: bool = False) -> SglangCore:
    """SG-4: an empty core (core.rs:111-152).  The pool holds ``num_gpu_blocks * block_size``
    token slots with page size ``block_size``; KV events are produced only with a capture sink
    (SGKV-5).  ``new_token_ratio`` starts at ``init_new_token_ratio``."""
    if args.engine_type is not EngineType.SGLANG:
        raise InternalInvariantBroken(f"the SGLang core cannot run engine {args.engine_type}", rule="SG-4")
    config = args.sglang_config()
    kv = skv.new_kv_manager(config.total_kv_tokens, config.block_size, publish_events=capture_kv_events,
                            dp_rank=dp_rank)
    return SglangCore(args=args, config=config, dp_rank=dp_rank, kv=kv, new_token_ratio=config.init_new_token_ratio)


# ---------------------------------------------------------------------------------------------
# The transaction
# ---------------------------------------------------------------------------------------------


@attrs.define
class _Admit:
    """SG-12: what ``get_new_batch_prefill`` returns (prefill.rs:18-27)."""

    can_run: List[SglangRequest] = attrs.Factory(list)
    admissions: List[AdmissionEvent] = attrs.Factory(list)
    total_isl: int = 0
    total_prefix: int = 0
    oom: bool = False
    #: (prompt_len, prefix_tokens, tokens_computed) per admitted chunk
    fpm: List[Tuple[int, int, int]] = attrs.Factory(list)


@attrs.define
class _Decode:
    """SG-18: what the decode step returns (decode.rs:15-22)."""

    retracted: List[SglangRequest]
    completed: List[SglangRequest]
    signals: List[OutputSignal]
    end_ms: float


class _Txn:
    """A mutable working copy of a :class:`SglangCore` for one operation (never escapes)."""

    def __init__(self, core: SglangCore) -> None:
        self.core = core
        self.args = core.args
        self.cfg = core.config
        self.bs = core.config.block_size
        self.kv = skv._Txn(core.kv)
        self.waiting: List[SglangRequest] = list(core.waiting)
        self.prebuilt: List[SglangRequest] = list(core.prebuilt_ready)
        self.running: List[SglangRequest] = list(core.running)
        self.new_token_ratio = core.new_token_ratio
        self.ledger = core.ledger
        self.attempts = core.destination_reservation_attempts
        self.leaked = core.leaked_slots
        self.double_freed = core.double_freed_slots
        self.lifecycle_events: List[object] = []

    @property
    def kv_events(self) -> List[object]:
        return self.kv.events

    def freeze(self) -> SglangCore:
        c = self.core
        return SglangCore(
            args=c.args,
            config=c.config,
            dp_rank=c.dp_rank,
            kv=self.kv.freeze(),
            new_token_ratio=self.new_token_ratio,
            waiting=tuple(self.waiting),
            prebuilt_ready=tuple(self.prebuilt),
            running=tuple(self.running),
            ledger=self.ledger,
            destination_reservation_attempts=self.attempts,
            leaked_slots=self.leaked,
            double_freed_slots=self.double_freed,
        )

    # -- request helpers -------------------------------------------------------------------

    def cache_materialized_prefix(self, req: SglangRequest) -> SglangRequest:
        """SG-16: insert the request's page-aligned materialized prefix and move its lock
        (decode.rs:49-76)."""
        aligned = floor_to_block(req.materialized_tokens, self.bs)
        if aligned == 0 or aligned <= req.cached_tokens:
            return req
        if req.last_node is None:
            raise InternalInvariantBroken(
                f"cache_materialized_prefix: request {req.uuid} has aligned_tokens={aligned} but no last_node",
                rule="SG-16",
            )
        new_last = self.kv.cache_unfinished_req(
            req.sequence_prefix(aligned), req.kv_indices[:aligned], req.last_node, req.cached_tokens
        )
        return attrs.evolve(req, last_node=new_last, cached_tokens=aligned)

    def cleanup_completed_request(self, req: SglangRequest) -> None:
        """SG-22: free the partial tail page, cache the full pages, free duplicate pages, unlock
        (decode.rs:169-193)."""
        seq = req.sequence_tokens()
        keep = floor_to_block(len(seq), self.bs)
        if len(req.kv_indices) > keep:
            self.kv.free_indices(req.kv_indices[keep:])
        if req.last_node is None:
            return
        if keep > 0:
            self.kv.cache_finished_req(seq[:keep], req.kv_indices[:keep], req.last_node, req.cached_tokens)
        else:
            self.kv.tree.dec_lock_ref(req.last_node)

    def free_request_kv(self, req: SglangRequest) -> None:
        """SG-24 / SG-29 (quirks SGQ-3, SGQ-4): free ``kv_indices[cached_tokens:]`` and unlock.

        Ghost accounting (no effect on behaviour): a slot below ``cached_tokens`` that is not the
        tree's slot for its position is never freed again (SGQ-3, leaked); a slot at or above
        ``cached_tokens`` that *is* the tree's slot is freed while the tree keeps it (SGQ-4)."""
        kv = req.kv_indices
        cached = req.cached_tokens
        path = self.kv.tree.path_indices(req.last_node) if req.last_node is not None else ()
        n = min(len(path), len(kv))
        for i in range(n):
            same = kv[i] == path[i]
            if i < cached:
                if not same:
                    self.leaked += 1
            elif same:
                self.double_freed += 1
        for i in range(n, min(cached, len(kv))):
            self.leaked += 1
        self.kv.free_indices(kv[cached:])
        if req.last_node is not None:
            self.kv.tree.dec_lock_ref(req.last_node)

    # -- the pass: policy (SG-10) ------------------------------------------------------------

    def apply_schedule_policy(self) -> None:
        """SG-10: FIFO keeps the order; LPM sorts by (deprioritised, longest cached prefix)
        unless more than 128 requests wait (policy.rs:15-61)."""
        if self.cfg.schedule_policy is not SchedulePolicy.LPM:
            return
        waiting = self.waiting
        if len(waiting) > LPM_FALLBACK_THRESHOLD:
            return
        # the throw-away in-batch tree never allocates: an empty pool suffices (its size is unused)
        temp = CacheTxn(new_radix_cache(0, max(self.bs, 1)))
        tree = self.kv.tree
        deprioritized = set()
        scored = []
        for i, req in enumerate(waiting):
            seq = req.sequence_tokens()
            prefix_len = tree.prefix_match_len(seq)
            if prefix_len <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                in_batch = temp.prefix_match_len(seq)
                if in_batch >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(req.uuid)
                elif seq:
                    temp.insert(seq, range(len(seq)))
            scored.append((req.uuid in deprioritized, -prefix_len, i, req))
        scored.sort(key=lambda t: (t[0], t[1], t[2]))
        self.waiting = [t[3] for t in scored]

    # -- the pass: prefill admission (SG-11..SG-15) --------------------------------------------

    def get_new_batch_prefill(self) -> _Admit:
        """SG-11..SG-15: form the prefill batch from the head of ``waiting`` (prefill.rs:29-184):
        SG-11 the budgets, SG-12 the candidate checks, SG-13 the allocation, SG-14 the admitted
        request's bookkeeping, SG-15 the one rejected head back at the front."""
        cfg = self.cfg
        bs = self.bs
        kv = self.kv
        tree = kv.tree
        out = _Admit()
        ratio = self.new_token_ratio
        clip = cfg.clip_max_new_tokens
        reserved_decode_output = 0.0
        for r in self.running:
            reserved_decode_output += float(min(r.remaining_output_tokens, clip)) * ratio
        overhead = 0
        for queue in (self.waiting, self.running):
            for r in queue:  # extra_reserved_tokens, inlined
                extra = r.allocated_tokens - len(r.kv_indices)
                if extra > 0:
                    overhead += extra
        rem_total = float(max(tree.pool.size + tree.evictable_size - overhead, 0)) - reserved_decode_output
        rem_input = float(cfg.max_prefill_tokens)
        rem_chunk = float(cfg.chunked_prefill_size)
        max_running = cfg.max_running_requests if cfg.max_running_requests is not None else USIZE_MAX
        slots = max(max_running - len(self.running), 0)
        rejected: Optional[SglangRequest] = None
        waiting = self.waiting
        while len(out.can_run) < slots and waiting:
            req = waiting.pop(0)
            extend = req.extend_input_len
            if extend == 0:
                rejected = req  # SGQ-7: an empty prompt blocks the queue
                break
            if extend <= cfg.chunked_prefill_size:
                chunk = extend
            else:
                chunk = (timing.f64_as_u64(rem_chunk) // bs) * bs
                if chunk == 0:
                    rejected = req
                    break
                chunk = min(chunk, extend)
            charged = float(ceil_to_block(chunk, bs))
            output_reserve = 0 if chunk < extend else min(req.remaining_output_tokens, clip)
            if charged + float(output_reserve) >= rem_total:
                rejected = req
                break
            if charged > rem_input or charged > rem_chunk:  # SGQ-6: blocks the queue this pass
                rejected = req
                break
            materialized = req.materialized_tokens
            chunk_end = materialized + chunk
            old_allocated = req.allocated_tokens
            prev_node = req.last_node
            alloc_tokens = req.sequence_prefix(chunk_end)
            new_tokens = max(len(alloc_tokens) - materialized, 0)
            available = tree.pool.size
            if available < new_tokens:
                kv.evict(new_tokens - available)  # SGQ-5: before the request's own match
            if materialized > 0:
                if prev_node is None:
                    raise InternalInvariantBroken(
                        f"prefill: request {req.uuid} has materialized_tokens={materialized} but no last_node",
                        rule="SG-13",
                    )
                # SGQ-1: a continuation does no radix match; it reports `materialized` as reused
                alloc = kv.allocate_after_prefix(alloc_tokens, materialized, req.kv_indices[:materialized], prev_node)
            else:
                # SGQ-2: the new slots enter the tree only when cached later (SG-16, SG-22)
                alloc = kv.allocate_for_request(alloc_tokens)
            if alloc is None:
                rejected = req  # last_node restored: the request value was never changed
                out.oom = True
                break
            if prev_node is not None:
                tree.dec_lock_ref(prev_node)
            allocated = ceil_to_block(chunk_end, bs)  # SG-14: page-rounded logical allocation
            req = attrs.evolve(
                req,
                last_node=alloc.last_node,
                kv_indices=alloc.kv_indices,
                materialized_tokens=chunk_end,
                allocated_tokens=allocated,
            )
            out.admissions.append(AdmissionEvent(req.uuid, alloc.prefix_len))
            out.fpm.append((req.prompt_len, alloc.prefix_len, chunk))
            out.total_isl += chunk_end
            out.total_prefix += alloc.prefix_len
            rem_total -= float(allocated - old_allocated + output_reserve)
            rem_input -= charged
            rem_chunk -= charged
            out.can_run.append(req)
            if rem_chunk <= 0.0:
                break
        if rejected is not None:
            waiting.insert(0, rejected)
        return out

    # -- the pass: decode (SG-17..SG-21) --------------------------------------------------------

    def check_decode_mem(self, max_burst: int) -> List[SglangRequest]:
        """SG-17: retract the fewest-output running requests until the burst fits, never the last
        one; then evict the pool shortfall (decode.rs:87-145)."""
        tree = self.kv.tree
        bs = self.bs
        running = self.running
        retracted: List[SglangRequest] = []
        while True:
            actual = tree.pool.size + tree.evictable_size
            reserved = 0
            growth = 0
            needed = 0
            for r in running:  # extra_reserved_tokens, remaining_output_tokens, current_sequence_len inlined
                n_out = len(r.output_ids)
                allocated = r.allocated_tokens
                reserved += max(allocated - len(r.kv_indices), 0)
                burst = min(max_burst, max(r.max_output_tokens - n_out, 0))
                growth += max(ceil_to_block(len(r.prompt) + n_out + burst, bs) - allocated, 0)
                needed += burst
            logical = max(actual - reserved, 0)
            if actual >= needed and logical >= growth:
                break
            if len(running) <= 1:
                break
            idx = 0
            best = running[0].output_len
            for j in range(1, len(running)):
                if running[j].output_len < best:
                    best = running[j].output_len
                    idx = j
            req = running.pop(idx)
            self.free_request_kv(req)
            retracted.append(req.reset_for_retract())
        available = tree.pool.size
        needed = sum(min(max_burst, r.remaining_output_tokens) for r in running)
        if available < needed:
            self.kv.evict(needed - available)
        return retracted

    def decode_step(self, current_ms: float) -> _Decode:
        """SG-18..SG-21: one decode step over the whole running list (decode.rs:195-340); SG-19 is
        the per-token emission loop."""
        running = self.running
        if not running:
            return _Decode([], [], [], current_ms)
        max_burst = 1  # SG-20: no MTP; a Prefill worker bursts 1 anyway
        retracted = self.check_decode_mem(max_burst)
        if not running:  # unreachable: retraction keeps one request
            return _Decode(retracted, [], [], current_ms)
        total_context = 0
        for r in running:
            total_context += r.current_sequence_len
        # SG-27: decode time of the running list after retraction (TIME-11)
        decode_ns = timing.sglang_decode_duration_ns(len(running), total_context, self.args)
        bursts = [min(max_burst, r.remaining_output_tokens) for r in running]
        reserved = sum(bursts)
        slots = self.kv.tree.pool.allocate(reserved)
        if slots is None:  # SGQ-9: no tokens, no time
            return _Decode(retracted, [], [], current_ms)
        bs = self.bs
        args = self.args
        prefill_worker = args.worker_type is WorkerType.PREFILL
        taken = 0
        signals: List[OutputSignal] = []
        completed_idx: List[int] = []
        for idx, burst in enumerate(bursts):
            req = running[idx]
            for _ in range(burst):
                allocated = req.allocated_tokens
                output_ids = req.output_ids
                if len(req.prompt) + len(output_ids) + 1 > allocated:  # crossing into a new page
                    allocated += bs
                new_idx = slots[taken]
                taken += 1
                token = req.next_output_token()
                output_ids = output_ids + (token,)
                materialized = req.materialized_tokens + 1
                req = SglangRequest(req.uuid, req.prompt, req.max_output_tokens, output_ids, req.last_node,
                                    req.kv_indices + (new_idx,), materialized, req.cached_tokens, allocated,
                                    req.uuid16)
                done = len(output_ids) >= req.max_output_tokens
                delay = None
                if done and prefill_worker:
                    delay = timing.prefill_handoff_delay_ms(args.worker_type, done, req.prompt_len,
                                                            args.kv_transfer_bandwidth, args.kv_bytes_per_token)
                signals.append(OutputSignal(req.uuid, done, False, delay))
                if done:
                    completed_idx.append(idx)
                    break
                aligned = materialized // bs * bs  # cache_materialized_prefix acts only past the cached pages
                if aligned != 0 and aligned > req.cached_tokens:
                    req = self.cache_materialized_prefix(req)
            running[idx] = req
        if taken < len(slots):
            self.kv.release_unpublished(slots[taken:])
        completed: List[SglangRequest] = []
        if completed_idx:
            done_set = set(completed_idx)
            completed = [running[i] for i in completed_idx]
            self.running = running = [r for i, r in enumerate(running) if i not in done_set]
        return _Decode(retracted, completed, signals, timing.advance_ms(current_ms, decode_ns))

    # -- the pass --------------------------------------------------------------------------------

    def promote_prebuilt_ready(self) -> List[AdmissionEvent]:
        """SG-8: activated destinations move to running first, while slots remain (core.rs:768-781)."""
        cfg = self.cfg
        cap = cfg.max_running_requests if cfg.max_running_requests is not None else USIZE_MAX
        admissions: List[AdmissionEvent] = []
        while len(self.running) < cap and self.prebuilt:
            req = self.prebuilt.pop(0)
            admissions.append(AdmissionEvent(req.uuid, 0))
            self.running.append(req)
        return admissions

    def execute_pass(self, now_ms: float) -> PassResult:
        """SG-7..SG-23: one scheduling pass at ``now_ms`` (core.rs:565-745)."""
        cfg = self.cfg
        admissions = self.promote_prebuilt_ready()
        materialized_waiting = bool(self.prebuilt)
        self.apply_schedule_policy()
        # SG-28: a pending destination or a leftover activated request blocks all fresh prefill
        stage = AdmissionInvariant(self.ledger.pending_destinations.has_pending()).stage_for(materialized_waiting)
        admit = self.get_new_batch_prefill() if stage is AdmissionStage.FRESH_KV else _Admit()
        if admit.oom:
            self.new_token_ratio = cfg.init_new_token_ratio
        admissions.extend(admit.admissions)

        batch = len(admit.can_run)
        # SG-26: floor means of the summed chunk ends and prefixes (TIME-3, TIME-8)
        prefill_ns = timing.prefill_duration_ns(batch, admit.total_isl, admit.total_prefix, self.args)
        for req in admit.can_run:
            if req.materialized_tokens < req.current_sequence_len:
                self.waiting.insert(0, self.cache_materialized_prefix(req))
            else:
                self.running.append(req)
        scheduled_decode_lens = [r.current_sequence_len for r in self.running]

        decode_start_ms = timing.advance_ms(now_ms, prefill_ns)
        decode = self.decode_step(decode_start_ms)
        for req in decode.completed:
            self.complete_source(req)
        if decode.retracted:
            self.waiting[0:0] = decode.retracted
        if decode.retracted:  # SG-9 reset; SGGEN-5 bump
            self.new_token_ratio = cfg.init_new_token_ratio
            hc.bump(self)
        ratio = self.new_token_ratio - cfg.new_token_ratio_decay_step
        self.new_token_ratio = ratio if ratio >= cfg.min_new_token_ratio else cfg.min_new_token_ratio

        end_ms = decode.end_ms
        # SG-23, computed when first read: nothing it reads changes after the pass (CORE-3)
        fpm = Deferred(functools.partial(self.compute_fpm, admit.fpm, scheduled_decode_lens,
                                         (end_ms - now_ms) / 1000.0))
        hit = sum(p for _, p, _ in admit.fpm)
        total = sum(p + c for _, p, c in admit.fpm)
        signals = tuple(decode.signals)
        visible, forwards = accept_length_sample(signals)
        lifecycle = tuple(self.lifecycle_events)
        self.lifecycle_events = []
        core = self.freeze()
        return PassResult(
            now_ms=now_ms,
            end_ms=end_ms,
            token_ms=end_ms,
            completed_requests=sum(1 for s in signals if s.completed),
            output_signals=signals,
            admissions=tuple(admissions),
            lifecycle_events=lifecycle,
            metrics=core.metrics(hit, total),
            router_event_visibility="pass_end",
            kv_events=tuple(self.kv.events),
            fpm=fpm,
            accept_length_output_tokens=visible,
            accept_length_decode_forwards=forwards,
        ), core

    def compute_fpm(self, prefills, scheduled_decode_lens, wall_time_secs: float):
        """SG-23: the FPM snapshot (core.rs:663-718)."""
        active = self.ledger.active_destinations
        queued_prefills = []
        queued_decodes = []
        # one scan of waiting: prefills and decodes each keep the waiting order
        if active.by_request:
            for r in self.waiting:
                if r.output_ids or active.contains_request(r.uuid):
                    queued_decodes.append(len(r.prompt) + len(r.output_ids))
                else:
                    queued_prefills.append(len(r.prompt))
        else:
            for r in self.waiting:
                if r.output_ids:
                    queued_decodes.append(len(r.prompt) + len(r.output_ids))
                else:
                    queued_prefills.append(len(r.prompt))
        for r in self.prebuilt:
            queued_decodes.append(r.current_sequence_len)
        for payload in self.ledger.pending_destinations.payloads():
            queued_decodes.append(payload.prompt_len)
        for reserved in self.ledger.destination_holds.payloads():
            queued_decodes.append(reserved.request.prompt_len)
        return build_fpm_snapshot(prefills, scheduled_decode_lens, queued_prefills, queued_decodes, wall_time_secs)

    # -- request lifecycle -------------------------------------------------------------------

    def complete_source(self, req: SglangRequest) -> None:
        """SG-22 / SGGEN-1: a completed request is released (cleanup, bump) or held for its
        handoff (``SourceHeld``, no bump) (core.rs:362-390)."""
        uuid = req.uuid
        transfer = timing.prefill_transfer_timing(req.prompt_len, self.args)
        holds, outcome = self.ledger.source_holds.complete_source(uuid, HeldSglangPrefill(req))
        self.ledger = attrs.evolve(self.ledger, source_holds=holds)
        released = isinstance(outcome, Release)
        if released:
            self.cleanup_completed_request(req)
        else:
            assert isinstance(outcome, Held)
            self.lifecycle_events.append(SourceHeld(outcome.handoff_id, uuid, transfer))
        active, _ = self.ledger.active_destinations.remove_request(uuid)
        self.ledger = attrs.evolve(self.ledger, active_destinations=active)
        if released:
            hc.bump(self)

    # -- handoff hooks (spec/core-commands.md §Hooks) -------------------------------------------

    def scheduler_owns(self, request_id: RequestId) -> bool:
        """SG-25: scheduler-owned = in waiting, prebuilt or running (linear scans, core.rs:342-349)."""
        queues = (self.waiting, self.prebuilt, self.running)
        if type(request_id) is RequestId:
            # equal ids have equal strings: find candidate queues by comparing those in C, then
            # confirm with id equality there
            value = request_id.value
            try:
                candidates = [q for q in queues if value in map(_UUID_VALUE, q)]
            except AttributeError:
                candidates = None
            if candidates is not None:
                return any(r.uuid == request_id for q in candidates for r in q)
        for queue in queues:
            for r in queue:
                if r.uuid == request_id:
                    return True
        return False

    def submit(self, request: DirectRequest) -> None:
        """SG-25: a new request waits at the tail with no KV (core.rs:351-360)."""
        if self.scheduler_owns(request.uuid):
            raise RequestAlreadyActive(f"request {request.uuid} is already active")
        self.waiting.append(new_request(request.uuid, request.tokens, request.max_output_tokens))

    def release_held_source(self, payload: HeldSglangPrefill) -> None:
        """SGGEN-2: a held source's KV is cleaned up as at completion (core.rs:458-461)."""
        self.cleanup_completed_request(payload.request)

    def cancel_scheduled_request(self, request_id: RequestId) -> None:
        """SG-29 / SGGEN-3: remove the request from its queue (waiting, then prebuilt, then running),
        free ``kv_indices[cached_tokens:]`` and unlock (SGQ-3); drop its pending source and active
        destination roles; bump iff it held KV (core.rs:419-456)."""
        req = None
        for queue in (self.waiting, self.prebuilt, self.running):
            for i, r in enumerate(queue):
                if r.uuid == request_id:
                    req = queue.pop(i)
                    break
            if req is not None:
                break
        if req is None:
            return
        improved = bool(req.kv_indices) or req.last_node is not None
        self.free_request_kv(req)
        holds, _ = self.ledger.source_holds.remove_request(request_id)
        active, _ = self.ledger.active_destinations.remove_request(request_id)
        self.ledger = attrs.evolve(self.ledger, source_holds=holds, active_destinations=active)
        if improved:
            hc.bump(self)

    def destination_precheck(self) -> None:
        """SGLang accepts destination reservations on any worker type."""

    def pending_destination_payload(self, request: DirectRequest) -> SglangRequest:
        """SG-30: build the request; reject a prompt whose page-rounded size exceeds the pool
        (core.rs:231-238)."""
        req = new_request(request.uuid, request.tokens, request.max_output_tokens)
        bs = self.bs
        footprint = -(-req.prompt_len // bs) * bs
        if footprint > self.cfg.total_kv_tokens:
            raise DestinationPromptTooLarge("destination prompt exceeds the KV pool capacity", rule="SG-30")
        return req

    def activate_destination(self, handoff_id: HandoffId, request_id: RequestId, reserved: ReservedSglangDecode) -> None:
        """SG-32 / SGGEN-4: commit the transferred prompt into the tree, queue the request in
        ``prebuilt_ready``; bump iff the pool grew (padding returned) (core.rs:63-75, 251-264)."""
        before = self.kv.tree.pool.size
        req = reserved.request
        alloc = self.kv.activate_destination(reserved.kv, req.prompt)
        req = attrs.evolve(
            req,
            last_node=alloc.last_node,
            kv_indices=alloc.kv_indices,
            materialized_tokens=req.prompt_len,
            cached_tokens=floor_to_block(req.prompt_len, self.bs),
            allocated_tokens=reserved.kv.allocated_tokens,
        )
        active, _ = self.ledger.active_destinations.insert(handoff_id, request_id)
        self.ledger = attrs.evolve(self.ledger, active_destinations=active)
        self.prebuilt.append(req)
        if self.kv.tree.pool.size > before:
            hc.bump(self)

    def cancel_reservation(self, reserved: ReservedSglangDecode) -> None:
        """SG-33: unlock the matched prefix and return the fresh slots (no events)."""
        self.kv.cancel_destination(reserved.kv)

    def retry_gate_open(self) -> bool:
        """RETRY-2: SGLang has no running-slot gate."""
        return True

    def note_reservation_attempt(self) -> None:
        self.attempts += 1

    def probe_destination(self, payload: SglangRequest, now_ms: Optional[float]):
        """SG-31: reserve the head's prompt (lock the matched prefix, page-rounded fresh slots);
        ``(reserved, transferable tokens)`` or None.  ``now_ms`` is not used.  No decode headroom
        is kept back (SGQ-8)."""
        res = self.kv.reserve_destination(payload.prompt)
        if res is None:
            return None
        return ReservedSglangDecode(payload, res), res.transferable_prompt_tokens


# ---------------------------------------------------------------------------------------------
# Public pure operations
# ---------------------------------------------------------------------------------------------


class _Ops:
    @staticmethod
    def apply_command_effects(core: SglangCore, command: Command, allow: bool = True, now_ms: Optional[float] = None):
        """CMD-1..CMD-9 on the SGLang core."""
        return hc.command_on_core(core, _Txn, command, allow, now_ms)

    @staticmethod
    def execute_pass(core: SglangCore, now_ms: float):
        txn = _Txn(core)
        result, new = txn.execute_pass(now_ms)
        return new, result

    @staticmethod
    def retry_pending_destinations(core: SglangCore, now_ms: Optional[float] = None):
        return hc.retry_on_core(core, _Txn, now_ms)

    is_empty = staticmethod(SglangCore.is_empty)
    is_drained = staticmethod(SglangCore.is_drained)
    num_requests = staticmethod(SglangCore.num_requests)

    @staticmethod
    def metrics(core: SglangCore) -> MockerMetrics:
        return core.metrics()

    @staticmethod
    def request_status(core: SglangCore, request_id: RequestId) -> Optional[str]:
        """CORE-6 on the SGLang core: queued requests are ``"waiting"`` once their prompt is
        prebuilt (an activated destination, or a retracted request keeping its slots is not:
        retraction frees them), ``"waiting(fresh)"`` otherwise; running ones ``"running"``."""
        for r in core.prebuilt_ready:
            if r.uuid == request_id:
                return "waiting"
        for r in core.waiting:
            if r.uuid == request_id:
                return "waiting(fresh)"
        for r in core.running:
            if r.uuid == request_id:
                return "running"
        return None

    @staticmethod
    def queues(core: SglangCore):
        """CORE-6 on the SGLang core: waiting (prebuilt first, the order the pass takes them),
        then running."""
        return tuple(r.uuid for r in core.prebuilt_ready + core.waiting), tuple(r.uuid for r in core.running)


SglangCore.ops = _Ops
