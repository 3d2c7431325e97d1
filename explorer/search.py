"""Breadth-first exploration with parent pointers, and the checks (spec/model-checking.md MC-20..MC-35).

:func:`explore` is the entry point: it explores every state reachable from the
empty core under the scenario's alphabet (up to its bounds), checks the state
and transition properties on the way, then runs the cycle analyses (deadlock,
livelock, starvation) on the explored graph.  Counterexamples are shortest:
BFS discovers every node along a shortest path, so the parent pointers give a
shortest prefix, and cycles are closed by shortest paths inside their strongly
connected component.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections import deque
from typing import Dict, List, Optional, Tuple

import attrs
import networkx as nx

from model import core as C

from . import properties as P
from .actions import Outcome, fire, guard_holds
from .canon import Symmetry, canonical_key, fresh_key, is_vllm, node_key, symmetry_for
from .goals import GoalResult, avoidable, avoidable_message, evaluate, forbidden_message, unreachable_message
from .paths import shortest_cycle_through, successors
from .scenario import Scenario


@attrs.define
class Edge:
    """One explored transition; ``dst`` is -1 when the action raised an internal error."""

    src: int
    dst: int
    action: int
    outcome: Outcome


@attrs.define
class Violation:
    """MC-21: one property violation with its shortest counterexample.

    ``prefix`` are the edges from the initial state to ``node``; ``edge`` is the
    violating transition (transition properties); ``cycle`` is the loop of a
    lasso (liveness properties), starting and ending at the last state of
    ``prefix``.
    """

    kind: str
    name: str
    message: str
    node: int
    prefix: List[int]
    edge: Optional[int] = None
    cycle: List[int] = attrs.Factory(list)
    occurrences: int = 1
    #: the exploration whose node and edge numbers this violation uses, when not the reported one
    graph: Optional["Exploration"] = attrs.field(default=None, eq=False, repr=False)
    #: MC-48: a deadlock's dead-end diagnosis, computed once by ``outputs.deadlock_diagnosis``
    diagnosis: Optional[object] = attrs.field(default=None, eq=False, repr=False)

    def steps(self) -> List[int]:
        out = list(self.prefix)
        if self.edge is not None:
            out.append(self.edge)
        out.extend(self.cycle)
        return out

    @property
    def length(self) -> int:
        return len(self.steps())

    @property
    def loop_index(self) -> Optional[int]:
        """ITF ``loop``: index of the state where the cycle starts (None for finite traces)."""
        return len(self.prefix) if self.cycle else None


@attrs.define
class Coverage:
    """MC-22: per action: times enabled, times fired without rejection, new states found."""

    enabled: int = 0
    fired: int = 0
    rejected: int = 0
    new_states: int = 0


@attrs.define
class Exploration:
    """The explored graph, the coverage, the violations and the run figures."""

    scenario: Scenario
    symmetry: Optional[Symmetry]
    parent_edge: List[int]
    depth: List[int]
    fired: List[int]
    drained: List[bool]
    views: List[tuple]
    edges: List[Edge]
    coverage: List[Coverage]
    violations: List[Violation]
    complete: bool
    truncated_by: Optional[str]
    elapsed_s: float
    bytes_per_state: Optional[float]
    liveness_checked: bool
    liveness_states: Optional[int] = None
    #: the unreduced exploration the liveness checks ran on (symmetry runs only)
    liveness_graph: Optional["Exploration"] = attrs.field(default=None, eq=False, repr=False)
    #: MC-34: one result per reachability goal of the scenario (SCN-10), in file order
    goals: List[object] = attrs.Factory(list)
    #: MC-35: one result per eventually goal (SCN-11); ``reached`` there means "every fair run reaches it"
    eventually: List[object] = attrs.Factory(list)

    @property
    def num_states(self) -> int:
        return len(self.depth)

    @property
    def num_transitions(self) -> int:
        return len(self.edges)

    @property
    def max_depth(self) -> int:
        return max(self.depth) if self.depth else 0

    @property
    def states_per_s(self) -> float:
        return self.num_states / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def path_to(self, node: int) -> List[int]:
        out = []
        while node != 0:
            e = self.parent_edge[node]
            out.append(e)
            node = self.edges[e].src
        out.reverse()
        return out

    def violation(self, kind: str) -> Optional[Violation]:
        found = [v for v in self.violations if v.kind == kind]
        return min(found, key=lambda v: v.length) if found else None

    @property
    def clean(self) -> bool:
        return not self.violations


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # pragma: no cover - non-Linux
        return None


class _Viewer:
    """MC-40: the per-node view kept for labels, quotients and ITF (phases per handoff, queues).

    A view is a function of the core and of which issuing actions already fired; the core's part
    (every phase as if issued, the queues, the free units) is computed once per core id (MC-23)
    and each node substitutes the unissued phase of the requests its driver has not issued yet."""

    def __init__(self, scenario: Scenario) -> None:
        # the bit of each once-action in a node's ``fired`` set
        once_index = {a.name: i for i, a in enumerate(scenario.actions) if a.once}
        self.items = []  # (view name, phase function of a core, the issuing action's bit in `fired`)
        for r in scenario.requests:
            if r.role == "plain":
                self.items.append((r.id, lambda c, r=r, i=True: P.request_phase(c, r.id, i),
                                   1 << once_index[f"submit({r.id})"]))
            elif r.role == "source":
                self.items.append((r.handoff, lambda c, r=r, i=True: P.source_phase(c, r.handoff, r.id, i),
                                   1 << once_index[f"submit_prefill({r.handoff},{r.id})"]))
            else:
                self.items.append((r.handoff, lambda c, r=r, i=True: P.destination_phase(c, r.handoff, r.id, i),
                                   1 << once_index[f"reserve({r.handoff},{r.id})"]))
        self.unissued = None  # per item: its phase before it is issued (a constant per role)
        self.memo: Dict[int, tuple] = {}

    def core_part(self, core) -> tuple:
        if self.unissued is None:
            self.unissued = tuple(f(core, i=False) for _n, f, _b in self.items)
        waiting, running = P.queue_view(core)
        return tuple(f(core) for _n, f, _b in self.items), waiting, running, P.free_units(core)

    def view(self, core, fired: int, cid: Optional[int] = None) -> tuple:
        part = None if cid is None else self.memo.get(cid)
        if part is None:
            part = self.core_part(core)
            if cid is not None:
                self.memo[cid] = part
        issued_phases, waiting, running, free = part
        phases = tuple((name, phase if fired & bit else unissued)
                       for (name, _f, bit), phase, unissued in zip(self.items, issued_phases, self.unissued))
        return (phases, waiting, running, free)


def explore(
    scenario: Scenario,
    *,
    max_states: Optional[int] = None,
    max_depth: Optional[int] = None,
    symmetry: Optional[bool] = None,
    progress: bool = False,
    stop_at_first: bool = False,
    stop_on: Optional[str] = None,
) -> Exploration:
    """MC-20: explore the scenario; with symmetry (MC-4) the safety checks run on the reduced graph
    and the liveness checks on a second, unreduced exploration (MC-25).

    ``stop_at_first`` ends the search at the first safety violation, ``stop_on`` at the first one of
    that kind (the counterexample is still shortest: BFS finds violations in order of depth); the
    exploration is then incomplete and the liveness checks are skipped."""
    use_sym = scenario.symmetry if symmetry is None else symmetry
    sym = symmetry_for(scenario) if use_sym else None
    liveness = any(c in scenario.checks for c in ("deadlock", "livelock", "starvation"))
    stop = (lambda vs: bool(vs)) if stop_at_first else None
    if stop_on is not None:
        stop = lambda vs: any(v.kind == stop_on for v in vs)  # noqa: E731
    with _collector_tuned():
        return _explore(scenario, sym, max_states, max_depth, progress, stop, liveness)


@contextlib.contextmanager
def _collector_tuned():
    """Exploration keeps every state it finds: with the default thresholds the cyclic garbage
    collector rescans that growing heap again and again (about 40% of the run). The states are
    immutable and acyclic, so collections are made rare for the run and the thresholds restored.
    Interpreters without thresholds (PyPy's incremental collector) are left as they are."""
    if not hasattr(gc, "get_threshold"):
        yield
        return
    saved = gc.get_threshold()
    gc.set_threshold(50_000, 50, 1_000)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _explore(scenario, sym, max_states, max_depth, progress, stop, liveness) -> Exploration:
    if sym is None:
        exp = _run(scenario, None, max_states, max_depth, progress, stop, safety=True, liveness=liveness)
        _reach(exp, exp)
        return exp
    reduced = _run(scenario, sym, max_states, max_depth, progress, stop, safety=True, liveness=False)
    # liveness is skipped after a stop, as without symmetry; the goals are always answered, on the
    # unreduced graph (MC-4, MC-34..MC-36)
    live = liveness and reduced.truncated_by != "stop"
    if live or scenario.sometimes or scenario.eventually or scenario.never:
        full = _run(scenario, None, max_states, max_depth, progress, None, safety=False, liveness=live)
        for v in full.violations:
            reduced.violations.append(_transplant(v, full, reduced))
        reduced.liveness_checked = full.liveness_checked
        if live:  # otherwise the unreduced run served the goals only
            reduced.liveness_states = full.num_states
        reduced.elapsed_s += full.elapsed_s
        reduced.liveness_graph = full
        _reach(reduced, full)
    else:
        reduced.goals = [GoalResult(g, None) for g in scenario.sometimes]
        reduced.eventually = [GoalResult(g, None) for g in scenario.eventually]
    return reduced


def _reach(exp: Exploration, graph: Exploration) -> None:
    """MC-34..MC-36: the scenario's goals, on the unreduced ``graph``. A reachability goal a
    complete exploration never reaches is an ``unreachable_goal`` violation (0 steps, at the initial
    state); an eventually goal a fair cooperative run can avoid is an ``avoidable_goal`` violation
    with a lasso; a forbidden state reached is a ``forbidden_state`` violation with a shortest path.
    On an incomplete graph an eventually goal stays unknown."""
    sc = exp.scenario
    if not (sc.sometimes or sc.never or sc.eventually):
        return
    t0 = time.perf_counter()
    try:
        _check_goals(exp, graph, sc)
    finally:  # the goals are checks like the others: their time counts in the run's rate
        exp.elapsed_s += time.perf_counter() - t0


def _check_goals(exp: Exploration, graph: Exploration, sc: Scenario) -> None:
    own = graph is exp
    if sc.sometimes:
        exp.goals = evaluate(graph, own=own)
        for r in exp.goals:
            if r.reached is False:
                exp.violations.append(Violation("unreachable_goal", r.goal.name, unreachable_message(r.goal), 0,
                                                [], graph=None if own else graph))
    if sc.never:
        # MC-36: a forbidden state found is a violation even in an incomplete exploration
        for r in evaluate(graph, own=own, goals=sc.never):
            if r.reached:
                w = r.witness
                exp.violations.append(Violation("forbidden_state", r.goal.name, forbidden_message(r.goal), w.node,
                                                w.prefix, graph=None if own else graph))
    if sc.eventually:
        if not graph.complete:
            exp.eventually = [GoalResult(g, None) for g in sc.eventually]
            return
        exp.eventually = []
        for goal, lasso in avoidable(graph):
            exp.eventually.append(GoalResult(goal, lasso is None))
            if lasso is not None:
                entry, prefix, cycle, count = lasso
                exp.violations.append(Violation("avoidable_goal", goal.name, avoidable_message(goal), entry, prefix,
                                                cycle=cycle, occurrences=count, graph=None if own else graph))


def _transplant(v: Violation, src: Exploration, dst: Exploration) -> Violation:
    """Liveness counterexamples of the unreduced run are reported with that run's graph."""
    return attrs.evolve(v, message=v.message + " (unreduced graph)", graph=src)


def graph_of(v: Violation, exploration: Exploration) -> Exploration:
    """The exploration whose node and edge numbers ``v`` uses."""
    return v.graph if v.graph is not None else exploration


def _run(scenario, sym, max_states, max_depth, progress, stop, *, safety: bool, liveness: bool,
         reuse: bool = True) -> Exploration:
    max_states = scenario.max_states if max_states is None else max_states
    max_depth = scenario.max_depth if max_depth is None else max_depth
    checks = set(scenario.checks)
    actions = scenario.actions
    now = scenario.now_ms
    coverage = [Coverage() for _ in actions]
    t0 = time.perf_counter()
    rss0 = _rss_bytes()

    core0 = C.new_core(scenario.args)
    # MC-23: without symmetry a node's key is (core key, fired set) and an action's outcome depends
    # on the core alone, so core keys are numbered once and each core's outcomes are kept for every
    # node that shares it (nodes that differ only in which once-actions already fired)
    split = reuse and (sym is None or not is_vllm(core0))
    core_ids: Dict[object, int] = {}
    key_of_core: List[object] = []  # core id -> its key (MC-13 compares a re-keyed core with it)
    node_core: List[int] = []
    outcomes: Dict[int, tuple] = {}  # core id * len(actions) + action -> (successor, outcome, its core id)
    n_actions = len(actions)

    def core_id(c) -> int:
        k = canonical_key(c)
        cid = core_ids.get(k)
        if cid is None:
            cid = core_ids[k] = len(core_ids)
            key_of_core.append(k)
        return cid

    if split:
        node_core.append(core_id(core0))
        key0 = (node_core[0], 0)
    else:
        key0 = node_key(core0, 0, sym)
    ids: Dict[object, int] = {key0: 0}
    keys: List[object] = [key0]
    parent_edge = [-1]
    depth = [0]
    fired_of = [0]
    drained = [C.is_drained(core0)]
    viewer = _Viewer(scenario)
    views = [viewer.view(core0, 0, node_core[0] if split else None)]
    edges: List[Edge] = []
    violations: List[Violation] = []
    seen_kinds: Dict[Tuple[str, str], Violation] = {}
    expanded = [False]
    frontier = deque([(0, core0)])
    truncated_by = None

    def report(kind, name, message, node, edge=None):
        k = (kind, name)
        if k in seen_kinds:
            seen_kinds[k].occurrences += 1
            return
        prefix = _path(parent_edge, edges, node)
        v = Violation(kind, name, message, node, prefix, edge)
        seen_kinds[k] = v
        violations.append(v)

    # MC-10..MC-12 are functions of the core key (MC-1), so with MC-23 each core id is checked once
    # and its findings are reported again for every node that shares it
    found_by_core: Dict[int, List[Tuple[str, str, str]]] = {}

    def check_state(node, core, cid=None):
        if not safety:
            return
        found = None if cid is None else found_by_core.get(cid)
        if found is None:
            found = []
            if "invariants" in checks:
                for name, msg in P.registered_invariants(core):
                    found.append(("invariant", name, msg))
            if "fifo_order" in checks:
                msg = P.fifo_acceptance_order(core)
                if msg:
                    found.append(("fifo_order", "fifo_acceptance_order", msg))
            if "drained_pool_free" in checks:
                msg = P.drained_pool_free(core)
                if msg:
                    found.append(("drained_pool_free", "drained_pool_free", msg))
            if cid is not None:
                found_by_core[cid] = found
        for kind, name, msg in found:
            report(kind, name, msg, node)

    check_state(0, core0, node_core[0] if split else None)
    bar = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("[bold]explore[/] {task.description}"), BarColumn(),
                       TextColumn("{task.completed} states, {task.fields[rate]:.0f}/s"), TimeElapsedColumn(),
                       transient=True)
        task = bar.add_task(scenario.name, total=max_states, rate=0.0)
        bar.start()
    try:
        while frontier:
            if stop is not None and stop(violations):
                truncated_by = "stop"
                break
            nid, core = frontier.popleft()
            if depth[nid] >= max_depth:
                truncated_by = truncated_by or "max_depth"
                continue
            expanded[nid] = True
            fired = fired_of[nid]
            for i, spec in enumerate(actions):
                if spec.once and fired >> i & 1:
                    continue
                if spec.guard != "always" and not guard_holds(core, spec):
                    continue
                cov = coverage[i]
                cov.enabled += 1
                if split:
                    cid = node_core[nid]
                    hit = outcomes.get(cid * n_actions + i)
                    if hit is None:
                        new, out = fire(core, spec, now)
                        ncid = -1 if out.internal_error is not None else (cid if new is core else core_id(new))
                        outcomes[cid * n_actions + i] = (new, out, ncid)
                    else:
                        new, out, ncid = hit
                else:
                    new, out = fire(core, spec, now)
                fired2 = fired | (1 << i) if spec.once else fired
                eidx = len(edges)
                if out.internal_error is not None:  # MC-16
                    edges.append(Edge(nid, -1, i, out))
                    if safety:
                        report("internal_error", spec.kind, out.internal_error, nid, eidx)
                    continue
                if out.rejected is not None:
                    cov.rejected += 1
                    # MC-13: the core a command was rejected on, keyed again from scratch (no memo,
                    # so a change made in place shows), still has the key it was found with
                    if safety and "transitions" in checks and (
                            (split and fresh_key(core) != key_of_core[node_core[nid]])
                            or (not split and node_key(core, fired, sym, fresh=True) != keys[nid])):
                        report("rejected_changed_state", spec.kind,
                               f"{spec.name} was rejected ({out.rejected}) but the core changed", nid, eidx)
                else:
                    cov.fired += 1
                if new is core and fired2 == fired:
                    # CORE-7: an operation that changed nothing returns its input; a self-loop
                    dst = nid
                    key = None
                else:
                    key = (ncid, fired2) if split else node_key(new, fired2, sym)
                    dst = ids.get(key)
                if dst is None:
                    if len(keys) >= max_states:
                        truncated_by = "max_states"
                        edges.append(Edge(nid, -1, i, out))
                        continue
                    dst = len(keys)
                    ids[key] = dst
                    keys.append(key)
                    parent_edge.append(eidx)
                    depth.append(depth[nid] + 1)
                    fired_of.append(fired2)
                    if split:
                        node_core.append(ncid)
                    drained.append(C.is_drained(new))
                    views.append(viewer.view(new, fired2, ncid if split else None))
                    expanded.append(False)
                    cov.new_states += 1
                    frontier.append((dst, new))
                    edges.append(Edge(nid, dst, i, out))
                    check_state(dst, new, ncid if split else None)
                else:
                    edges.append(Edge(nid, dst, i, out))
                if safety and "transitions" in checks and spec.kind == "pass":
                    if out.end_ms < out.now_ms:  # MC-14
                        report("time_went_backwards", "pass", f"end_ms {out.end_ms} < now_ms {out.now_ms}", nid, eidx)
                    if out.progress and dst == nid:  # MC-15
                        report("progress_without_change", "pass",
                               f"a pass reported progress ({out.label}) but the state did not change", nid, eidx)
            if bar is not None and len(keys) % 200 < len(actions):
                el = time.perf_counter() - t0
                bar.update(task, completed=len(keys), rate=len(keys) / el if el else 0.0)
    finally:
        if bar is not None:
            bar.stop()
    complete = not frontier and truncated_by is None
    elapsed = time.perf_counter() - t0
    rss1 = _rss_bytes()
    bpp = None if rss0 is None or rss1 is None else max(rss1 - rss0, 0) / max(len(keys), 1)
    exp = Exploration(scenario, sym, parent_edge, depth, fired_of, drained, views, edges, coverage, violations,
                      complete, truncated_by, elapsed, bpp, False)
    if liveness and complete and sym is None:
        _liveness(exp, checks)
        exp.liveness_checked = True
        exp.elapsed_s = time.perf_counter() - t0
    return exp


