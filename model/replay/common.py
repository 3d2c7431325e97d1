"""Pieces shared by the replay drivers: the event heap, worker bookkeeping, pools, errors.

The drivers keep these in local mutable scratch inside one call of a pure
``run_*`` function; nothing here escapes a run.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs

from model import core as C
from model.errors import ModelError
from model.protocol import Command

__all__ = [
    "ReplayError",
    "ReplayDeadEnd",
    "EventHeap",
    "Worker",
    "Pool",
    "made_progress",
    "PassEffects",
    "ClockedRun",
]


class ReplayError(ModelError):
    """A replay stopped with an error that upstream reports with ``bail!``."""


class ReplayDeadEnd(ReplayError):
    """DRV-8 / DIS-12: nothing left to do while requests are still in flight.

    ``message`` is upstream's text; ``in_flight`` its count; ``stuck`` the workers that still hold
    requests (:class:`model.replay.dead_end.StuckWorker`), which LIVE-6 explains.
    """

    def __init__(self, message: str, in_flight: int, *, rule: str, stuck: Tuple[Any, ...] = ()) -> None:
        super().__init__(message, rule=rule)
        self.in_flight = in_flight
        self.stuck = stuck


# ---------------------------------------------------------------------------------------------
# DRV-3: the event heap
# ---------------------------------------------------------------------------------------------

#: event kinds (upstream ``SimulationEventKind``); planner ticks would sort last (rank 1)
WORKER_COMPLETION = "worker_completion"
TRANSFER_COMPLETE = "transfer_complete"


class EventHeap:
    """DRV-3: a min-heap on ``(at_ms, rank, seq_no)``; ``seq_no`` is a global push counter.

    ``pop_ready(kind, now)`` pops only while the *top* event is of ``kind`` and
    due exactly at ``now`` (a top event of another kind blocks it).
    """

    def __init__(self) -> None:
        self._heap: List[Tuple[float, int, int, str, Any]] = []
        self._seq = 0

    def push(self, at_ms: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (at_ms, 0, self._seq, kind, payload))
        self._seq += 1

    def peek(self) -> Optional[Tuple[float, str, Any]]:
        if not self._heap:
            return None
        at, _, _, kind, payload = self._heap[0]
        return at, kind, payload

    def next_ms(self) -> Optional[float]:
        return self._heap[0][0] if self._heap else None

    def pop_ready(self, kind: str, now_ms: float) -> Optional[Any]:
        if not self._heap:
            return None
        at, _, _, k, payload = self._heap[0]
        if at != now_ms or k != kind:
            return None
        heapq.heappop(self._heap)
        return payload

    def pop(self) -> None:
        heapq.heappop(self._heap)

    def retain(self, keep: Callable[[str, Any], bool]) -> None:
        self._heap = [e for e in self._heap if keep(e[3], e[4])]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def only_event(self) -> Optional[tuple]:
        """LIVE-7: when exactly one event is pending, what its handling depends on (its kind and
        payload, a pass result reduced to its completions, output signals and lifecycle events);
        otherwise None.  With one event the run's future does not depend on when it falls."""
        if len(self._heap) != 1:
            return None
        _at, _rank, _seq, kind, payload = self._heap[0]
        if kind == WORKER_COMPLETION:
            res = payload[-1]
            return (kind, payload[:-1], res.completed_requests, tuple(res.output_signals),
                    tuple(res.lifecycle_events))
        return kind, payload

    def quiet_completions(self) -> Optional[frozenset]:
        """LIVE-7: when every pending event is the completion of a quiet timed pass (no output,
        completion or lifecycle event), the set of their payloads less the pass result
        (``(worker,)`` or ``(stage, worker)``); otherwise None.  Such completions touch only their own
        worker, so their order does not matter."""
        out = []
        for _at, _rank, _seq, kind, payload in self._heap:
            if kind != WORKER_COMPLETION:
                return None
            res = payload[-1]
            if res.output_signals or res.completed_requests or res.lifecycle_events:
                return None
            out.append(payload[:-1])
        return frozenset(out)

    def is_empty(self) -> bool:
        return not self._heap


