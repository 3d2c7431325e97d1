"""The vLLM / TRT-LLM engine core: one scheduling pass and the handoff commands.

Spec: spec/vllm-core.md (rules VLLM-n, TRT-n, VGEN-n).  Upstream:
lib/mocker/src/scheduler/vllm/core.rs and policy.rs at a822423412a0.

The core is a frozen value (:class:`VllmCore`).  Public operations are pure
functions ``(core, input) -> (core, result)``.  Internally each operation works
on a :class:`_Txn`, a short-lived mutable working copy whose algorithm follows
upstream step by step (index loops over the live running deque, preemption
mid-iteration, lazy removal of stale queue entries); the transaction is frozen
into a new core at the end.  Nothing mutable escapes it.
"""

from __future__ import annotations

import enum
import functools
import uuid as _uuid
from typing import Any, ClassVar, Dict, FrozenSet, List, Optional, Tuple

import attrs
import xxhash
from pyrsistent import PVector, pvector

from . import handoff_commands as hc
from . import sequence as seqm
from . import timing
from . import vllm_kv as kvm
from .admission import AdmissionInvariant, AdmissionStage
from .core import Deferred, MockerMetrics, PassResult
from .engine_args import EngineArgs, EngineType, PreemptionMode, WorkerType
from .errors import DestinationPromptTooLarge, DestinationUnsupported, InternalInvariantBroken, RequestAlreadyActive
from .frozen import EMPTY as FROZEN_EMPTY
from .frozen import FrozenDict, adopt, draft
from .fpm import ForwardPassSnapshot, accept_length_sample, build_fpm_snapshot
from .ids import HandoffId, RequestId
from .ledger import HandoffLedger
from .protocol import AdmissionEvent, Command, DirectRequest, OutputSignal, SourceHeld
from .source_holds import Held, Release

USIZE_MAX = 2**64 - 1


def _frozen_dict(value) -> FrozenDict:
    return value if type(value) is FrozenDict else FrozenDict(value)


class RequestStatus(enum.Enum):
    """VLLM-1: a request's status."""

    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"


@attrs.frozen
class VllmRequest:
    """VLLM-1: per-request scheduler state."""

    uuid: RequestId
    sequence: seqm.ActiveSequence
    status: RequestStatus
    num_computed_tokens: int = 0
    num_preemptions: int = 0

    def prompt_is_prebuilt(self) -> bool:
        """VLLM-1: the prompt's KV is computed and allocated (true only for activated destinations,
        and vacuously for an empty prompt: upstream S17)."""
        p = self.sequence.num_input_tokens
        return self.num_computed_tokens >= p and self.sequence.num_allocated_tokens >= p


@attrs.frozen
class HeldVllmPrefill:
    """VGEN-2: a completed source whose final Deref signals are deferred until release."""

    request: VllmRequest
    deferred_deref: Tuple[seqm.Deref, ...]


@attrs.frozen
class ReservedVllmDecode:
    """VLLM-20: a destination with its physical KV reservation."""

    request: VllmRequest
    kv: kvm.DestinationReservation


@attrs.frozen
class VllmCore:
    """VLLM-1: the whole state of one vLLM / TRT-LLM core.

    ``waiting`` and ``running`` may hold stale ids (removed lazily, VLLM-2); the
    ``*_members`` sets say which entries are live.
    ``destination_reservation_attempts`` is upstream's test-only probe counter
    (RETRY-3); it does not take part in equality.
    """

    args: EngineArgs
    dp_rank: int
    kv: kvm.VllmKvState
    requests: FrozenDict = attrs.field(default=FROZEN_EMPTY, converter=_frozen_dict)
    waiting: PVector = attrs.field(default=pvector(), converter=pvector)
    waiting_members: FrozenSet[RequestId] = attrs.field(default=frozenset(), converter=frozenset)
    running: PVector = attrs.field(default=pvector(), converter=pvector)
    running_members: FrozenSet[RequestId] = attrs.field(default=frozenset(), converter=frozenset)
    preemptions_total: int = 0
    ledger: HandoffLedger = HandoffLedger()
    destination_reservation_attempts: int = attrs.field(default=0, eq=False)

    ops: ClassVar[Any]

    # -- queries (VLLM-24, VLLM-25) --

    def is_empty(self) -> bool:
        """VLLM-24: no scheduler-owned request (held sources and pending/reserved destinations excluded)."""
        return not self.requests

    def is_drained(self) -> bool:
        """VLLM-24: empty and every handoff structure empty (LEDGER-5)."""
        return self.is_empty() and self.ledger.is_empty()

    def num_requests(self) -> int:
        return len(self.requests)

    def metrics(self) -> MockerMetrics:
        """VLLM-25: active blocks, running members, waiting members plus pending and reserved destinations."""
        pre = len(self.ledger.pending_destinations) + len(self.ledger.destination_holds)
        return MockerMetrics.from_parts(
            self.dp_rank,
            kvm.num_active_blocks(self.kv),
            self.args.num_gpu_blocks,
            len(self.running_members),
            len(self.waiting_members) + pre,
            self.preemptions_total,
        )