def _path(parent_edge, edges, node) -> List[int]:
    out = []
    while node != 0:
        e = parent_edge[node]
        out.append(e)
        node = edges[e].src
    out.reverse()
    return out


# ---------------------------------------------------------------------------------------------
# Liveness (MC-30..MC-33): always on the unreduced, complete graph
# ---------------------------------------------------------------------------------------------


def _liveness(exp: Exploration, checks: set) -> None:
    edges = exp.edges
    actions = exp.scenario.actions
    n = exp.num_states
    coop_succ = successors(edges, actions, cooperative=True)

    # MC-30 deadlock: not drained; every enabled cooperative action is a self-loop reporting no progress
    if "deadlock" in checks:
        best = None
        count = 0
        for node in range(n):
            if exp.drained[node]:
                continue
            out = coop_succ.get(node, ())
            if all(d == node and not edges[e].outcome.progress for e, d in out):
                count += 1
                if best is None or exp.depth[node] < exp.depth[best]:
                    best = node
        if best is not None:
            v = Violation("deadlock", "deadlock", _stuck_message(exp, best), best, exp.path_to(best),
                          occurrences=count)
            exp.violations.append(v)

    # MC-31 livelock: a cycle of zero-time cooperative transitions with a progress report
    if "livelock" in checks:
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        zsucc: Dict[int, List[Tuple[int, int]]] = {}
        for src, lst in coop_succ.items():
            for e, d in lst:
                if edges[e].outcome.zero_time:
                    g.add_edge(src, d)
                    zsucc.setdefault(src, []).append((e, d))
        best = None
        count = 0
        for comp in nx.strongly_connected_components(g):
            if len(comp) == 1:
                (only,) = comp
                if not g.has_edge(only, only):
                    continue
            has_prog = any(edges[e].outcome.progress and d in comp for u in comp for e, d in zsucc.get(u, ()))
            if not has_prog:
                continue
            count += 1
            entry = min(comp, key=lambda x: (exp.depth[x], x))
            cyc = shortest_cycle_through(entry, comp, zsucc, edges, lambda ed: ed.outcome.progress)
            if cyc is None:  # pragma: no cover - a progress edge inside an SCC always closes
                continue
            cand = (exp.depth[entry] + len(cyc), entry, cyc)
            if best is None or cand[0] < best[0]:
                best = cand
        if best is not None:
            _, entry, cyc = best
            exp.violations.append(Violation(
                "livelock", "livelock",
                "a cycle of cooperative zero-time transitions reports progress forever: " + _stuck_message(exp, entry),
                entry, exp.path_to(entry), cycle=cyc, occurrences=count))

    # MC-32 starvation: a bottom SCC of the cooperative graph that holds an unfinished request
    if "starvation" in checks:
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        for src, lst in coop_succ.items():
            for _e, d in lst:
                g.add_edge(src, d)
        best = None
        count = 0
        for comp in nx.strongly_connected_components(g):
            bottom = all(d in comp for u in comp for _e, d in coop_succ.get(u, ()))
            if not bottom or all(exp.drained[x] for x in comp):
                continue
            count += 1
            entry = min(comp, key=lambda x: (exp.depth[x], x))
            cyc = shortest_cycle_through(entry, comp, coop_succ, edges, None) or []
            cand = (exp.depth[entry] + len(cyc), entry, cyc)
            if best is None or cand[0] < best[0]:
                best = cand
        if best is not None:
            _, entry, cyc = best
            exp.violations.append(Violation(
                "starvation", "starvation",
                "every cooperative continuation stays in a set of states with unfinished work: "
                + _stuck_message(exp, entry),
                entry, exp.path_to(entry), cycle=cyc, occurrences=count))


def _stuck_message(exp: Exploration, node: int) -> str:
    phases, waiting, running, free = exp.views[node]
    parts = [f"waiting [{', '.join(waiting)}]", f"running [{', '.join(running)}]"]
    if free is not None:
        parts.append(f"free {free}")
    parts.extend(f"{h}={p}" for h, p in phases)
    return "; ".join(parts)