# ---------------------------------------------------------------------------------------------
# DRV-4: one worker of a pool
# ---------------------------------------------------------------------------------------------


class Worker:
    """DRV-4: a core plus the driver's ``busy`` flag and ``in_flight`` count (upstream ``OfflineWorkerState``)."""

    __slots__ = ("idx", "core", "busy", "in_flight")

    def __init__(self, idx: int, core: Any) -> None:
        self.idx = idx
        self.core = core
        self.busy = False
        self.in_flight = 0

    def is_ready(self) -> bool:
        """DRV-4: idle and the core owns a request."""
        return not self.busy and not C.is_empty(self.core)

    def is_drained(self) -> bool:
        return self.in_flight == 0 and not self.busy and C.is_drained(self.core)

    def receive(self, request) -> None:
        """DRV-4: ``Submit`` the request and count it in flight (upstream ``receive_request``)."""
        from model.protocol import Submit

        self.core, _ = C.apply_command(self.core, Submit(request))
        self.in_flight += 1


@attrs.frozen
class PassEffects:
    """DRV-6: what one ``drive_ready`` call produced (upstream ``EngineEffects``, one pass at most)."""

    worker_idx: int
    result: Any  # model.core.PassResult
    immediate: bool  # zero-duration pass that counted as progress


class CanonicalCores:
    """LIVE-7: canonical states (LIVE-2) of a pool's cores, recomputed only for cores that changed."""

    def __init__(self) -> None:
        self._memo: Dict[Any, Tuple[Any, Any]] = {}

    def pool_key(self, pool: "Pool") -> tuple:
        from .livelock import canonical_state

        out = []
        for w in pool.workers:
            hit = self._memo.get((pool.stage, w.idx))
            if hit is None or hit[0] is not w.core:
                hit = (w.core, canonical_state(w.core))
                self._memo[(pool.stage, w.idx)] = hit
            out.append((hit[1], w.busy, w.in_flight))
        return tuple(out)


def made_progress(result) -> bool:
    """DRV-6: a zero-duration pass counts as progress iff it admitted, emitted, completed,
    produced lifecycle or KV events, or its FPM shows a scheduled request
    (lib/mocker/src/replay/offline/components/engine.rs:284-296)."""
    if result.admissions or result.completed_requests > 0 or result.output_signals:
        return True
    if result.lifecycle_events or result.kv_events:
        return True
    fpm = result.fpm
    return fpm is not None and fpm.has_scheduled_work()  # FPM-4


