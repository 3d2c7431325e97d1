"""Livelock detection: a repeated state at constant simulated time (spec/replay.md LIVE-1..LIVE-5).

Upstream treats a zero-duration pass with an admission as progress and loops
again at the same ``now`` with no iteration limit, so some inputs spin forever
(offline-replay notes §5; handoff-lifecycle S7).  The oracle must terminate:
while a driver loops at one simulated time, it records a canonical form of the
state that determines the loop's future; if a state repeats with nothing else
changed in between, the loop is a cycle -- upstream would spin forever -- and
the driver raises :class:`ReplayLivelock` with a diagnosis.

Canonical form (LIVE-2).  Cores carry monotone counters that never repeat
(the capacity generation, LRU ticks of the inactive block index, the
preemption counter), so raw equality would never fire.  The canonical form
keeps exactly what decides future behaviour:

* the capacity generation only matters as "the pending head was already tried
  at the current generation" -- it becomes 0 and the head's last attempt 0
  (tried now) or None (due); the generation only grows, so an older attempt
  behaves like None forever;
* inactive-block ticks only matter through their order -- they become ranks;
  the lazily cleaned heap and the next-tick counter are dropped;
* ``preemptions_total``, the per-request preemption counts and KV event ids
  only feed metrics and events.

A core type may provide its own ``ops.canonical_state(core)``; the vLLM/TRT-LLM
core is handled here; any other core is compared as is (sound, possibly never
firing: then the step budget of LIVE-4 applies).
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional, Tuple

import attrs

from model.errors import ModelError

__all__ = ["ReplayLivelock", "LivelockDiagnosis", "canonical_state", "CycleDetector", "TimedCycleDetector"]


@attrs.frozen
class LivelockDiagnosis:
    """LIVE-3: what repeats, where and when."""

    runtime: str  # "single", "agg", "disagg"
    stage: str  # "aggregated", "prefill", "decode"
    worker_idx: int
    now_ms: float
    cycle_passes: int  # passes in one period of the cycle
    proven: bool  # a repeated canonical state (False: step budget exhausted)
    admitted: Tuple[str, ...]  # requests admitted by the repeating pass(es)
    waiting: Tuple[str, ...]
    running: Tuple[str, ...]
    free_blocks: Optional[int]
    total_blocks: Optional[int]
    pending_handoffs: Tuple[str, ...]
    reserved_handoffs: Tuple[str, ...]
    active_handoffs: Tuple[str, ...]
    other: Tuple[str, ...] = ()
    #: LIVE-7: the simulated time one period of a timed cycle takes (None: the clock stands still)
    period_ms: Optional[float] = None

    def message(self) -> str:
        kind = "livelock" if self.proven else "suspected livelock"
        if self.period_ms is None:
            head = (f"{kind}: {self.stage} worker {self.worker_idx} repeats the same zero-duration pass at "
                    f"t={self.now_ms!r} ms ({self.runtime} runtime; cycle of {self.cycle_passes} pass(es)); "
                    "simulated time never advances and the compiled 1.3.0.post1 engine spins forever here")
        elif self.proven:
            head = (f"{kind}: {self.stage} worker {self.worker_idx} keeps running passes that emit and "
                    f"complete nothing while the clock advances ({self.runtime} runtime): the run's state "
                    f"repeats after {self.cycle_passes} step(s) and {self.period_ms!r} ms of simulated time "
                    f"(seen at t={self.now_ms!r} ms); the compiled 1.3.0.post1 engine runs forever here")
        else:
            head = (f"{kind}: {self.stage} worker {self.worker_idx} kept running passes that emit and "
                    f"complete nothing for {STEP_BUDGET} steps up to t={self.now_ms!r} ms "
                    f"({self.runtime} runtime) without a repeated state")
        lines = [
            head,
            f"  repeating pass admits: {', '.join(self.admitted) or '-'} and emits no token",
            f"  waiting: {', '.join(self.waiting) or '-'}",
            f"  running: {', '.join(self.running) or '-'}",
        ]
        if self.total_blocks is not None:
            # the metrics' view (total - active_decode_blocks); SGLang counts queued requests'
            # page-rounding slack as active (SG-6), so this can be negative there
            lines.append(f"  free blocks (metrics): {self.free_blocks} of {self.total_blocks}")
        if self.pending_handoffs or self.reserved_handoffs or self.active_handoffs:
            lines.append(
                "  handoffs: pending destinations ["
                + ", ".join(self.pending_handoffs)
                + "], reserved (not activated) ["
                + ", ".join(self.reserved_handoffs)
                + "], activated ["
                + ", ".join(self.active_handoffs)
                + "]"
            )
        lines.extend(f"  {o}" for o in self.other)
        return "\n".join(lines)


class ReplayLivelock(ModelError):
    """LIVE-3: the replay entered a cycle at constant simulated time."""

    rule = "LIVE-3"

    def __init__(self, diagnosis: LivelockDiagnosis) -> None:
        super().__init__(diagnosis.message())
        self.diagnosis = diagnosis


# ---------------------------------------------------------------------------------------------
# LIVE-2: canonical core states
# ---------------------------------------------------------------------------------------------


def _canonical_ledger(ledger):
    g = ledger.capacity_generation
    pend = ledger.pending_destinations
    by_handoff = pend.by_handoff
    evolver = by_handoff.evolver()
    for h, entry in by_handoff.items():
        last = entry.last_attempt_generation
        norm = 0 if last == g else None
        if norm != last:
            evolver[h] = attrs.evolve(entry, last_attempt_generation=norm)
    pend = attrs.evolve(pend, by_handoff=evolver.persistent())
    return attrs.evolve(ledger, pending_destinations=pend, capacity_generation=0)


def _canonical_lineage(idx):
    from pyrsistent import pmap

    ticks = sorted({n.tick for n in idx.nodes.values() if n.tick is not None} | set(idx.leaves.keys()))
    rank = {t: i for i, t in enumerate(ticks)}
    nodes = {}
    for key, n in idx.nodes.items():
        nodes[key] = n if n.tick is None else attrs.evolve(n, tick=rank[n.tick])
    leaves = {rank[t]: k for t, k in idx.leaves.items()}
    return attrs.evolve(idx, nodes=pmap(nodes), leaves=pmap(leaves), heap=None, heap_len=0, next_tick=0)


def _canonical_vllm(core):
    kv = attrs.evolve(core.kv, lineage=_canonical_lineage(core.kv.lineage), next_event_id=0)
    reqs = {u: (attrs.evolve(r, num_preemptions=0) if r.num_preemptions else r) for u, r in core.requests.items()}
    return attrs.evolve(core, kv=kv, requests=reqs, ledger=_canonical_ledger(core.ledger),
                        preemptions_total=0)


def canonical_state(core) -> Hashable:
    """LIVE-2: a hashable value equal for two cores iff they behave the same from now on."""
    ops = getattr(type(core), "ops", None)
    custom = getattr(ops, "canonical_state", None)
    if custom is not None:
        return custom(core)
    if type(core).__name__ == "VllmCore":
        return _canonical_vllm(core)
    return core


# ---------------------------------------------------------------------------------------------
# LIVE-1: the detector a driver runs inside one constant-time loop
# ---------------------------------------------------------------------------------------------

#: LIVE-1: quiet zero-duration passes tolerated before states are recorded
RECORD_AFTER = 8
#: LIVE-4: quiet zero-duration passes at one time after which an unproven cycle is reported
STEP_BUDGET = 200_000


class CycleDetector:
    """LIVE-1: watches the quiet zero-duration passes of one loop at one simulated time.

    ``observe(key_fn)`` is called after every quiet pass (no time advance, no
    output, no lifecycle event, nothing else in the driver changed);
    ``reset()`` whenever anything else changes.  ``observe`` returns the cycle
    length once a canonical state repeats, or ``-1`` when the step budget is
    exhausted without proof.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.quiet = 0
        self.seen: Dict[Hashable, int] = {}
        self.admitted: List[str] = []

    def observe(self, key_fn, admitted=()) -> Optional[int]:
        self.quiet += 1
        for a in admitted:
            if a not in self.admitted:
                self.admitted.append(a)
        if self.quiet >= STEP_BUDGET:
            return -1
        if self.quiet < RECORD_AFTER:
            return None
        key = key_fn()
        prev = self.seen.get(key)
        if prev is not None:
            return self.quiet - prev
        self.seen[key] = self.quiet
        return None


