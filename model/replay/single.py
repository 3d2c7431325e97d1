"""The single-worker runtime (spec/replay.md DRV-9..DRV-11).

Upstream ``SingleRuntime`` (lib/mocker/src/replay/offline/single.rs): one
aggregated worker, no event heap; passes run back to back while work exists.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs

from model import core as C
from model.engine_args import EngineArgs
from model.protocol import Submit
from model.report import TerminalStatus, TraceCollector
from model.workload import ReplayRequest

from .admission import WorkloadAdmission, make_admission, record_visible_pass, to_direct
from .common import ReplayDeadEnd, ReplayError
from .dead_end import StuckWorker
from .livelock import (
    CycleDetector, ReplayLivelock, SilentBudget, TimedCycleDetector, canonical_state, diagnose, next_arrival_line,
)

#: DRV-11: consecutive no-progress passes before the dead-end error (single.rs:26)
MAX_CONSECUTIVE_NO_PROGRESS_PASSES = 1024


def run_single(
    args: EngineArgs,
    requests: Sequence[ReplayRequest],
    concurrency: Optional[int],
    collector: TraceCollector,
    on_progress: Optional[Callable[[int, int], None]] = None,
    *,
    max_sim_time_ms: Optional[float] = None,
) -> TraceCollector:
    """DRV-9: replay ``requests`` on one worker; returns the filled collector (DRV-18: the loop
    stops once the clock has passed ``max_sim_time_ms``)."""
    col = collector.set_static_worker_count(0, 1).set_gpus_per_worker(0, args.aic_gpus_per_worker())
    core = C.new_core(args)
    adm = make_admission(requests, concurrency)
    now = 0.0
    no_progress = 0
    done = 0
    detector = CycleDetector()
    timed = TimedCycleDetector()
    budget = SilentBudget()  # LIVE-4: silent passes with an arrival to come (LIVE-7's detector counts the others)

    def record_arrival(req: ReplayRequest, arrival: float) -> None:
        nonlocal core, col
        core, _ = C.apply_command(core, Submit(to_direct(req, arrival)))
        col = col.on_arrival(req.uuid, arrival, len(req.tokens), req.max_output_tokens)

    def enqueue_trace() -> None:
        for req, arrival in adm.drain_ready(now, 0):
            record_arrival(req, arrival)

    def enqueue_concurrency() -> None:
        available = max(concurrency - C.num_requests(core), 0)
        if isinstance(adm, WorkloadAdmission):  # DRV-17: the driver's session cap applies too
            for req, _ in adm.driver.pop_ready(now, available):
                record_arrival(req, now)
            return
        for _ in range(available):
            if not adm.pending:
                break
            record_arrival(adm.pending.popleft(), now)

    def drive_worker(admit_between: bool) -> None:
        """DRV-10: one pass at ``now``; the clock jumps to its end."""
        nonlocal core, col, now, no_progress, done
        start = now
        before = C.num_requests(core)
        core, res = C.execute_pass(core, now)
        col = record_visible_pass(col, res)
        now = res.end_ms
        progress = (
            now > start
            or C.num_requests(core) < before
            or res.completed_requests > 0
            or bool(res.admissions)
            or bool(res.output_signals)
            or bool(res.kv_events)
        )
        for s in [s for s in res.output_signals if s.completed]:
            adm.on_request_completed(s.uuid.value, now)  # DRV-17
            status = TerminalStatus.REJECTED if s.rejected else TerminalStatus.COMPLETED
            col = col.on_terminal(s.uuid.value, status)
            done += 1
        if on_progress is not None and res.completed_requests:
            on_progress(done, adm.total)
        if admit_between:
            enqueue_trace()
        if progress:
            no_progress = 0
        else:
            no_progress += 1
            if no_progress >= MAX_CONSECUTIVE_NO_PROGRESS_PASSES and not C.is_empty(core):
                n = C.num_requests(core)
                raise ReplayDeadEnd(
                    f"offline replay reached a dead end with {n} in-flight requests remaining", n, rule="DRV-11",
                    stuck=(StuckWorker("aggregated", 0, core, args),),
                )
        # LIVE-7: a pass that emitted and completed nothing, with no arrival to come and no cap:
        # the core, the no-progress count, the releases and the completions so far determine the
        # rest of the run (a repeat at the same time is LIVE-1's to report)
        silent = (max_sim_time_ms is None and not res.output_signals and res.completed_requests == 0
                  and C.num_requests(core) == before)
        ahead = adm.next_ready_time_ms() if silent else None
        if silent and ahead is None:
            found = timed.observe(lambda: (canonical_state(core), no_progress, adm.released, done), now,
                                  [a.uuid.value for a in res.admissions])
            if found is not None:
                diag = diagnose("single", "aggregated", 0, now, core, found[0], timed.admitted)
                raise ReplayLivelock(attrs.evolve(diag, period_ms=found[1]))
        else:
            timed.reset()
        # LIVE-4: the same budget while an arrival is still to come (a repeat would prove the loop
        # only up to that arrival); a released arrival restarts the count
        if budget.tick(silent and ahead is not None, adm.released):
            diag = diagnose("single", "aggregated", 0, now, core, -1, [a.uuid.value for a in res.admissions])
            raise ReplayLivelock(attrs.evolve(diag, period_ms=0.0, other=next_arrival_line(ahead)))
        # LIVE-1: a quiet pass at constant time (no output, no completion)
        if now == start and not res.output_signals and res.completed_requests == 0:
            cycle = detector.observe(lambda: (canonical_state(core), no_progress),
                                     [a.uuid.value for a in res.admissions])
            if cycle is not None:
                raise ReplayLivelock(diagnose("single", "aggregated", 0, now, core, cycle, detector.admitted))
        else:
            detector.reset()

    while not (C.is_empty(core) and adm.is_drained()):
        if max_sim_time_ms is not None and now > max_sim_time_ms:  # DRV-18
            break
        if concurrency is None:
            enqueue_trace()
            if C.is_empty(core):
                nxt = adm.next_ready_time_ms()
                if nxt is None:
                    raise ReplayError("trace replay reached an idle state without a pending arrival", rule="DRV-10")
                now = nxt
                enqueue_trace()
                continue
            drive_worker(True)
        else:
            enqueue_concurrency()
            if C.is_empty(core):
                if adm.is_drained():
                    break
                nxt = adm.next_ready_time_ms()  # a session's next turn after its think time (DRV-17)
                if nxt is None:
                    raise ReplayError("trace replay reached an idle state without a pending arrival", rule="DRV-10")
                now = nxt
                continue
            drive_worker(False)
    return col
