"""Where requests come from: the flat request queue, in trace or closed-loop mode (DRV-2).

Upstream ``AdmissionQueue`` over a request deque
(lib/mocker/src/replay/offline/components/admission.rs:17-168).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterable, List, Optional, Tuple

from model.protocol import DirectRequest
from model.report import TraceCollector
from model.replay.common import ReplayError
from model.workload import ReplayRequest

__all__ = ["Admission", "WorkloadAdmission", "WorkloadDriver", "make_admission", "to_direct", "record_visible_pass"]


def to_direct(req: ReplayRequest, arrival_ms: Optional[float]) -> DirectRequest:
    return DirectRequest(req.tokens, req.max_output_tokens, req.uuid, 0, arrival_ms)


class Admission:
    """DRV-2: trace mode releases requests whose arrival is due; concurrency mode
    releases requests in list order while ``in_flight < cap``, stamping arrival = now."""

    def __init__(self, requests: Iterable[ReplayRequest], concurrency: Optional[int]) -> None:
        self.pending = deque(requests)
        self.concurrency = concurrency
        self.total = len(self.pending)

    def next_ready_time_ms(self) -> Optional[float]:
        """DRV-2: the front request's arrival (trace mode); None in concurrency mode."""
        if self.concurrency is not None or not self.pending:
            return None
        return self.pending[0].arrival_timestamp_ms

    def drain_ready(self, now_ms: float, cluster_in_flight: int) -> List[Tuple[ReplayRequest, float]]:
        out: List[Tuple[ReplayRequest, float]] = []
        if self.concurrency is None:
            while self.pending:
                arrival = self.pending[0].arrival_timestamp_ms
                if arrival is None or arrival > now_ms:
                    break
                out.append((self.pending.popleft(), arrival))
            return out
        in_flight = cluster_in_flight
        while in_flight < self.concurrency and self.pending:
            out.append((self.pending.popleft(), now_ms))
            in_flight += 1
        return out

    def is_drained(self) -> bool:
        return not self.pending

    @property
    def released(self) -> int:
        """How many requests have been released so far (LIVE-7 keys the admission by it)."""
        return self.total - len(self.pending)

    def on_request_completed(self, uuid: str, now_ms: float) -> None:
        """A flat queue does not care (admission.rs:145-152)."""


def record_visible_pass(col: TraceCollector, result) -> TraceCollector:
    """DRV-1: what a visible pass writes into the collector: ``on_admit`` at the pass start
    for every admission, ``on_token`` at the token stamp for every non-rejected signal."""
    for a in result.admissions:
        col = col.on_admit(a.uuid.value, result.now_ms, a.reused_input_tokens)
    return col.on_tokens([s.uuid.value for s in result.output_signals if not s.rejected], result.token_ms)