def request_key(request_id: RequestId) -> int:
    """VLLM-3 / SEQ-2 input: a stable 128-bit key per request id (the UUID's integer, else XXH3-128 of the id)."""
    try:
        return _uuid.UUID(request_id.value).int
    except ValueError:
        return xxhash.xxh3_128_intdigest(request_id.value.encode("utf-8"))


def new_vllm_core(args: EngineArgs, *, dp_rank: int = 0, capture_kv_events: bool = False) -> VllmCore:
    """VLLM-1: an empty core.  KV events are produced only with a capture sink and prefix caching on (KV-20)."""
    if args.engine_type not in (EngineType.VLLM, EngineType.TRTLLM):
        raise InternalInvariantBroken(f"the vLLM core cannot run engine {args.engine_type}", rule="VLLM-1")
    kv = kvm.new_kv_manager(
        args.num_gpu_blocks,
        args.block_size,
        dp_rank=dp_rank,
        publish_events=capture_kv_events and args.enable_prefix_caching,
    )
    return VllmCore(args=args, dp_rank=dp_rank, kv=kv)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# Scheduling outcomes
# ---------------------------------------------------------------------------------------------


# VLLM-9: the work scheduled for one request in a pass is five integers at ``_PassScratch.work[i:i+5]``
# (``scheduled`` maps the request to ``i``): total tokens, prompt tokens, prefix tokens, prompt
# length, sequence length.  A flat list, so that scheduling allocates no object per request.
_W_TOTAL, _W_PROMPT, _W_PREFIX, _W_PROMPT_LEN, _W_SEQ_LEN = range(5)


_BLOCKED = "blocked"
_CURRENT_PREEMPTED = "current_preempted"

#: VLLM-14: the quiet output signal of a request (emitted, not completed, no delay) is one
#: immutable value per request id; a bounded table keeps it so a pass does not rebuild one per token
_QUIET_SIGNALS: Dict[RequestId, OutputSignal] = {}
_QUIET_SIGNALS_MAX = 4096


def _quiet_signal(uuid: RequestId) -> OutputSignal:
    sig = _QUIET_SIGNALS.get(uuid)
    if sig is None:
        if len(_QUIET_SIGNALS) >= _QUIET_SIGNALS_MAX:
            _QUIET_SIGNALS.clear()
        sig = _QUIET_SIGNALS[uuid] = OutputSignal(uuid, False, False, None)
    return sig