class TimedCycleDetector:
    """LIVE-7: Brent's cycle detection over the runtime states seen between clock advances.

    A runtime calls ``observe(key_fn, now_ms, admitted)`` at each step it may record (see LIVE-7
    for which) and ``reset()`` at any other step.  ``key_fn()`` must return a value that determines the
    runtime's whole future up to absolute time; two equal values at different simulated times prove
    a cycle that advances the clock forever (equal values at one instant are not reported: a loop
    that never advances the clock is LIVE-1's).  One saved state, replaced at powers of two, finds a cycle of
    period ``p`` that starts after ``m`` quiet steps within about ``2 * max(m, p)`` steps.
    ``observe`` returns ``(steps in one period, simulated ms in one period)``, or ``(-1, 0.0)``
    when the LIVE-4 budget of quiet steps is exhausted without a repeat.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.quiet = 0
        self.saved: Any = None
        self.saved_ms = 0.0
        self.lam = 0
        self.power = 0
        self.admitted: List[str] = []

    def observe(self, key_fn, now_ms: float, admitted=()) -> Optional[Tuple[int, float]]:
        self.quiet += 1
        for a in admitted:
            if a not in self.admitted:
                self.admitted.append(a)
        if self.quiet >= STEP_BUDGET:
            return -1, 0.0
        if self.quiet < RECORD_AFTER:
            return None
        key = key_fn()
        if self.power == 0:  # the first recorded state
            self.saved, self.saved_ms, self.lam, self.power = key, now_ms, 0, 1
            return None
        self.lam += 1
        if key == self.saved and now_ms != self.saved_ms:  # a repeat at one instant is LIVE-1's
            return self.lam, now_ms - self.saved_ms
        if self.lam == self.power:
            self.saved, self.saved_ms, self.lam, self.power = key, now_ms, 0, self.power * 2
        return None


class _BudgetSpent:
    """LIVE-4: stands in for a detector once ``TimedWatch`` has seen its budget of silent steps:
    ``observe`` reports the budget spent, as a detector does."""

    def __init__(self, admitted) -> None:
        self.admitted = list(dict.fromkeys(admitted))

    def observe(self, key_fn, now_ms: float, admitted=()) -> Tuple[int, float]:
        return -1, 0.0


class SilentBudget:
    """LIVE-4: counts consecutive silent clock steps (nothing emitted, completed or released) and
    says when ``STEP_BUDGET`` of them have passed.  ``tick(silent, released)`` is called once per
    step with the arrivals released so far; a step that is not silent, or that released an arrival,
    restarts the count.  Shared by every runtime, so the budget means the same everywhere."""

    def __init__(self) -> None:
        self.steps = 0
        self.released_seen = 0

    def tick(self, silent: bool, released: int) -> bool:
        if silent and released == self.released_seen:
            self.steps += 1
        else:
            self.steps = 0
        self.released_seen = released
        return self.steps >= STEP_BUDGET


class TimedWatch:
    """LIVE-7 bookkeeping shared by the event-loop and disaggregated runtimes.

    The runtime counts *activity* (anything but a quiet timed pass: a zero-duration pass, output,
    a completion, a handoff, a released arrival, an applied fact or action, a pruned transfer
    event) and *emission* (output or completions), and collects the admissions its passes make.
    ``step`` is called once per clock step, before the clock advances; it says which recording
    regime applies (one pending event after a step that emitted nothing, or several pending
    quiet completions after a quiet step) and resets the detector of the other."""

    def __init__(self) -> None:
        self.activity = 0
        self.emitted = 0
        self._activity_seen = 0
        self._emitted_seen = 0
        self.admitted: List[str] = []
        self.one = TimedCycleDetector()  # exactly one pending event
        self.several = TimedCycleDetector()  # several, all quiet completions
        #: LIVE-4: consecutive clock steps (no cap) that emitted, completed and released nothing,
        #: recordable or not, with an arrival still to come or not (a run whose steps are never
        #: recordable, or that loops until a far arrival, would otherwise spin for ever)
        self.budget = SilentBudget()

    def note_activity(self) -> None:
        self.activity += 1

    def note_emission(self) -> None:
        self.activity += 1
        self.emitted += 1

    def note_pass(self, now_ms: float, res) -> None:
        """A pass that emits or completes is emission; a zero-duration pass (kept or dropped) or
        one that hands off is activity; admissions are only collected (they touch only the worker
        that makes them)."""
        if res.output_signals or res.completed_requests:
            self.note_emission()
        elif res.end_ms == now_ms or res.lifecycle_events:
            self.note_activity()
        for a in res.admissions:
            self.admitted.append(a.uuid.value)

    def step(self, events, capped: bool, arrival_ahead: bool, released: int, quiet_ok):
        """``(detector, one, pending, admitted)`` when this clock step may be recorded or LIVE-4's
        budget is spent, else None. ``capped``: a ``max_sim_time_ms`` is set; ``arrival_ahead``: an
        arrival or session turn is still to come; ``released``: the arrivals released so far;
        ``quiet_ok()`` holds when nothing outside the pending completions can act (idle or busy
        workers, no queued action)."""
        quiet = self.activity == self._activity_seen
        silent = self.emitted == self._emitted_seen and released == self.budget.released_seen
        self._activity_seen, self._emitted_seen = self.activity, self.emitted
        admitted, self.admitted = self.admitted, []
        spent = self.budget.tick(silent and not capped, released)
        if capped:
            self.one.reset()
            self.several.reset()
            return None
        if spent:  # LIVE-4: a suspected livelock, whatever the regime
            return _BudgetSpent(admitted), events.only_event(), events.quiet_completions(), admitted
        if arrival_ahead:  # a repeat would prove the loop only up to that arrival
            self.one.reset()
            self.several.reset()
            return None
        one = events.only_event() if silent else None
        pending = None
        if quiet and one is None:
            pending = events.quiet_completions()
            if pending is not None and not quiet_ok():
                pending = None
        if one is None:
            self.one.reset()
        if pending is None:
            self.several.reset()
        if one is None and pending is None:
            return None
        return (self.one if one is not None else self.several), one, pending, admitted


def next_arrival_line(ahead: Optional[float]) -> Tuple[str, ...]:
    """LIVE-4: the diagnosis line naming the arrival still to come (none without one)."""
    return (f"next arrival at t={ahead!r} ms",) if ahead is not None else ()


def diagnose(runtime: str, stage: str, worker_idx: int, now_ms: float, core, cycle: int, admitted) -> LivelockDiagnosis:
    """LIVE-3: describe the looping worker from its core (best effort for unknown core types)."""

    def ids(values) -> Tuple[str, ...]:
        return tuple(getattr(v, "value", str(v)) for v in values)

    waiting: Tuple[str, ...] = ()
    running: Tuple[str, ...] = ()
    free = total = None
    pending = reserved = active = ()
    from model import core as C

    try:
        w, r = C.queues(core)  # CORE-6
        waiting, running = ids(w), ids(r)
    except AttributeError:  # pragma: no cover - best effort for foreign cores
        pass
    try:
        m = C.metrics(core)
        total = m.total_blocks
        free = m.total_blocks - m.active_decode_blocks
    except Exception:  # pragma: no cover - best effort for foreign cores
        pass
    ledger = getattr(core, "ledger", None)
    if ledger is not None:
        pending = ids(ledger.pending_destinations.live_order())
        try:
            reserved = ids(sorted(ledger.destination_holds.by_handoff.keys()))
        except AttributeError:  # pragma: no cover
            reserved = ()
        try:
            active = ids(sorted(ledger.active_destinations.by_handoff.keys()))
        except AttributeError:  # pragma: no cover
            active = ()
    return LivelockDiagnosis(
        runtime=runtime,
        stage=stage,
        worker_idx=worker_idx,
        now_ms=now_ms,
        cycle_passes=max(cycle, 0),
        proven=cycle > 0,
        admitted=tuple(admitted),
        waiting=waiting,
        running=running,
        free_blocks=free,
        total_blocks=total,
        pending_handoffs=pending,
        reserved_handoffs=reserved,
        active_handoffs=active,
    )
