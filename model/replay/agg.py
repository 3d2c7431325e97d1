"""The multi-worker aggregated runtime (spec/replay.md DRV-12..DRV-16).

Upstream ``AggRuntime`` (lib/mocker/src/replay/offline/agg.rs) in round-robin
mode: an event heap of worker completions, one drain loop per timestamp.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from model.engine_args import EngineArgs
from model.report import TerminalStatus, TraceCollector
from model.workload import ReplayRequest

from .admission import make_admission, record_visible_pass, to_direct
import attrs

from .common import WORKER_COMPLETION, CanonicalCores, ClockedRun, EventHeap, Pool, ReplayDeadEnd
from .livelock import CycleDetector, ReplayLivelock, TimedWatch, canonical_state, diagnose, next_arrival_line


class _AggRun(ClockedRun):
    """Local scratch of one aggregated run (never escapes :func:`run_agg`)."""

    def __init__(self, args, num_workers, requests, concurrency, collector, on_progress, max_sim_time_ms=None):
        self.now = 0.0
        self.next_worker_idx = 0
        self.pool = Pool("aggregated", args, num_workers, visible=True)
        self.events = EventHeap()
        self.adm = make_admission(requests, concurrency)
        self.max_sim_time_ms: Optional[float] = max_sim_time_ms
        self.col = collector.set_gpus_per_worker(0, args.aic_gpus_per_worker())
        self.on_progress = on_progress
        self.done_count = 0
        self.detector = CycleDetector()
        self.timed = TimedWatch()  # LIVE-7
        self.canon = CanonicalCores()

    # -- DRV-13: routing and arrivals ------------------------------------------------------

    def next_worker(self) -> int:
        active = self.pool.active_ids()
        i = self.next_worker_idx % len(active)
        self.next_worker_idx = i + 1
        return active[i]

    def release_ready_arrivals(self) -> bool:
        released = False
        for req, arrival in self.adm.drain_ready(self.now, self.pool.in_flight()):
            self.col = self.col.on_arrival(req.uuid, arrival, len(req.tokens), req.max_output_tokens)
            if req.session_id is not None:  # DRV-2: its session (WL-20, DRV-17)
                self.col = self.col.on_session_metadata(req.uuid, req.session_id, req.turn_index)
            w = self.next_worker()
            self.pool.workers[w].receive(to_direct(req, arrival))
            self.col = self.col.on_decode_assigned(req.uuid, w)
            released = True
        if released:
            self.timed.note_activity()
        return released

    # -- DRV-14: completions -----------------------------------------------------------------

    def process_completed_pass(self, result) -> None:
        if result.output_signals or result.completed_requests:
            self.timed.note_emission()
        for s in result.output_signals:
            if s.completed:
                status = TerminalStatus.REJECTED if s.rejected else TerminalStatus.COMPLETED
                self.col = self.col.on_terminal(s.uuid.value, status)
                self.adm.on_request_completed(s.uuid.value, self.now)  # DRV-17
                self.done_count += 1
                if self.on_progress is not None:
                    self.on_progress(self.done_count, self.adm.total)

    def apply_worker_completions(self) -> bool:
        changed = False
        while True:
            payload = self.events.pop_ready(WORKER_COMPLETION, self.now)
            if payload is None:
                return changed
            idx, result = payload
            self.pool.on_scheduled_completion(idx, result.completed_requests)
            self.process_completed_pass(result)
            changed = True

    # -- DRV-6: driving workers ---------------------------------------------------------------

    def drive_ready_workers(self) -> bool:
        changed = False
        self.detector.reset()
        while True:
            eff = self.pool.drive_ready(self.now, self.note_pass)
            if eff is None:
                return changed
            changed = True
            res = eff.result
            self.col = record_visible_pass(self.col, res)
            if eff.immediate:
                self.pool.on_scheduled_completion(eff.worker_idx, res.completed_requests)
                self.process_completed_pass(res)
                # LIVE-1: a quiet zero-duration pass changes nothing but the pool's cores
                if not res.output_signals and res.completed_requests == 0:
                    cycle = self.detector.observe(
                        lambda: tuple((canonical_state(w.core), w.busy) for w in self.pool.workers),
                        [a.uuid.value for a in res.admissions],
                    )
                    if cycle is not None:
                        w = self.pool.workers[eff.worker_idx]
                        raise ReplayLivelock(
                            diagnose("agg", "aggregated", w.idx, self.now, w.core, cycle, self.detector.admitted)
                        )
                else:
                    self.detector.reset()
            else:
                self.events.push(res.end_ms, WORKER_COMPLETION, (eff.worker_idx, res))
                self.detector.reset()

    def note_pass(self, _worker, res) -> None:
        self.timed.note_pass(self.now, res)

    def watch_timed_cycle(self) -> None:
        """LIVE-7: before the clock advances, with no arrival to come and no cap, record the state
        that determines the rest of the run (LIVE-4's budget counts with an arrival to come too)."""
        step = self.timed.step(self.events, self.max_sim_time_ms is not None, self.adm.next_ready_time_ms() is not None,
                               self.adm.released, self.pool.quiet_between_steps)
        if step is None:
            return
        det, one, pending, admitted = step
        found = det.observe(
            lambda: (self.canon.pool_key(self.pool), one, pending, self.adm.released, self.done_count,
                     self.next_worker_idx),
            self.now, admitted,
        )
        if found is not None:
            w_idx = one[1][0] if one is not None and one[0] == WORKER_COMPLETION else min(pending or {(0,)})[0]
            w = self.pool.workers[w_idx]
            diag = diagnose("agg", "aggregated", w.idx, self.now, w.core, found[0], det.admitted)
            other = next_arrival_line(self.adm.next_ready_time_ms())
            raise ReplayLivelock(attrs.evolve(diag, period_ms=found[1], other=other))

    def drain_current_timestamp(self) -> None:
        """DRV-12: completions, arrivals, then passes, until nothing changes."""
        while True:
            changed = self.apply_worker_completions()
            changed |= self.release_ready_arrivals()
            changed |= self.drive_ready_workers()
            if not changed:
                return

    # -- DRV-15: the clock -------------------------------------------------------------------

    def is_done(self) -> bool:
        return self.events.is_empty() and self.pool.in_flight() == 0 and self.adm.is_drained() and self.pool.is_drained()

    def worker_counts(self) -> Tuple[int, int]:
        return 0, len(self.pool.workers)

    def dead_end(self) -> ReplayDeadEnd:
        n = self.pool.in_flight()
        return ReplayDeadEnd(
            f"offline replay reached a dead end with {n} in-flight requests remaining", n, rule="DRV-16",
            stuck=self.pool.stuck(),
        )

def run_agg(
    args: EngineArgs,
    num_workers: int,
    requests: Sequence[ReplayRequest],
    concurrency: Optional[int],
    collector: TraceCollector,
    on_progress: Optional[Callable[[int, int], None]] = None,
    *,
    max_sim_time_ms: Optional[float] = None,
) -> TraceCollector:
    """DRV-12: replay ``requests`` on ``num_workers`` aggregated workers, round-robin at arrival
    (DRV-18: until the next timestamp passes ``max_sim_time_ms``)."""
    return _AggRun(args, num_workers, requests, concurrency, collector, on_progress, max_sim_time_ms).run()