class _Txn:
    """A mutable working copy of a :class:`VllmCore` for one operation (never escapes)."""

    def __init__(self, core: VllmCore) -> None:
        self.core = core
        self.args = core.args
        self._kv_state = core.kv
        self._kvs: Optional[kvm.KvSession] = None
        self.requests: Dict[RequestId, VllmRequest] = draft(core.requests)
        self.waiting: List[RequestId] = list(core.waiting)
        self.waiting_members = set(core.waiting_members)
        self.running: List[RequestId] = list(core.running)
        self.running_members = set(core.running_members)
        self.preemptions_total = core.preemptions_total
        self.ledger = core.ledger
        self.attempts = core.destination_reservation_attempts
        self.kv_events: List[object] = []
        self.lifecycle_events: List[object] = []
        self.frozen: Optional[VllmCore] = None  # the core a pass ends with (set by execute_pass)
        # by ``id``: requests (and their sequence, or None if shared with the old core) that this
        # pass's scheduling created and nobody else has seen; emission may extend them in place
        self.fresh: Dict[int, Tuple[VllmRequest, Optional[seqm.ActiveSequence]]] = {}

    def freeze(self) -> VllmCore:
        """The new core (called once, at the end of the operation: the request map is frozen in place).

        CORE-7: when the operation changed nothing, the input core itself."""
        c = self.core
        kv = self.kv
        if (
            kv is c.kv
            and self.ledger is c.ledger
            and self.attempts == c.destination_reservation_attempts
            and self.preemptions_total == c.preemptions_total
            and len(self.waiting) == len(c.waiting)
            and len(self.running) == len(c.running)
            and self.requests == c.requests
            and self.waiting == list(c.waiting)
            and self.running == list(c.running)
            and self.waiting_members == c.waiting_members
            and self.running_members == c.running_members
        ):
            return c
        return VllmCore(
            args=self.args,
            dp_rank=c.dp_rank,
            kv=kv,
            requests=adopt(self.requests),
            waiting=pvector(self.waiting),
            waiting_members=frozenset(self.waiting_members),
            running=pvector(self.running),
            running_members=frozenset(self.running_members),
            preemptions_total=self.preemptions_total,
            ledger=self.ledger,
            destination_reservation_attempts=self.attempts,
        )

    # -- KV manager ------------------------------------------------------------------------

    # The KV state is threaded through a batching session (KvSession) while signals are
    # applied; reading or replacing ``kv`` closes the session first, so events stay in order.

    @property
    def kv(self) -> kvm.VllmKvState:
        if self._kvs is not None:
            self._kv_state, events = self._kvs.finish()
            self.kv_events.extend(events)
            self._kvs = None
        return self._kv_state

    @kv.setter
    def kv(self, state: kvm.VllmKvState) -> None:
        if self._kvs is not None:
            raise InternalInvariantBroken("KV session still open", rule="VLLM-1")
        self._kv_state = state

    def _session(self) -> kvm.KvSession:
        if self._kvs is None:
            self._kvs = kvm.KvSession(self._kv_state)
        return self._kvs

    def process(self, signal) -> int:
        kvs = self._kvs
        if kvs is None:
            kvs = self._session()
        return kvs.process(signal)

    def num_active_blocks(self) -> int:
        if self._kvs is not None:
            return self._kvs.num_active_blocks()
        return kvm.num_active_blocks(self._kv_state)

    def prefill_cost(self, seq) -> kvm.PrefillCost:
        return self._session().prefill_cost(seq)

    # -- queue discipline (VLLM-2) ---------------------------------------------------------

    def _update(self, uuid: RequestId, sequence=None, status=None, num_computed_tokens=None) -> VllmRequest:
        old = self.requests[uuid]
        req = VllmRequest(
            old.uuid,
            old.sequence if sequence is None else sequence,
            old.status if status is None else status,
            old.num_computed_tokens if num_computed_tokens is None else num_computed_tokens,
            old.num_preemptions,
        )
        self.requests[uuid] = req
        return req

    def push_waiting(self, uuid: RequestId) -> None:
        if uuid in self.waiting_members:
            return
        self.waiting_members.add(uuid)
        self.waiting.append(uuid)

    def insert_waiting(self, uuid: RequestId, request: VllmRequest) -> None:
        """VLLM-2: add a request and append it to the waiting tail."""
        if uuid in self.requests:
            raise InternalInvariantBroken(f"request {uuid} already in state", rule="VLLM-2")
        self.requests[uuid] = request
        self.push_waiting(uuid)

    def prepend_waiting(self, uuid: RequestId) -> None:
        if uuid in self.waiting_members:
            return
        self.waiting_members.add(uuid)
        self.waiting.insert(0, uuid)

    def remove_from_waiting(self, uuid: RequestId) -> None:
        try:
            self.waiting.remove(uuid)
        except ValueError:
            pass
        self.waiting_members.discard(uuid)

    def next_waiting_uuid(self, prefer_materialized: bool) -> Optional[RequestId]:
        """VLLM-2 / VLLM-11: drop stale heads; then the first prebuilt request (under a pending
        destination, VLLM-Q3) or the head.  A stale entry of a resubmitted id is live again (VLLM-Q8)."""
        while True:
            if not self.waiting:
                return None
            uuid = self.waiting[0]
            req = self.requests.get(uuid)
            if uuid in self.waiting_members and req is not None and req.status is not RequestStatus.RUNNING:
                break
            self.waiting.pop(0)
            self.waiting_members.discard(uuid)
        if prefer_materialized:
            for uuid in self.waiting:
                req = self.requests.get(uuid)
                if uuid in self.waiting_members and req is not None and req.prompt_is_prebuilt():
                    return uuid
            return None
        return self.waiting[0]

    def _is_running(self, uuid: RequestId) -> bool:
        req = self.requests.get(uuid)
        return uuid in self.running_members and req is not None and req.status is RequestStatus.RUNNING

    def compact_running(self) -> None:
        """VLLM-2: rebuild the running deque with only live running entries."""
        kept = []
        get = self.requests.get
        members = self.running_members
        running = RequestStatus.RUNNING
        for uuid in self.running:
            if uuid in members:
                req = get(uuid)
                if req is not None and req.status is running:
                    kept.append(uuid)
                    continue
            members.discard(uuid)
        self.running = kept

    def transition_to_running(self, uuid: RequestId) -> None:
        self.remove_from_waiting(uuid)
        if uuid not in self.running_members:
            self.running_members.add(uuid)
            self.running.append(uuid)
        if uuid in self.requests:
            self._update(uuid, status=RequestStatus.RUNNING)

    def take_completed(self, uuid: RequestId) -> Optional[VllmRequest]:
        """VLLM-2: forget a request; its stale queue entries are skipped later."""
        self.waiting_members.discard(uuid)
        self.running_members.discard(uuid)
        return self.requests.pop(uuid, None)

    def preempt(self, mode: PreemptionMode) -> Optional[Tuple[RequestId, Tuple[seqm.Deref, ...]]]:
        """VLLM-15: pop a victim (back for LIFO, front for FIFO), reset it, prepend it to waiting."""
        while True:
            if not self.running:
                return None
            cand = self.running.pop() if mode is PreemptionMode.LIFO else self.running.pop(0)
            if self._is_running(cand):
                break
            self.running_members.discard(cand)
        self.running_members.discard(cand)
        req = self.requests[cand]
        new_seq, derefs = seqm.reset_with_signal(req.sequence)
        self.requests[cand] = VllmRequest(req.uuid, new_seq, RequestStatus.PREEMPTED, 0, req.num_preemptions + 1)
        self.preemptions_total += 1
        self.prepend_waiting(cand)
        return cand, derefs

    # -- policy ----------------------------------------------------------------------------

    def is_trtllm(self) -> bool:
        return self.args.engine_type is EngineType.TRTLLM

    def policy_preempt(self) -> Optional[Tuple[RequestId, Tuple[seqm.Deref, ...]]]:
        """VLLM-15 / TRT-3 / VGEN-1: preempt under vLLM (bumping the generation); TRT-LLM never preempts."""
        if self.is_trtllm():
            return None
        out = self.preempt(self.args.preemption_mode)
        if out is not None:
            hc.bump(self)
        return out

    def make_request(self, request: DirectRequest, status: RequestStatus) -> VllmRequest:
        """VLLM-3 / TRT-1: build a request's state (TRT-LLM clamps ``max_output_tokens``)."""
        max_out = request.max_output_tokens
        if self.is_trtllm():
            capacity = self.args.num_gpu_blocks * self.args.block_size
            if len(request.tokens) < capacity:
                max_out = min(max_out, capacity - len(request.tokens))
        seq = seqm.new_sequence(
            request_key(request.uuid),
            request.tokens,
            max_out,
            block_size=self.args.block_size,
            enable_prefix_caching=self.args.enable_prefix_caching,
            emit_token_ids=self.args.zmq_kv_events_port is not None,
        )
        return VllmRequest(request.uuid, seq, status)

    def decide_waiting_admission(self, req: VllmRequest):
        """VLLM-13 / TRT-2: ``("admit", cost)``, ``("wait", None)`` or ``("reject", None)``.

        Only a fresh request can be rejected; a preempted one larger than the pool waits (VLLM-Q5)."""
        seq = req.sequence
        n = self.args.num_gpu_blocks
        bs = self.args.block_size
        fresh = req.status is RequestStatus.WAITING
        if fresh:
            footprint = seq.to_completion_blocks() if self.is_trtllm() else seq.current_known_blocks()
            if footprint > n:
                return ("reject", None)
        cost = self.prefill_cost(seq)
        free = max(n - self.num_active_blocks(), 0)
        if self.is_trtllm():
            reserved = 0
            for uuid in self.running:
                other = self.requests.get(uuid)
                if other is not None:
                    reserved += self._blocks_needed_to_finish(other.sequence, None)
            available = max(free - reserved, 0)
            needed = self._blocks_needed_to_finish(seq, cost)
        else:
            available = free
            needed = max(seq.current_known_blocks() - cost.active_cached_tokens // bs, 0)
        if needed > available:
            return ("wait", None)
        return ("admit", cost)

    def _blocks_needed_to_finish(self, seq: seqm.ActiveSequence, cost: Optional[kvm.PrefillCost]) -> int:
        """TRT-2: blocks still to reserve for a request to run to completion."""
        bs = self.args.block_size
        full = seq.to_completion_blocks()
        if seq.num_allocated_tokens == 0:
            active_cached = (cost if cost is not None else self.prefill_cost(seq)).active_cached_tokens
            return max(full - active_cached // bs, 0)
        return max(full - _ceil_div(seq.num_allocated_tokens, bs), 0)

    # -- request lifecycle -----------------------------------------------------------------

    def drop_request(self, uuid: RequestId) -> None:
        """VLLM-17 / VGEN-1: free a scheduler-owned request's KV and forget it; bump if capacity improved."""
        before = self.num_active_blocks()
        req = self.requests.get(uuid)
        if req is None:
            if self.num_active_blocks() < before:
                hc.bump(self)
            return
        improved = (
            req.sequence.num_allocated_tokens > 0
            or uuid in self.running_members
            or self.num_active_blocks() < before
        )
        for sig in seqm.free_signal(req.sequence):
            self.process(sig)
        holds, _ = self.ledger.source_holds.remove_request(uuid)
        active, _ = self.ledger.active_destinations.remove_request(uuid)
        self.ledger = attrs.evolve(self.ledger, source_holds=holds, active_destinations=active)
        self.take_completed(uuid)
        if improved:
            hc.bump(self)

    def complete_source(self, uuid: RequestId, deferred: Tuple[seqm.Deref, ...]) -> None:
        """VLLM-23 / VGEN-1 / VGEN-2: a request finished: release its KV or hold it for its handoff; bump always."""
        req = self.requests.get(uuid)
        transfer = None
        if req is not None:
            transfer = timing.prefill_transfer_timing(req.sequence.num_input_tokens, self.args)
        req = self.take_completed(uuid)
        if req is None:
            raise InternalInvariantBroken("completed request must remain scheduler-owned", rule="VLLM-23")
        holds, outcome = self.ledger.source_holds.complete_source(uuid, HeldVllmPrefill(req, tuple(deferred)))
        self.ledger = attrs.evolve(self.ledger, source_holds=holds)
        if isinstance(outcome, Release):
            self.release_held_source(outcome.payload)
        else:
            assert isinstance(outcome, Held)
            self.lifecycle_events.append(SourceHeld(outcome.handoff_id, uuid, transfer))
        active, _ = self.ledger.active_destinations.remove_request(uuid)
        self.ledger = attrs.evolve(self.ledger, active_destinations=active)
        hc.bump(self)

    # -- handoff hooks (spec/core-commands.md) ---------------------------------------------

    def scheduler_owns(self, request_id: RequestId) -> bool:
        """VLLM-26: scheduler-owned means in the request map."""
        return request_id in self.requests

    def submit(self, request: DirectRequest) -> None:
        """CMD-2 / VLLM-3: a new request waits at the tail with status Waiting."""
        if request.uuid in self.requests:
            raise RequestAlreadyActive(f"request {request.uuid} is already active")
        self.insert_waiting(request.uuid, self.make_request(request, RequestStatus.WAITING))

    def release_held_source(self, payload: HeldVllmPrefill) -> None:
        """VGEN-2: process the deferred Deref signals (no KV events: Deref never publishes)."""
        if payload.deferred_deref:
            self._session().process_each(payload.deferred_deref)

    def cancel_scheduled_request(self, request_id: RequestId) -> None:
        self.drop_request(request_id)

    def destination_precheck(self) -> None:
        """TRT-4: TRT-LLM rejects every reservation before any other check."""
        if self.is_trtllm():
            raise DestinationUnsupported("destination reservation is not supported for TRT-LLM", rule="TRT-4")

    def pending_destination_payload(self, request: DirectRequest) -> VllmRequest:
        """VLLM-20: build the request (status WaitingForRemoteKv); reject a prompt that can never fit."""
        req = self.make_request(request, RequestStatus.WAITING_FOR_REMOTE_KV)
        if req.sequence.current_known_blocks() > self.args.num_gpu_blocks:
            raise DestinationPromptTooLarge("destination prompt exceeds the KV pool capacity", rule="VLLM-20")
        return req

    def activate_destination(self, handoff_id: HandoffId, request_id: RequestId, reserved: ReservedVllmDecode) -> None:
        """VLLM-21 / VGEN-1: publish the reservation, mark the prompt computed, append to waiting;
        bump iff the active-block count fell (cache collision)."""
        before = self.num_active_blocks()
        self.kv, res = kvm.activate_destination(self.kv, reserved.kv)
        self.kv_events.extend(res.events)
        req = reserved.request
        p = req.sequence.num_input_tokens
        req = attrs.evolve(
            req,
            sequence=seqm.commit_allocation(req.sequence, p),
            num_computed_tokens=p,
            status=RequestStatus.WAITING,
        )
        active, _ = self.ledger.active_destinations.insert(handoff_id, request_id)
        self.ledger = attrs.evolve(self.ledger, active_destinations=active)
        self.insert_waiting(request_id, req)
        if self.num_active_blocks() < before:
            hc.bump(self)

    def cancel_reservation(self, reserved: ReservedVllmDecode) -> None:
        """VLLM-22: drop the reservation's handles (no events)."""
        self.kv = kvm.cancel_destination(self.kv, reserved.kv)

    def retry_gate_open(self) -> bool:
        """VLLM-26 / RETRY-2: the head is probed only while the running set has a free slot (S13)."""
        cap = self.args.max_num_seqs if self.args.max_num_seqs is not None else USIZE_MAX
        return len(self.running_members) < cap

    def note_reservation_attempt(self) -> None:
        self.attempts += 1

    def probe_destination(self, payload: VllmRequest, now_ms: Optional[float]):
        """VLLM-20: try to reserve the head's prompt KV; ``(reserved, transferable_tokens)`` or None."""
        self.kv, res = kvm.reserve_destination(self.kv, payload.sequence)
        self.kv_events.extend(res.events)
        if res.reservation is None:
            return None
        return (
            ReservedVllmDecode(payload, res.reservation),
            res.reservation.transferable_prompt_tokens(self.args.block_size),
        )

    # -- the pass --------------------------------------------------------------------------

    def schedule_request(self, uuid: RequestId, from_waiting: bool, cost: Optional[kvm.PrefillCost], p):
        """VLLM-6..VLLM-10: schedule one request against the budget; allocate; preempt on failure.

        A ``Blocked`` return keeps any partial allocation (VLLM-Q2); a fully cached prompt is
        scheduled with no budget (VLLM-Q7)."""
        requests = self.requests
        req = requests[uuid]
        seq = req.sequence
        computed = req.num_computed_tokens
        if computed == 0:
            cached = cost.cached_tokens if cost is not None else self.prefill_cost(seq).cached_tokens
        else:
            cached = 0
        effective_before = computed + cached
        prompt_len = len(seq.prompt)
        # min/max written out (hot path)
        prompt_before = effective_before if effective_before < prompt_len else prompt_len
        remaining = prompt_len + len(seq.generated) - effective_before
        if remaining < 0:
            remaining = 0
        prompt_remaining = prompt_len - prompt_before  # >= 0
        budget = p.budget
        if prompt_remaining > 0 and not self.args.enable_chunked_prefill and prompt_remaining > budget:
            return _BLOCKED
        desired = remaining if remaining < budget else budget
        if desired == 0 and remaining > 0:
            return _BLOCKED
        target = effective_before + desired
        actual = target
        bs = self.args.block_size
        seq_len = -1  # set by the allocation fast paths (the sequence's length does not change)
        # VLLM-7: the allocation loop; VLLM-8: preempt and retry on a short allocation
        while True:
            seq = req.sequence  # ``req`` is the request's current state
            prev_alloc = seq.num_allocated_tokens
            if target <= prev_alloc:
                req = VllmRequest(req.uuid, seq, req.status, actual, req.num_preemptions)
                requests[uuid] = req
                self.fresh[id(req)] = (req, None)
                seq_len = len(seq.prompt) + len(seq.generated)
                break
            # SEQ-6: prepare_allocation yields no signal iff the target needs no new unique block
            sbs = seq.block_size
            n_ub = len(seq.unique_blocks)
            if min(-(-target // sbs), n_ub) <= min(-(-prev_alloc // sbs), n_ub):
                seq = seqm.with_allocated(seq, target)
                req = VllmRequest(req.uuid, seq, req.status, actual, req.num_preemptions)
                requests[uuid] = req
                self.fresh[id(req)] = (req, seq)
                seq_len = len(seq.prompt) + len(seq.generated)
                break
            signal = seqm.prepare_allocation(seq, target)
            expected = len(signal.blocks)
            got = self.process(signal)
            req = requests[uuid]
            if got == expected:
                committed = target
            else:
                prev_blocks = min(_ceil_div(prev_alloc, bs), len(req.sequence.unique_blocks))
                committed = (prev_blocks + got) * bs
            current = min(actual, committed)
            req = self._update(
                uuid,
                sequence=seqm.commit_allocation(req.sequence, min(committed, target)),
                num_computed_tokens=current,
            )
            if got == expected:
                break
            victim = self.policy_preempt()
            if victim is None:
                actual = current
                break
            victim_id, derefs = victim
            for sig in derefs:
                self.process(sig)
            p.preempted_any = True
            undone = p.scheduled.pop(victim_id, None)
            if undone is not None:
                work = p.work
                p.budget += work[undone + _W_TOTAL]
                undone_prompt, undone_prefix = work[undone + _W_PROMPT], work[undone + _W_PREFIX]
                if undone_prompt > 0 and self.args.worker_type is not WorkerType.DECODE:
                    p.batch_count = max(p.batch_count - 1, 0)
                    p.batch_total_isl = max(p.batch_total_isl - (undone_prefix + undone_prompt), 0)
                    p.batch_total_prefix = max(p.batch_total_prefix - undone_prefix, 0)
            if victim_id == uuid:
                return _CURRENT_PREEMPTED
            req = requests[uuid]
        used = actual - effective_before
        if used < 0:
            used = 0
        if seq_len < 0:
            req = requests.get(uuid)
            seq_len = len(req.sequence) if req is not None else 0
        if used == 0 and actual < seq_len:
            return _BLOCKED
        prompt_tokens = (actual if actual < prompt_len else prompt_len) - prompt_before
        if prompt_tokens < 0:
            prompt_tokens = 0
        work = p.work
        p.scheduled[uuid] = len(work)
        work += (used, prompt_tokens, prompt_before, prompt_len, seq_len)
        if prompt_tokens > 0 and self.args.worker_type is not WorkerType.DECODE:
            p.batch_count += 1
            p.batch_total_isl += prompt_before + prompt_tokens
            p.batch_total_prefix += prompt_before
        if from_waiting:
            self.transition_to_running(uuid)
        budget = p.budget - used
        p.budget = budget if budget > 0 else 0
        if from_waiting:
            p.admissions.append(AdmissionEvent(uuid, cached))
        return used

    def emit_ready_tokens(self, decode_start_ms: float):
        """VLLM-14 / VLLM-16: one token for every running request whose known tokens are computed.

        ``max_output_tokens = 0`` is never ready (VLLM-Q4); the final token may allocate (VLLM-Q6)."""
        ready = []
        total_length = 0
        requests = self.requests
        get = requests.get
        for uuid in self.running:
            req = get(uuid)
            if req is None:
                continue
            seq = req.sequence
            n_gen = len(seq.generated)
            length = len(seq.prompt) + n_gen
            if req.num_computed_tokens < length or n_gen >= seq.max_output_tokens:
                continue
            ready.append(uuid)
            total_length += length
        if not ready:
            return 0, decode_start_ms, []
        decode_ns = timing.vllm_decode_duration_ns(len(ready), total_length, self.num_active_blocks(), self.args)
        if self.args.worker_type is WorkerType.PREFILL:
            decode_end_ms = decode_start_ms
        else:
            decode_end_ms = timing.advance_ms(decode_start_ms, decode_ns)
        signals: List[OutputSignal] = []
        running_changed = False
        running_members = self.running_members
        generate_quiet = seqm.generate_quiet
        fresh = self.fresh.get
        quiet, quiet_signal = _QUIET_SIGNALS.get, _quiet_signal
        for uuid in ready:
            # fast path: no block signal and not the last token: emitted, not completed (no delay)
            if uuid in running_members:
                req = get(uuid)
                if req is not None:
                    made = fresh(id(req))
                    if made is not None and made[0] is req:
                        # this pass's scheduling built ``req``: extend it in place
                        seq = req.sequence
                        if made[1] is seq:
                            if seqm.generate_quiet_in_place(seq):
                                signals.append(quiet(uuid) or quiet_signal(uuid))
                                continue
                        else:
                            new_seq = generate_quiet(seq)
                            if new_seq is not None:
                                object.__setattr__(req, "sequence", new_seq)
                                signals.append(quiet(uuid) or quiet_signal(uuid))
                                continue
                    else:
                        new_seq = generate_quiet(req.sequence)
                        if new_seq is not None:
                            requests[uuid] = VllmRequest(
                                req.uuid, new_seq, req.status, req.num_computed_tokens, req.num_preemptions
                            )
                            signals.append(quiet(uuid) or quiet_signal(uuid))
                            continue
            emitted = False
            completed = False
            deferred: Tuple[seqm.Deref, ...] = ()
            while True:
                if uuid not in self.running_members or uuid not in self.requests:
                    break
                req = self.requests[uuid]
                new_seq, sigs = seqm.generate(req.sequence)
                completed = new_seq.generated_tokens >= new_seq.max_output_tokens
                if completed:
                    immediate = tuple(s for s in sigs if not isinstance(s, seqm.Deref))
                    cleanup = tuple(s for s in sigs if isinstance(s, seqm.Deref))
                else:
                    immediate, cleanup = tuple(sigs), ()
                self._update(uuid, sequence=new_seq)
                if not immediate or self._process_decode_signals(immediate):
                    if immediate and not completed:
                        cur = self.requests[uuid].sequence
                        self._update(uuid, sequence=seqm.commit_allocation(cur, len(cur)))
                    emitted = True
                    deferred = cleanup
                    break
                cur = self.requests[uuid].sequence
                self._update(uuid, sequence=seqm.pop(cur))
                victim = self.policy_preempt()
                if victim is None:
                    break
                running_changed = True
                victim_id, derefs = victim
                for sig in derefs:
                    self.process(sig)
                if victim_id == uuid:
                    break
            if not emitted:
                continue
            req = self.requests[uuid]
            delay = timing.prefill_handoff_delay_ms(
                self.args.worker_type, completed, req.sequence.num_input_tokens,
                self.args.kv_transfer_bandwidth, self.args.kv_bytes_per_token,
            )
            signal = OutputSignal(uuid, completed, False, delay)
            if completed:
                self.complete_source(uuid, deferred)
                running_changed = True
            signals.append(signal)
        if running_changed:
            self.compact_running()
        if not signals:
            return 0, decode_end_ms, signals
        return decode_ns, decode_end_ms, signals

    def _process_decode_signals(self, signals) -> bool:
        """VLLM-16: apply Promote/Use in order; a Use that cannot allocate its one partial block fails."""
        for sig in signals:
            if self.process(sig) > 0:
                continue
            if not isinstance(sig, seqm.Use) or len(sig.blocks) != 1 or not isinstance(sig.blocks[0], seqm.PartialBlock):
                raise InternalInvariantBroken(f"unexpected failed decode signal {sig!r}", rule="VLLM-16")
            return False
        return True

    def execute_pass(self, now_ms: float) -> PassResult:
        """VLLM-4..VLLM-19: one scheduling pass at ``now_ms`` (VLLM-18 assembles the result)."""
        requests_before = len(self.requests)
        self.compact_running()
        p = _PassScratch(self.args.max_num_batched_tokens if self.args.max_num_batched_tokens is not None else USIZE_MAX)

        # VLLM-5: the running loop, indexing the live deque (FIFO preemption skips one: VLLM-Q1)
        i = 0
        while i < len(self.running) and p.budget > 0:
            uuid = self.running[i]
            out = self.schedule_request(uuid, False, None, p)
            if out is _BLOCKED:
                break
            if out is _CURRENT_PREEMPTED:
                continue
            i += 1

        # VLLM-11 / VLLM-12: the waiting loop
        max_running = self.args.max_num_seqs if self.args.max_num_seqs is not None else USIZE_MAX
        invariant = AdmissionInvariant(self.ledger.pending_destinations.has_pending())
        rejected: List[RequestId] = []
        while not p.preempted_any and len(self.running) < max_running:
            prefer = invariant.stage_for(False) is AdmissionStage.PENDING_DESTINATION_HEAD
            uuid = self.next_waiting_uuid(prefer)
            if uuid is None:
                break
            req = self.requests[uuid]
            stage = invariant.stage_for(req.prompt_is_prebuilt())
            if stage is AdmissionStage.MATERIALIZED:
                p_len = req.sequence.num_input_tokens
                decision = ("admit", kvm.PrefillCost(0, 0, p_len, p_len))
            elif stage is AdmissionStage.PENDING_DESTINATION_HEAD:
                break
            else:
                decision = self.decide_waiting_admission(req)
            kind, cost = decision
            if kind == "wait":
                break
            if kind == "reject":
                rejected.append(uuid)
                self.drop_request(uuid)
                continue
            used = self.schedule_request(uuid, True, cost, p)
            if used is _BLOCKED or used is _CURRENT_PREEMPTED:
                break
            if used == 0 and p.budget == 0:
                break

        # VLLM-18: timing and emission
        prefill_ns = timing.prefill_duration_ns(p.batch_count, p.batch_total_isl, p.batch_total_prefix, self.args)
        decode_start_ms = timing.advance_ms(now_ms, prefill_ns)
        decode_ns, token_ms, signals = self.emit_ready_tokens(decode_start_ms)
        for uuid in rejected:
            signals.append(OutputSignal(uuid, True, True, None))
        end_ms = timing.advance_ms(decode_start_ms, decode_ns)
        # VLLM-19, computed when first read: nothing it reads changes after the pass (CORE-3)
        fpm = Deferred(functools.partial(self.compute_fpm, p, (end_ms - now_ms) / 1000.0))
        visible, forwards = accept_length_sample(signals)
        lifecycle = tuple(self.lifecycle_events)
        self.lifecycle_events = []
        frozen = self.freeze()  # closes the KV session, so kv_events is complete
        self.frozen = frozen
        return PassResult(
            now_ms=now_ms,
            end_ms=end_ms,
            token_ms=token_ms,
            completed_requests=max(requests_before - len(self.requests), 0),
            output_signals=tuple(signals),
            admissions=tuple(p.admissions),
            lifecycle_events=lifecycle,
            metrics=frozen.metrics(),
            router_event_visibility="pass_start",
            kv_events=tuple(self.kv_events),
            fpm=fpm,
            accept_length_output_tokens=visible,
            accept_length_decode_forwards=forwards,
        )

    def compute_fpm(self, p: "_PassScratch", wall_time_secs: float) -> ForwardPassSnapshot:
        """VLLM-19: the FPM snapshot (scheduled in scheduling order; upstream iterates a hash map).

        The waiting scans iterate the deque, so a revived stale entry counts twice (VLLM-Q8)."""
        work = p.work
        prefills = []
        decodes = []
        for i in p.scheduled.values():
            if work[i + _W_PROMPT] > 0:
                prefills.append((work[i + _W_PROMPT_LEN], work[i + _W_PREFIX], work[i + _W_TOTAL]))
            else:
                decodes.append(work[i + _W_SEQ_LEN])
        active = set(self.ledger.active_destinations.by_request)
        queued_prefills = []
        queued_decodes = []
        get = self.requests.get
        waiting_status, preempted = RequestStatus.WAITING, RequestStatus.PREEMPTED
        # one scan of the deque; the decode list keeps the deque order of the upstream scan
        if active:
            for uuid in self.waiting:
                req = get(uuid)
                if req is None:
                    continue
                status = req.status
                if uuid in active:
                    queued_decodes.append(len(req.sequence.prompt))
                elif status is waiting_status:
                    queued_prefills.append(len(req.sequence.prompt))
                elif status is preempted:
                    seq = req.sequence
                    queued_decodes.append(len(seq.prompt) + len(seq.generated))
        else:  # the same scan without the (empty) active-destination test, as comprehensions
            reqs = [req for req in map(get, self.waiting) if req is not None]
            queued_prefills = [len(req.sequence.prompt) for req in reqs if req.status is waiting_status]
            if len(queued_prefills) < len(reqs):
                queued_decodes = [len(seq.prompt) + len(seq.generated)
                                  for req in reqs if req.status is preempted for seq in (req.sequence,)]
        for payload in self.ledger.pending_destinations.payloads():
            queued_decodes.append(payload.sequence.num_input_tokens)
        for reserved in self.ledger.destination_holds.payloads():
            queued_decodes.append(reserved.request.sequence.num_input_tokens)
        return build_fpm_snapshot(prefills, decodes, queued_prefills, queued_decodes, wall_time_secs)


@attrs.define
class _PassScratch:
    """Pass-local counters (VLLM-4)."""

    budget: int
    scheduled: Dict[RequestId, int] = attrs.Factory(dict)  # request -> its offset in ``work``
    work: List[int] = attrs.Factory(list)
    admissions: List[AdmissionEvent] = attrs.Factory(list)
    batch_count: int = 0
    batch_total_isl: int = 0
    batch_total_prefix: int = 0
    preempted_any: bool = False


# ---------------------------------------------------------------------------------------------
# Public pure operations
# ---------------------------------------------------------------------------------------------


class _Ops:
    @staticmethod
    def apply_command_effects(core: VllmCore, command: Command, allow: bool = True, now_ms: Optional[float] = None):
        """CMD-1..CMD-9 on the vLLM core."""
        return hc.command_on_core(core, _Txn, command, allow, now_ms)

    @staticmethod
    def execute_pass(core: VllmCore, now_ms: float):
        txn = _Txn(core)
        result = txn.execute_pass(now_ms)
        return txn.frozen, result  # frozen once, at the end of the pass

    @staticmethod
    def retry_pending_destinations(core: VllmCore, now_ms: Optional[float] = None):
        return hc.retry_on_core(core, _Txn, now_ms)

    is_empty = staticmethod(VllmCore.is_empty)
    is_drained = staticmethod(VllmCore.is_drained)
    num_requests = staticmethod(VllmCore.num_requests)
    metrics = staticmethod(VllmCore.metrics)

    @staticmethod
    def request_status(core: VllmCore, request_id: RequestId) -> Optional[str]:
        """CORE-6 on the vLLM core: the request's status (a waiting request is split by whether
        its prompt is prebuilt)."""
        req = core.requests.get(request_id)
        if req is None:
            return None
        value = req.status.value
        if value == "waiting":
            return "waiting" if req.prompt_is_prebuilt() else "waiting(fresh)"
        return value

    @staticmethod
    def queues(core: VllmCore):
        """CORE-6 on the vLLM core: stale queue entries (not in the member sets) skipped."""
        return _live_once(core.waiting, core.waiting_members), _live_once(core.running, core.running_members)


def _live_once(queue, members) -> Tuple[RequestId, ...]:
    out: List[RequestId] = []
    seen = set()
    for u in queue:
        if u in members and u not in seen:
            seen.add(u)
            out.append(u)
    return tuple(out)


VllmCore.ops = _Ops
