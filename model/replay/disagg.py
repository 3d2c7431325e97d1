"""The disaggregated runtime (spec/replay.md DIS-1..DIS-15).

Upstream ``DisaggRuntime`` (lib/mocker/src/replay/offline/disagg.rs) in
round-robin mode: a hidden prefill pool, a visible decode pool, one handoff
coordinator per request, an action FIFO with parking for busy workers, and
transfer-completion events.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Dict, Optional, Sequence, Tuple

import attrs

from model.engine_args import EngineArgs, EngineType
from model.errors import CommandRejected, InternalInvariantBroken, InvalidInput
from model.ids import HandoffId
from model.protocol import (
    APPLIED,
    NOOP,
    ActivateDestination,
    CancelDestination,
    CancelSource,
    DestinationAccepted,
    DestinationReserved,
    ReleaseSource,
    ReserveDestination,
    SourceHeld,
    SubmitHandoffPrefill,
    Submitted,
)
from model.report import TerminalStatus, TraceCollector
from model.workload import ReplayRequest

from .admission import make_admission, record_visible_pass, to_direct
from .common import (
    TRANSFER_COMPLETE,
    WORKER_COMPLETION,
    CanonicalCores,
    ClockedRun,
    EventHeap,
    Pool,
    ReplayDeadEnd,
    ReplayError,
    count_map,
)
from .coordinator import (
    ActionKind,
    CanceledFact,
    Completion,
    DestinationReservedFact,
    Failed,
    FailedFact,
    HandoffOrder,
    IssuedAction,
    Outcome,
    SourceHeldFact,
    TransferCompletedFact,
    TimedOutFact,
    new_coordinator,
)
from .livelock import CycleDetector, ReplayLivelock, TimedWatch, canonical_state, diagnose, next_arrival_line

PREFILL = "prefill"
DECODE = "decode"

# DIS-3: request phases (upstream ``DisaggPhase``)
AWAITING_DESTINATION = "awaiting_destination"
QUEUED_PREFILL = "queued_prefill"
RUNNING_PREFILL = "running_prefill"
TRANSFER_PENDING = "transfer_pending"
READY_DECODE = "ready_decode"
RUNNING_DECODE = "running_decode"
CLEANUP_PENDING = "cleanup_pending"
DONE = "done"


def handoff_order(prefill: EngineArgs, decode: EngineArgs) -> HandoffOrder:
    """DIS-1: vLLM+vLLM is SourceFirst, SGLang+SGLang DestinationFirst; TRT-LLM or mixed engines are errors."""
    p, d = prefill.engine_type, decode.engine_type
    if p is EngineType.VLLM and d is EngineType.VLLM:
        return HandoffOrder.SOURCE_FIRST
    if p is EngineType.SGLANG and d is EngineType.SGLANG:
        return HandoffOrder.DESTINATION_FIRST
    if EngineType.TRTLLM in (p, d):
        raise InvalidInput("engine_type", "trtllm", "offline disaggregated replay does not support TRT-LLM", rule="DIS-1")
    raise InvalidInput("engine_type", f"{p.value}/{d.value}",
                       "offline disaggregated replay requires matching backend engine types", rule="DIS-1")


def handoff_id_for(uuid: str) -> HandoffId:
    """DIS-3: upstream draws a random handoff id; the model derives one from the request uuid."""
    return HandoffId(f"handoff-{uuid}")


class _Request:
    """DIS-3: per-request state (upstream ``DisaggRequestState``)."""

    __slots__ = ("uuid", "original", "phase", "handoff_id", "coordinator", "counted_in_flight",
                 "prefill_worker", "decode_worker")

    def __init__(self, uuid: str, original, handoff_id: HandoffId, order: HandoffOrder) -> None:
        self.uuid = uuid
        self.original = original
        self.phase = QUEUED_PREFILL if order is HandoffOrder.SOURCE_FIRST else AWAITING_DESTINATION
        self.handoff_id = handoff_id
        self.coordinator = new_coordinator(handoff_id, order)
        self.counted_in_flight = True
        self.prefill_worker: Optional[int] = None
        self.decode_worker: Optional[int] = None

    def prefill_request(self):
        """DIS-3: the prefill copy has ``max_output_tokens = 1``."""
        if self.original is None:
            raise InternalInvariantBroken("offline disagg replay request payload was already released", rule="DIS-3")
        return attrs.evolve(self.original, max_output_tokens=1)


class _ActionQueues:
    """DIS-8: the pending FIFO, the waiting-for-a-worker lists and the per-worker deferred lists."""

    def __init__(self) -> None:
        self.pending: Deque[Tuple[str, IssuedAction]] = deque()
        self.waiting: Dict[str, Deque[Tuple[str, IssuedAction]]] = {PREFILL: deque(), DECODE: deque()}
        self.deferred: Dict[str, Dict[int, Deque[Tuple[str, IssuedAction]]]] = {PREFILL: {}, DECODE: {}}
        self.queued_by_uuid: Dict[str, int] = {}

    def enqueue_all(self, uuid: str, actions) -> None:
        for a in actions:
            self.pending.append((uuid, a))
            count_map(self.queued_by_uuid, uuid, 1)

    def pop_pending(self) -> Optional[Tuple[str, IssuedAction]]:
        if not self.pending:
            return None
        item = self.pending.popleft()
        count_map(self.queued_by_uuid, item[0], -1)
        return item

    def wait_for_worker(self, uuid, action, stage) -> None:
        self.waiting[stage].append((uuid, action))
        count_map(self.queued_by_uuid, uuid, 1)

    def defer(self, uuid, action, stage, worker) -> None:
        self.deferred[stage].setdefault(worker, deque()).append((uuid, action))
        count_map(self.queued_by_uuid, uuid, 1)

    def wake_deferred(self, stage: str, worker: int) -> None:
        actions = self.deferred[stage].pop(worker, None)
        if actions:
            self.pending.extend(actions)

    def remove(self, uuid: str) -> None:
        self.pending = deque(x for x in self.pending if x[0] != uuid)
        for stage in (PREFILL, DECODE):
            self.waiting[stage] = deque(x for x in self.waiting[stage] if x[0] != uuid)
            d = self.deferred[stage]
            for w in list(d):
                d[w] = deque(x for x in d[w] if x[0] != uuid)
                if not d[w]:
                    del d[w]
        self.queued_by_uuid.pop(uuid, None)

    def contains(self, uuid: str) -> bool:
        return uuid in self.queued_by_uuid

    def is_empty(self) -> bool:
        return (
            not self.pending
            and not self.waiting[PREFILL]
            and not self.waiting[DECODE]
            and not self.deferred[PREFILL]
            and not self.deferred[DECODE]
        )


_APPLIED, _WAITING, _DEFERRED = "applied", "waiting", "deferred"


def _outcome_of_cleanup(result) -> Outcome:
    if result == APPLIED:
        return Outcome.APPLIED
    if result == NOOP:
        return Outcome.NOOP
    raise ReplayError("handoff cleanup returned an unexpected scheduler result", rule="DIS-9")  # disagg.rs:2180


class _DisaggRun(ClockedRun):
    """Local scratch of one disaggregated run (never escapes :func:`run_disagg`)."""

    def __init__(self, prefill_args, decode_args, num_prefill, num_decode, requests, concurrency, collector, on_progress,
                 max_sim_time_ms=None):
        self.order = handoff_order(prefill_args, decode_args)
        self.now = 0.0
        self.next_prefill_idx = 0
        self.next_decode_idx = 0
        self.adm = make_admission(requests, concurrency)
        self.max_sim_time_ms: Optional[float] = max_sim_time_ms
        self.prefill = Pool(PREFILL, prefill_args, num_prefill, visible=False)
        self.decode = Pool(DECODE, decode_args, num_decode, visible=True)
        self.requests: Dict[str, _Request] = {}
        self.by_handoff: Dict[HandoffId, str] = {}
        self.actions = _ActionQueues()
        self.logical_in_flight = 0
        self.stale_transfer_events = 0
        self.events = EventHeap()
        self.col = collector.set_gpus_per_worker(prefill_args.aic_gpus_per_worker(), decode_args.aic_gpus_per_worker())
        self.on_progress = on_progress
        self.done_count = 0
        self.detectors = {PREFILL: CycleDetector(), DECODE: CycleDetector()}
        self.timed = TimedWatch()  # LIVE-7
        self.canon = CanonicalCores()

    # -- helpers ----------------------------------------------------------------------------

    def state(self, uuid: str) -> _Request:
        st = self.requests.get(uuid)
        if st is None:
            raise InternalInvariantBroken(f"offline disagg replay missing request state for {uuid}", rule="DIS-3")
        return st

    def uuid_for_handoff(self, h: HandoffId) -> str:
        u = self.by_handoff.get(h)
        if u is None:
            raise InternalInvariantBroken(f"offline disagg replay missing handoff {h}", rule="DIS-3")
        return u

    def pool(self, stage: str) -> Pool:
        return self.prefill if stage == PREFILL else self.decode

    def next_worker(self, stage: str) -> int:
        """DIS-10: independent round-robin counters per pool, advanced per routed action."""
        active = self.pool(stage).active_ids()
        if stage == PREFILL:
            i = self.next_prefill_idx % len(active)
            self.next_prefill_idx = i + 1
        else:
            i = self.next_decode_idx % len(active)
            self.next_decode_idx = i + 1
        return active[i]

    # -- coordinator plumbing (DIS-5) -----------------------------------------------------------

    def acknowledge(self, uuid: str, action: IssuedAction, outcome) -> None:
        if isinstance(outcome, Failed):
            self.col = self.col.on_terminal(uuid, TerminalStatus.FAILED)
        st = self.state(uuid)
        st.coordinator, new = st.coordinator.on_action_outcome(action.id, outcome)
        self.actions.enqueue_all(uuid, new)

    def apply_fact(self, uuid: str, fact) -> None:
        self.timed.note_activity()
        if isinstance(fact, (FailedFact, TimedOutFact)):
            self.col = self.col.on_terminal(uuid, TerminalStatus.FAILED)
        elif isinstance(fact, CanceledFact):
            self.col = self.col.on_terminal(uuid, TerminalStatus.CANCELED)
        st = self.state(uuid)
        st.coordinator, new = st.coordinator.on_fact(fact)
        self.actions.enqueue_all(uuid, new)

    # -- DIS-9: executing actions -------------------------------------------------------------------

    def dispatch_prefill(self, uuid: str, worker: int, action: IssuedAction) -> None:
        st = self.state(uuid)
        try:
            eff = self.prefill.apply_command(worker, SubmitHandoffPrefill(st.handoff_id, st.prefill_request()))
        except CommandRejected as exc:
            self.acknowledge(uuid, action, Failed(str(exc)))
            return
        if not (isinstance(eff.result, Submitted) and eff.result.request_id.value == uuid):
            raise ReplayError("offline disagg replay prefill submission returned an unexpected result", rule="DIS-9")
        st.phase = RUNNING_PREFILL
        st.prefill_worker = worker
        self.col = self.col.on_prefill_assigned(uuid, worker)
        self.acknowledge(uuid, action, Outcome.SUBMITTED)
        self.process_lifecycle_events(eff.lifecycle_events)

    def reserve_destination(self, uuid: str, worker: int, action: IssuedAction) -> None:
        st = self.state(uuid)
        if st.original is None:
            raise InternalInvariantBroken("offline disagg replay request payload was already released", rule="DIS-3")
        try:
            eff = self.decode.apply_command(worker, ReserveDestination(st.handoff_id, st.original))
        except CommandRejected as exc:
            self.acknowledge(uuid, action, Failed(str(exc)))
            return
        if not (isinstance(eff.result, DestinationAccepted) and eff.result.request_id.value == uuid):
            raise ReplayError("offline disagg replay destination acceptance returned an unexpected result", rule="DIS-9")
        st.decode_worker = worker
        self.col = self.col.on_decode_assigned(uuid, worker)
        self.acknowledge(uuid, action, Outcome.ACCEPTED)
        self.process_lifecycle_events(eff.lifecycle_events)

    def execute_action(self, uuid: str, action: IssuedAction):
        st = self.state(uuid)
        k = action.kind
        if k is ActionKind.SUBMIT_PREFILL:
            if not self.prefill.workers:
                return _WAITING, PREFILL
            st.phase = QUEUED_PREFILL
            self.col = self.col.on_prefill_route_overlap(uuid, 0)
            self.dispatch_prefill(uuid, self.next_worker(PREFILL), action)
        elif k is ActionKind.RESERVE_DESTINATION:
            if not self.decode.workers:
                return _WAITING, DECODE
            st.phase = AWAITING_DESTINATION
            self.col = self.col.on_decode_route_overlap(uuid, 0)
            self.reserve_destination(uuid, self.next_worker(DECODE), action)
        elif k is ActionKind.START_TRANSFER:
            self.acknowledge(uuid, action, Outcome.SCHEDULED)
            st.phase = TRANSFER_PENDING
            delay = action.delay_ms or 0.0
            if delay > 0.0:
                self.events.push(self.now + delay, TRANSFER_COMPLETE, st.handoff_id)
            else:
                self.apply_fact(uuid, TransferCompletedFact())
        elif k is ActionKind.ACTIVATE_DESTINATION:
            w = st.decode_worker
            if w is None:
                raise ReplayError(f"destination activation has no worker for {uuid}", rule="DIS-9")
            if self.decode.workers[w].busy:
                return _DEFERRED, DECODE, w
            eff = self.decode.apply_command(w, ActivateDestination(st.handoff_id))
            if eff.result != APPLIED:
                self.acknowledge(uuid, action, Failed("destination activation was not applied"))
                return (_APPLIED,)
            st.phase = READY_DECODE
            self.col = self.col.on_destination_activated(uuid, self.now)
            self.acknowledge(uuid, action, Outcome.APPLIED)
            self.process_lifecycle_events(eff.lifecycle_events)
        elif k is ActionKind.RELEASE_SOURCE:
            w = st.prefill_worker
            if w is None:
                raise ReplayError(f"source release has no worker for {uuid}", rule="DIS-9")
            if self.prefill.workers[w].busy:
                return _DEFERRED, PREFILL, w
            eff = self.prefill.apply_command(w, ReleaseSource(st.handoff_id))
            if eff.result == APPLIED:
                outcome = Outcome.APPLIED
            elif eff.result == NOOP:
                outcome = Outcome.NOOP
            else:
                raise ReplayError("source release returned an unexpected result", rule="DIS-9")
            self.col = self.col.on_source_released(uuid, self.now)
            self.acknowledge(uuid, action, outcome)
            self.process_lifecycle_events(eff.lifecycle_events)
        elif k is ActionKind.CANCEL_SOURCE:
            w = st.prefill_worker
            if w is None:
                self.acknowledge(uuid, action, Outcome.NOOP)
                return (_APPLIED,)
            if self.prefill.workers[w].busy:
                return _DEFERRED, PREFILL, w
            eff = self.prefill.apply_command(w, CancelSource(st.handoff_id))
            self.acknowledge(uuid, action, _outcome_of_cleanup(eff.result))
            self.process_lifecycle_events(eff.lifecycle_events)
        elif k is ActionKind.CANCEL_DESTINATION:
            w = st.decode_worker
            if w is None:
                self.acknowledge(uuid, action, Outcome.NOOP)
                return (_APPLIED,)
            if self.decode.workers[w].busy:
                return _DEFERRED, DECODE, w
            eff = self.decode.apply_command(w, CancelDestination(st.handoff_id))
            self.acknowledge(uuid, action, _outcome_of_cleanup(eff.result))
            self.process_lifecycle_events(eff.lifecycle_events)
        elif k is ActionKind.COMPLETE:
            self.complete_handoff(uuid)
        return (_APPLIED,)

    def drive_pending_actions(self) -> bool:
        """DIS-8: run the FIFO to empty; park what cannot run now."""
        changed = False
        while True:
            item = self.actions.pop_pending()
            if item is None:
                return changed
            uuid, action = item
            self.timed.note_activity()
            r = self.execute_action(uuid, action)
            if r[0] == _APPLIED:
                changed = True
            elif r[0] == _WAITING:
                self.actions.wait_for_worker(uuid, action, r[1])
            else:
                self.actions.defer(uuid, action, r[1], r[2])

    # -- DIS-11: lifecycle events ---------------------------------------------------------------------

    def process_lifecycle_events(self, events) -> None:
        if events:
            self.timed.note_activity()
        for ev in events:
            uuid = self.uuid_for_handoff(ev.handoff_id)
            if uuid != ev.request_id.value:
                which = "source" if isinstance(ev, SourceHeld) else "destination"
                raise ReplayError(f"{which} lifecycle request ID does not match its handoff", rule="DIS-11")
            if isinstance(ev, SourceHeld):
                self.col = self.col.on_source_held(uuid, self.now)
                self.apply_fact(uuid, SourceHeldFact(ev.transfer_timing))
            elif isinstance(ev, DestinationReserved):
                self.col = self.col.on_destination_reserved(uuid, self.now)
                self.apply_fact(uuid, DestinationReservedFact(ev.transferable_prompt_tokens))
            else:  # pragma: no cover
                raise ReplayError(f"unknown lifecycle event {ev!r}", rule="DIS-11")

    # -- DIS-12: completion and retirement ----------------------------------------------------------

    def complete_handoff(self, uuid: str) -> None:
        st = self.state(uuid)
        c = st.coordinator.completion
        if c is Completion.SUCCESS:
            self.retire(uuid)
        elif c is Completion.CANCELED:
            self.col = self.col.on_terminal(uuid, TerminalStatus.CANCELED)
            self.finish_logical_request(uuid, True)
        else:
            raise ReplayError("handoff completed without a terminal coordinator outcome", rule="DIS-12")

    def finish_logical_request(self, uuid: str, remove_actions: bool) -> None:
        st = self.state(uuid)
        if not st.counted_in_flight or st.phase == DONE:
            raise ReplayError(f"offline disagg replay finalized request {uuid} more than once", rule="DIS-12")
        transfer_was_pending = st.phase == TRANSFER_PENDING
        self.timed.note_emission()
        st.counted_in_flight = False
        st.phase = CLEANUP_PENDING
        st.original = None
        self.logical_in_flight -= 1
        if transfer_was_pending:
            self.stale_transfer_events += 1
        if remove_actions:
            self.actions.remove(uuid)
        self.adm.on_request_completed(uuid, self.now)  # DRV-17
        self.done_count += 1
        if self.on_progress is not None:
            self.on_progress(self.done_count, self.adm.total)
        self.retire(uuid)

    def retire(self, uuid: str) -> None:
        st = self.state(uuid)
        if st.counted_in_flight or not st.coordinator.is_complete:
            return
        if self.actions.contains(uuid):
            raise ReplayError(f"offline disagg replay completed handoff still has queued actions for {uuid}", rule="DIS-12")
        st.phase = DONE
        if self.by_handoff.pop(st.handoff_id, None) != uuid:
            raise ReplayError(f"offline disagg replay handoff index is inconsistent for {uuid}", rule="DIS-12")

    # -- DIS-2: arrivals -----------------------------------------------------------------------------

    def release_ready_arrivals(self) -> bool:
        released = False
        for req, arrival in self.adm.drain_ready(self.now, self.logical_in_flight):
            uuid = req.uuid
            self.col = self.col.on_arrival(uuid, arrival, len(req.tokens), req.max_output_tokens)
            if req.session_id is not None:  # DRV-2: its session (WL-20, DRV-17)
                self.col = self.col.on_session_metadata(uuid, req.session_id, req.turn_index)
            if uuid in self.requests:
                raise ReplayError(f"offline disagg replay request {uuid} is already active", rule="DIS-2")
            h = handoff_id_for(uuid)
            st = _Request(uuid, to_direct(req, arrival), h, self.order)
            st.coordinator, actions = st.coordinator.start()
            self.requests[uuid] = st
            self.by_handoff[h] = uuid
            self.logical_in_flight += 1
            self.actions.enqueue_all(uuid, actions)
            released = True
        if released:
            self.timed.note_activity()
        return released

    # -- DIS-13: passes ----------------------------------------------------------------------------

    def process_prefill_pass(self, result, lifecycle) -> None:
        for s in result.output_signals:
            if s.completed and s.rejected:
                uuid = s.uuid.value
                self.col = self.col.on_terminal(uuid, TerminalStatus.REJECTED)
                self.apply_fact(uuid, FailedFact())
        self.process_lifecycle_events(lifecycle)

    def process_decode_pass(self, result, lifecycle) -> None:
        for s in result.output_signals:
            if not s.completed:
                continue
            uuid = s.uuid.value
            status = TerminalStatus.REJECTED if s.rejected else TerminalStatus.COMPLETED
            self.col = self.col.on_terminal(uuid, status)
            self.finish_logical_request(uuid, False)
        self.process_lifecycle_events(lifecycle)

    def apply_worker_completions(self) -> bool:
        changed = False
        while True:
            payload = self.events.pop_ready(WORKER_COMPLETION, self.now)
            if payload is None:
                return changed
            stage, idx, result = payload
            pool = self.pool(stage)
            retry_events = pool.on_scheduled_completion(idx, result.completed_requests)
            self.actions.wake_deferred(stage, idx)
            lifecycle = tuple(result.lifecycle_events) + retry_events
            if stage == PREFILL:
                self.process_prefill_pass(result, lifecycle)
            else:
                self.process_decode_pass(result, lifecycle)
            changed = True

    def record_decode_admissions(self, result) -> None:
        for a in result.admissions:
            uuid = a.uuid.value
            self.col = self.col.on_decode_admit(uuid, self.now, a.reused_input_tokens)
            st = self.state(uuid)
            if st.phase == READY_DECODE:
                st.phase = RUNNING_DECODE
            elif st.phase != RUNNING_DECODE:
                raise ReplayError(f"offline disagg replay decode admission for {uuid} in phase {st.phase}", rule="DIS-13")

    def drive_workers(self, stage: str) -> bool:
        """DIS-13: loop ``drive_ready`` on one pool until it returns nothing (LIVE-1 watches the loop)."""
        pool = self.pool(stage)
        detector = self.detectors[stage]
        detector.reset()
        changed = False
        while True:
            eff = pool.drive_ready(self.now, self.note_pass)
            if eff is None:
                return changed
            changed = True
            res = eff.result
            if stage == PREFILL:
                for a in res.admissions:
                    self.col = self.col.on_prefill_admit(a.uuid.value, self.now, a.reused_input_tokens)
            else:
                self.col = record_visible_pass(self.col, res)
                self.record_decode_admissions(res)
            if not eff.immediate:
                self.events.push(res.end_ms, WORKER_COMPLETION, (stage, eff.worker_idx, res))
                detector.reset()
                continue
            retry_events = pool.on_scheduled_completion(eff.worker_idx, res.completed_requests)
            lifecycle = tuple(res.lifecycle_events) + retry_events
            if stage == PREFILL:
                self.process_prefill_pass(res, lifecycle)
            else:
                self.process_decode_pass(res, lifecycle)
            # LIVE-1: a quiet zero-duration pass changed nothing but this pool's cores
            if not res.output_signals and res.completed_requests == 0 and not lifecycle:
                cycle = detector.observe(
                    lambda: tuple((canonical_state(w.core), w.busy) for w in pool.workers),
                    [a.uuid.value for a in res.admissions],
                )
                if cycle is not None:
                    w = pool.workers[eff.worker_idx]
                    diag = diagnose("disagg", stage, w.idx, self.now, w.core, cycle, detector.admitted)
                    diag = attrs.evolve(diag, other=self._livelock_context())
                    raise ReplayLivelock(diag)
            else:
                detector.reset()

    def note_pass(self, _worker, res) -> None:
        self.timed.note_pass(self.now, res)

    def watch_timed_cycle(self) -> None:
        """LIVE-7: before the clock advances, with no arrival to come and no cap, record the state
        that determines the rest of the run (several pending events only with no queued action;
        LIVE-4's budget counts with an arrival to come too)."""
        step = self.timed.step(
            self.events, self.max_sim_time_ms is not None, self.adm.next_ready_time_ms() is not None, self.adm.released,
            lambda: (self.actions.is_empty() and self.prefill.quiet_between_steps()
                     and self.decode.quiet_between_steps()))
        if step is None:
            return
        det, one, pending, admitted = step

        def key():
            a = self.actions
            requests = tuple(sorted((u, st.phase, st.coordinator, st.counted_in_flight, st.prefill_worker,
                                     st.decode_worker) for u, st in self.requests.items() if st.phase != DONE))
            actions = (tuple(a.pending), tuple(a.waiting[PREFILL]), tuple(a.waiting[DECODE]),
                       tuple(sorted((stage, w, tuple(q)) for stage, d in a.deferred.items() for w, q in d.items())))
            return (self.canon.pool_key(self.prefill), self.canon.pool_key(self.decode), one, pending,
                    self.adm.released, self.done_count, self.logical_in_flight, self.next_prefill_idx,
                    self.next_decode_idx, self.stale_transfer_events, requests, actions)

        found = det.observe(key, self.now, admitted)
        if found is not None:
            if one is not None and one[0] == WORKER_COMPLETION:
                stage, w_idx = one[1]
            elif pending:
                stage, w_idx = min(pending)
            else:  # a lone transfer completion: report the first decode worker
                stage, w_idx = DECODE, 0
            w = self.pool(stage).workers[w_idx]
            diag = diagnose("disagg", stage, w.idx, self.now, w.core, found[0], det.admitted)
            other = self._livelock_context() + next_arrival_line(self.adm.next_ready_time_ms())
            raise ReplayLivelock(attrs.evolve(diag, period_ms=found[1], other=other))

    def _livelock_context(self) -> Tuple[str, ...]:
        out = [f"requests in flight: {self.logical_in_flight}"]
        parked = sum(len(v) for d in self.actions.deferred.values() for v in d.values())
        if self.actions.pending or parked:
            out.append(f"actions never reached: {len(self.actions.pending)} queued, {parked} deferred")
        transfers = [p for (_, _, _, k, p) in self.events._heap if k == TRANSFER_COMPLETE]
        if transfers:
            out.append(
                "transfer completions never processed: "
                + ", ".join(sorted(self.by_handoff.get(h, str(h)) for h in transfers))
            )
        return tuple(out)

    # -- DIS-14: the drain loop and the clock ----------------------------------------------------------

    def prune_stale_transfer_events(self) -> bool:
        removed = False
        while True:
            top = self.events.peek()
            if top is None or top[1] != TRANSFER_COMPLETE or top[2] in self.by_handoff:
                break
            self.events.pop()
            self.stale_transfer_events -= 1
            removed = True
            self.timed.note_activity()
        if self.stale_transfer_events > 32 and self.stale_transfer_events * 2 > len(self.events):
            self.events.retain(lambda k, p: not (k == TRANSFER_COMPLETE and p not in self.by_handoff))
            self.stale_transfer_events = 0
            removed = True
            self.timed.note_activity()
        return removed

    def apply_transfer_completions(self) -> bool:
        changed = False
        while True:
            h = self.events.pop_ready(TRANSFER_COMPLETE, self.now)
            if h is None:
                return changed
            uuid = self.by_handoff.get(h)
            if uuid is None:
                continue
            self.apply_fact(uuid, TransferCompletedFact())
            changed = True

    def drain_current_timestamp(self) -> None:
        while True:
            changed = self.prune_stale_transfer_events()
            changed |= self.apply_worker_completions()
            changed |= self.apply_transfer_completions()
            changed |= self.release_ready_arrivals()
            changed |= self.drive_pending_actions()
            changed |= self.drive_workers(PREFILL)
            changed |= self.drive_workers(DECODE)
            if not changed:
                return

    def is_done(self) -> bool:
        return (
            self.events.is_empty()
            and self.logical_in_flight == 0
            and self.adm.is_drained()
            and self.prefill.is_drained()
            and self.decode.is_drained()
            and self.actions.is_empty()
            and not self.by_handoff
        )

    def worker_counts(self) -> Tuple[int, int]:
        return len(self.prefill.workers), len(self.decode.workers)

    def dead_end(self) -> ReplayDeadEnd:
        n = self.logical_in_flight
        return ReplayDeadEnd(
            f"offline disagg replay reached a dead end with {n} in-flight requests remaining", n, rule="DIS-15",
            stuck=self.prefill.stuck() + self.decode.stuck(),
        )

def run_disagg(
    prefill_args: EngineArgs,
    decode_args: EngineArgs,
    num_prefill_workers: int,
    num_decode_workers: int,
    requests: Sequence[ReplayRequest],
    concurrency: Optional[int],
    collector: TraceCollector,
    on_progress: Optional[Callable[[int, int], None]] = None,
    *,
    max_sim_time_ms: Optional[float] = None,
) -> TraceCollector:
    """DIS-1: replay ``requests`` through prefill and decode pools with the handoff coordinator
    (DRV-18: until the next timestamp passes ``max_sim_time_ms``)."""
    run = _DisaggRun(prefill_args, decode_args, num_prefill_workers, num_decode_workers, requests, concurrency,
                     collector, on_progress, max_sim_time_ms)
    return run.run()
