"""Where requests come from: the flat request queue, in trace or closed-loop mode (DRV-2).

Upstream ``AdmissionQueue`` over a request deque
(lib/mocker/src/replay/offline/components/admission.rs:17-168).
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, List, Optional, Tuple

from model.protocol import DirectRequest
from model.report import TraceCollector
from model.workload import ReplayRequest

__all__ = ["Admission", "to_direct", "record_visible_pass"]


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


def record_visible_pass(col: TraceCollector, result) -> TraceCollector:
    """DRV-1: what a visible pass writes into the collector: ``on_admit`` at the pass start
    for every admission, ``on_token`` at the token stamp for every non-rejected signal."""
    for a in result.admissions:
        col = col.on_admit(a.uuid.value, result.now_ms, a.reused_input_tokens)
    return col.on_tokens([s.uuid.value for s in result.output_signals if not s.rejected], result.token_ms)