class WorkloadDriver:
    """DRV-17: upstream's session workload driver (lib/mocker/src/loadgen/driver.rs:14-720), the
    trace and concurrency policies with full or cumulative (``mooncake-delta``) prompts.

    Sessions keep their trace order.  A session has at most one turn in flight; when a turn
    completes at ``now`` the next one is ready at ``now + delay_after_previous_ms``.  Trace policy:
    session ``s`` is first ready at its first timestamp (0 when absent).  Concurrency policy
    (``max_active_sessions``): the first sessions in trace order are ready at 0, and each session
    that finishes its last turn activates the next pending one at ``now``; a session keeps its slot
    through its think time.  Ready turns pop in (ready time, session index, turn index) order;
    stale heap entries are skipped.  Turn ``k`` released gets uuid ``k`` (upstream draws v4 uuids).
    """

    def __init__(self, trace, max_active_sessions: Optional[int] = None, accumulate_deltas: bool = False) -> None:
        from model.report import uuid_from_int
        from model.workload import synthesize_tokens

        self._uuid = uuid_from_int
        self.concurrency = max_active_sessions
        self.accumulate = accumulate_deltas
        self.session_ids = [s.session_id for s in trace.sessions]
        self.turns = [
            [(t, synthesize_tokens(t, trace.block_size)) for t in s.turns] for s in trace.sessions
        ]
        self.cumulative: List[List[int]] = [[] for _ in trace.sessions]
        self.next_turn = [0] * len(self.turns)
        self.in_flight_of: List[Optional[str]] = [None] * len(self.turns)
        self.in_flight: dict = {}  # uuid -> (session index, turn index)
        self.heap: List[Tuple[float, int, int]] = []
        self.issued = 0
        self.total = sum(len(t) for t in self.turns)
        if max_active_sessions is None:
            self.next_ready: List[Optional[float]] = [
                s.first_arrival_timestamp_ms if s.first_arrival_timestamp_ms is not None else 0.0
                for s in trace.sessions
            ]
            for i, at in enumerate(self.next_ready):
                heapq.heappush(self.heap, (at, i, 0))
        else:
            self.next_ready = [None] * len(self.turns)
            self.next_pending = 0
            self.active = 0
            self._activate_pending(0.0)

    # -- the concurrency policy (driver.rs:152-180) --------------------------------------------

    def _activate_pending(self, now_ms: float) -> None:
        while self.active < self.concurrency and self.next_pending < len(self.turns):
            i = self.next_pending
            self.next_pending += 1
            self.next_ready[i] = now_ms
            heapq.heappush(self.heap, (now_ms, i, self.next_turn[i]))
            self.active += 1

    def _stale(self, entry: Tuple[float, int, int]) -> bool:
        at, i, k = entry
        return self.in_flight_of[i] is not None or self.next_turn[i] != k or self.next_ready[i] != at

    # -- what the admission queue asks (driver.rs:462-540, 650-690) -----------------------------

    def pop_ready(self, now_ms: float, limit: Optional[int] = None) -> List[Tuple["ReplayRequest", float]]:
        """Release the turns ready at ``now_ms`` (at most ``limit``, and in concurrency mode at
        most the free session slots): ``(request, scheduled ready time)`` pairs."""
        from model.workload import ReplayRequest

        cap = len(self.heap) + 1 if limit is None else limit
        if self.concurrency is not None:
            cap = min(cap, max(self.concurrency - len(self.in_flight), 0))
        out: List[Tuple[ReplayRequest, float]] = []
        while len(out) < cap and self.heap:
            entry = self.heap[0]
            if entry[0] > now_ms:
                break
            heapq.heappop(self.heap)
            if self._stale(entry):
                continue
            at, i, k = entry
            turn, tokens = self.turns[i][k]
            if self.accumulate:
                self.cumulative[i].extend(tokens)
                tokens = tuple(self.cumulative[i])
            self.issued += 1
            uuid = self._uuid(self.issued)
            self.in_flight_of[i] = uuid
            self.next_ready[i] = None
            self.in_flight[uuid] = (i, k)
            req = ReplayRequest(
                uuid=uuid, tokens=tokens, max_output_tokens=turn.max_output_tokens,
                arrival_timestamp_ms=None if self.concurrency is not None else at,
                priority=turn.priority, strict_priority=turn.strict_priority, policy_class=turn.policy_class,
                session_id=self.session_ids[i], turn_index=k,
            )
            out.append((req, at))
        return out

    def on_request_completed(self, uuid: str, now_ms: float) -> None:
        """A turn completed (or was rejected) at ``now_ms``: schedule the session's next turn, or
        end the session (concurrency: its slot goes to the next pending session)."""
        if uuid not in self.in_flight:
            raise ReplayError(f"unknown workload request completion for {uuid}", rule="DRV-17")
        i, k = self.in_flight.pop(uuid)
        self.in_flight_of[i] = None
        self.next_turn[i] = k + 1
        if k + 1 < len(self.turns[i]):
            at = now_ms + self.turns[i][k + 1][0].delay_after_previous_ms
            self.next_ready[i] = at
            heapq.heappush(self.heap, (at, i, k + 1))
        else:
            self.next_ready[i] = None
            if self.concurrency is not None:
                self.active = max(self.active - 1, 0)
                self._activate_pending(now_ms)

    def next_ready_time_ms(self) -> Optional[float]:
        """The earliest ready turn's time; None when none is ready or every slot is taken."""
        if self.concurrency is not None and len(self.in_flight) >= self.concurrency:
            return None
        while self.heap:
            if self._stale(self.heap[0]):
                heapq.heappop(self.heap)
                continue
            return self.heap[0][0]
        return None

    def is_drained(self) -> bool:
        return not self.in_flight and all(n >= len(t) for n, t in zip(self.next_turn, self.turns))


class WorkloadAdmission:
    """DRV-17: the admission queue over a :class:`WorkloadDriver` (admission.rs:47-160): trace
    mode releases every ready turn with its scheduled time as arrival; concurrency mode every
    ready turn the driver's session cap allows, with arrival = now."""

    def __init__(self, driver: WorkloadDriver) -> None:
        self.driver = driver
        self.concurrency = driver.concurrency
        self.total = driver.total

    def next_ready_time_ms(self) -> Optional[float]:
        return self.driver.next_ready_time_ms()

    def drain_ready(self, now_ms: float, cluster_in_flight: int) -> List[Tuple["ReplayRequest", float]]:
        ready = self.driver.pop_ready(now_ms)
        if self.concurrency is None:
            return ready
        return [(req, now_ms) for req, _ in ready]

    def on_request_completed(self, uuid: str, now_ms: float) -> None:
        self.driver.on_request_completed(uuid, now_ms)

    def is_drained(self) -> bool:
        return self.driver.is_drained()

    @property
    def released(self) -> int:
        """How many turns the driver has released so far (LIVE-7)."""
        return self.driver.issued


def make_admission(source, concurrency: Optional[int]):
    """DRV-2 / DRV-17: the flat queue for a request list, the workload admission for a driver."""
    if isinstance(source, WorkloadDriver):
        return WorkloadAdmission(source)
    return Admission(source, concurrency)