class Pool:
    """DRV-5: workers keyed by stable id 0..n-1 (upstream ``EngineComponent``, no scaling)."""

    def __init__(self, stage: str, args, count: int, visible: bool) -> None:
        self.stage = stage
        self.args = args
        self.visible = visible
        self.workers: List[Worker] = [Worker(i, C.new_core(args)) for i in range(count)]

    def active_ids(self) -> List[int]:
        return [w.idx for w in self.workers]

    def in_flight(self) -> int:
        return sum(w.in_flight for w in self.workers)

    def is_drained(self) -> bool:
        return all(w.is_drained() for w in self.workers)

    def stuck(self) -> Tuple[Any, ...]:
        """LIVE-6: the workers whose core still holds requests, for a dead end's diagnosis."""
        from .dead_end import StuckWorker

        return tuple(StuckWorker(self.stage, w.idx, w.core, self.args) for w in self.workers
                     if not C.is_drained(w.core))

    def quiet_between_steps(self) -> bool:
        """LIVE-7: every worker is busy with a timed pass or holds nothing (a worker left idle with
        requests had its passes dropped, and how often it runs depends on the other workers)."""
        return all(w.busy or C.is_empty(w.core) for w in self.workers)

    def drive_ready(self, now_ms: float, on_pass: Optional[Callable[[Worker, Any], None]] = None) -> Optional[PassEffects]:
        """DRV-6: run one pass on the first ready worker (id order) that makes progress.

        A pass ending after ``now`` marks the worker busy (the caller schedules
        its completion); a zero-duration pass that made progress is returned as
        an immediate completion; a zero-duration pass without progress is
        dropped (its core changes are kept, as upstream mutates in place) and
        the scan continues.  ``on_pass`` sees every executed pass (livelock
        detection).
        """
        for w in self.workers:
            if not w.is_ready():
                continue
            w.core, result = C.execute_pass(w.core, now_ms) if self.visible else C.execute_hidden_pass(w.core, now_ms)
            if on_pass is not None:
                on_pass(w, result)
            if result.end_ms == now_ms:
                if not made_progress(result):
                    continue
                return PassEffects(w.idx, result, True)
            w.busy = True
            return PassEffects(w.idx, result, False)
        return None

    def on_scheduled_completion(self, idx: int, completed_requests: int) -> Tuple[Any, ...]:
        """DRV-7: mark idle, count completions, retry pending destinations; returns the retry's lifecycle events."""
        w = self.workers[idx]
        w.busy = False
        if completed_requests > w.in_flight:
            from model.errors import InternalInvariantBroken

            raise InternalInvariantBroken("offline worker completed more requests than it owned", rule="DRV-7")
        w.in_flight -= completed_requests
        w.core, retry = C.retry_pending_destinations(w.core)
        return tuple(retry.lifecycle_events)

    def apply_command(self, idx: int, command: Command):
        """DIS-9: ``apply_command_effects(command, allow = !busy)`` with upstream's in-flight accounting."""
        from model.protocol import (
            APPLIED,
            CancelDestination,
            CancelSource,
            DestinationAccepted,
            ReserveDestination,
            Submit,
            SubmitHandoffPrefill,
            Submitted,
        )

        w = self.workers[idx]
        before = C.num_requests(w.core)
        w.core, effects = C.apply_command_effects(w.core, command, not w.busy)
        res = effects.result
        if isinstance(command, (Submit, SubmitHandoffPrefill)) and isinstance(res, Submitted):
            w.in_flight += 1
        elif isinstance(command, ReserveDestination) and isinstance(res, DestinationAccepted):
            w.in_flight += 1
        elif isinstance(command, CancelDestination) and res == APPLIED:
            w.in_flight -= 1
        elif isinstance(command, CancelSource) and res == APPLIED:
            removed = before - C.num_requests(w.core)
            if removed > 0:
                w.in_flight -= removed
        return effects


def count_map(d: Dict[Any, int], key: Any, delta: int) -> None:
    v = d.get(key, 0) + delta
    if v:
        d[key] = v
    else:
        d.pop(key, None)


class ClockedRun:
    """The clock shared by the multi-worker runtimes (DRV-15 aggregated, DIS-15 disaggregated).

    A subclass holds ``now``, ``col``, ``events``, ``adm`` and ``max_sim_time_ms`` and provides
    ``drain_current_timestamp``, ``is_done``, ``watch_timed_cycle``, ``worker_counts`` (the two
    pools' sizes, for the collector's worker-seconds) and ``dead_end`` (the error of DRV-16 / DIS-15).
    """

    def next_timestamp(self) -> Optional[float]:
        """The earlier of the next admission and the next event, ``None`` when neither exists."""
        a = self.adm.next_ready_time_ms()
        e = self.events.next_ms()
        if a is None:
            return e
        if e is None:
            return a
        return min(a, e)

    def advance_now(self, new_now: float) -> None:
        """Move the clock, charging every worker of both pools for the time that passed."""
        dt = max(new_now - self.now, 0.0)
        if dt > 0.0:
            prefill, decode = self.worker_counts()
            self.col = self.col.add_worker_seconds(float(prefill) * dt / 1000.0, float(decode) * dt / 1000.0)
        self.now = new_now

    def run(self):
        """Drain each timestamp, then jump to the next one, until done, stuck or past the cap."""
        self.drain_current_timestamp()
        while not self.is_done():
            nxt = self.next_timestamp()
            if nxt is None:
                raise self.dead_end()
            if self.max_sim_time_ms is not None and nxt > self.max_sim_time_ms:  # DRV-18
                break
            self.watch_timed_cycle()
            self.advance_now(nxt)
            self.drain_current_timestamp()
        return self.col
