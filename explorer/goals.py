"""Goals: "sometimes" properties with shortest witnesses (spec/model-checking.md MC-34),
"eventually" properties under a fair cooperative driver (MC-35) and "never" properties (MC-36).

A safety or liveness verdict of ``clean`` is only as good as the scenario: if the driver's
actions were always rejected, every state would be the empty core and nothing could fail. A goal
says what must be *possible* -- some reachable state has these phases (SCN-10) -- and the
explorer answers with the shortest path to such a state (a witness) or, after a complete
exploration that found none, with an ``unreachable_goal`` violation.

All three kinds are evaluated after the search, on the stored per-node views (MC-40) of an
unreduced graph (with symmetry on, the second, unreduced exploration of MC-25 runs for them even
when the liveness checks are off): a goal names concrete request ids, which a symmetry reduction
may have swapped for their class's representative.
"""

from __future__ import annotations

from typing import List, Optional

import attrs

from .paths import bfs_dist, shortest_cycle_through, successors, walk
from .scenario import Goal


def phase_matches(want: str, have: str) -> bool:
    """A goal's phase matches the node's phase itself or any of its refinements:
    ``D_active`` matches ``D_active(running)``, ``D_pending`` matches ``D_pending(tried)``,
    ``waiting`` matches ``waiting(fresh)``."""
    return have == want or have.startswith(want + "(")


def holds(goal: Goal, view: tuple, drained: bool) -> bool:
    """MC-34: does a node with this view (MC-40) and drained flag satisfy ``goal``?
    The view's phases are one per universe request, in universe order (SCN-3)."""
    if goal.drained is not None and drained != goal.drained:
        return False
    phases = view[0]
    return all(phase_matches(want, phases[i][1]) for i, _rid, want in goal.phases)


@attrs.define
class Witness:
    """MC-34: the shortest path (edges of ``graph``) from the initial state to a state that
    satisfies a goal. It has the shape of a finite counterexample, so the readable steps, ITF and
    replay writers (MC-43, MC-44, MC-46) take it as they take a violation."""

    name: str
    message: str
    node: int
    prefix: List[int]
    graph: Optional[object] = attrs.field(default=None, eq=False, repr=False)
    kind: str = "sometimes"
    edge: Optional[int] = None
    cycle: List[int] = attrs.Factory(list)

    def steps(self) -> List[int]:
        return list(self.prefix)

    @property
    def length(self) -> int:
        return len(self.prefix)

    @property
    def loop_index(self) -> Optional[int]:
        return None


@attrs.define
class GoalResult:
    """One goal's answer: ``reached`` is True (with a witness), False (a complete exploration has
    no such state) or None (not found in an incomplete exploration, so unknown)."""

    goal: Goal
    reached: Optional[bool]
    witness: Optional[Witness] = None


def evaluate(graph, own: bool = True, goals=None) -> List[GoalResult]:
    """MC-34: every goal of ``graph.scenario`` (or ``goals``) on ``graph`` (an unreduced
    exploration). Without ``cooperative_only`` the witness is the parent-pointer path of the first
    satisfying node (BFS numbers nodes in order of depth, so it is a shortest one); with it, a
    breadth-first search over the cooperative transitions alone. ``own`` is False when ``graph`` is not the exploration
    the results are reported with (symmetry runs), so witnesses carry their graph."""
    sc = graph.scenario
    results: List[GoalResult] = []
    coop_succ = None
    for goal in sc.sometimes if goals is None else goals:
        sat = [n for n in range(graph.num_states) if holds(goal, graph.views[n], graph.drained[n])]
        node = None
        path: List[int] = []
        if goal.cooperative_only and sat:
            if coop_succ is None:
                coop_succ = successors(graph.edges, sc.actions, cooperative=True)
            node, path = _nearest(coop_succ, sat, graph.num_states)
        elif sat:
            node = sat[0]
            path = graph.path_to(node)
        how = "by cooperative actions" if goal.cooperative_only else "by any actions"
        if node is not None:
            w = Witness(goal.name, f"{goal.name}: {goal.describe()}, reached {how}", node, path,
                        graph=None if own else graph)
            results.append(GoalResult(goal, True, w))
        else:
            results.append(GoalResult(goal, False if graph.complete else None))
    return results


def _nearest(succ, targets: List[int], n: int):
    """The target nearest to node 0 over ``succ`` (ties: the lowest node number) and the path to it."""
    dist, via = bfs_dist(0, succ, range(n))
    hits = [t for t in targets if t in dist]
    if not hits:
        return None, []
    node = min(hits, key=lambda t: (dist[t], t))
    return node, walk(via, 0, node)


def avoidable(graph) -> List[tuple]:
    """MC-35: for each ``eventually`` goal of ``graph.scenario`` (a complete, unreduced
    exploration): ``(goal, None)`` when every fair cooperative run reaches it, else ``(goal, (entry,
    prefix, cycle, count))`` -- a lasso whose prefix (any actions) avoids the goal and whose cycle
    lies in a bottom strongly connected component of the cooperative subgraph without a goal state.

    Fairness: a run may start with any actions (the adversary's included) and then follows
    cooperative actions, taking each one enabled infinitely often infinitely often; such a run ends
    in a bottom component of the cooperative subgraph and visits all of it. So the goal can be
    avoided forever exactly when such a component has no goal state and is reachable through
    states that are not goal states. A goal that every request has finished gives MC-32's
    starvation lassos on the known-defect scenarios; ``drained`` alone holds at the empty initial
    state (starvation is "from every state, eventually drained", which MC-32 checks itself)."""
    import networkx as nx

    sc = graph.scenario
    edges = graph.edges
    n = graph.num_states
    coop_succ = successors(edges, sc.actions, cooperative=True)
    all_succ = successors(edges, sc.actions)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for src, lst in coop_succ.items():
        for _e, d in lst:
            g.add_edge(src, d)
    bottoms = [comp for comp in nx.strongly_connected_components(g)
               if all(d in comp for u in comp for _e, d in coop_succ.get(u, ()))]
    out = []
    for goal in sc.eventually:
        good = [holds(goal, graph.views[x], graph.drained[x]) for x in range(n)]
        if good[0]:
            out.append((goal, None))
            continue
        avoid = {x for x in range(n) if not good[x]}
        dist, via = bfs_dist(0, all_succ, avoid)
        best = None
        count = 0
        for comp in bottoms:
            if any(good[x] for x in comp):
                continue
            reach = [x for x in comp if x in dist]
            if not reach:
                continue
            count += 1
            entry = min(reach, key=lambda x: (dist[x], x))
            cyc = shortest_cycle_through(entry, comp, coop_succ, edges, None) or []
            cand = (dist[entry] + len(cyc), entry, cyc)
            if best is None or cand[0] < best[0]:
                best = cand
        if best is None:
            out.append((goal, None))
        else:
            _, entry, cyc = best
            out.append((goal, (entry, walk(via, 0, entry), cyc, count)))
    return out


def avoidable_message(goal: Goal) -> str:
    return (f"a fair cooperative run can avoid {goal.describe()} forever: it ends in states that never "
            "reach it")


def forbidden_message(goal: Goal) -> str:
    return f"a reachable state has {goal.describe()}"


def unreachable_message(goal: Goal) -> str:
    how = " by cooperative actions" if goal.cooperative_only else ""
    return f"no state reachable{how} has {goal.describe()}"
