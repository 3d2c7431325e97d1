"""Replaying a counterexample against the model (spec/model-checking.md MC-46).

A counterexample is a list of action names of a scenario (and, for a lasso,
the index of the state where its loop starts).  :func:`reproduce` runs it from
the empty core, checks that every step was enabled, and re-checks the
violation on the states it produced -- independently of the explorer's graph.
Generated pytest files call :func:`reproduce`.
"""

from __future__ import annotations

from collections import deque
from typing import List, Optional, Sequence

import attrs

from model import core as C

from . import properties as P
from .actions import Outcome, fire, guard_holds
from .canon import node_key
from .goals import holds
from .scenario import Scenario, scenario_from_dict


@attrs.frozen
class Replayed:
    """The states (``cores[0]`` is the empty core) and outcomes of a replayed step list."""

    cores: tuple
    fired: tuple
    outcomes: tuple
    error: Optional[str] = None


@attrs.frozen
class Reproduction:
    reproduced: bool
    message: str
    replayed: Replayed


def replay_steps(scenario: Scenario, steps: Sequence[str]) -> Replayed:
    """MC-46: run the named actions in order; stop with ``error`` at the first disabled or unknown one."""
    index = {a.name: i for i, a in enumerate(scenario.actions)}
    core = C.new_core(scenario.args)
    fired = 0
    cores = [core]
    fireds = [0]
    outcomes: List[Outcome] = []
    for n, name in enumerate(steps):
        i = index.get(name)
        if i is None:
            return Replayed(tuple(cores), tuple(fireds), tuple(outcomes), f"step {n + 1}: unknown action {name!r}")
        spec = scenario.actions[i]
        if spec.once and fired >> i & 1:
            return Replayed(tuple(cores), tuple(fireds), tuple(outcomes), f"step {n + 1}: {name} already fired")
        if spec.guard != "always" and not guard_holds(core, spec):
            return Replayed(tuple(cores), tuple(fireds), tuple(outcomes), f"step {n + 1}: {name} is not enabled")
        new, out = fire(core, spec, scenario.now_ms)
        outcomes.append(out)
        if spec.once:
            fired |= 1 << i
        if new is None:
            return Replayed(tuple(cores), tuple(fireds), tuple(outcomes))
        core = new
        cores.append(core)
        fireds.append(fired)
    return Replayed(tuple(cores), tuple(fireds), tuple(outcomes))


def _enabled(scenario: Scenario, core, fired: int):
    for i, spec in enumerate(scenario.actions):
        if spec.once and fired >> i & 1:
            continue
        if spec.guard != "always" and not guard_holds(core, spec):
            continue
        yield i, spec


def reproduce(scenario, steps: Sequence[str], kind: str, name: str = "", loop: Optional[int] = None) -> Reproduction:
    """MC-46: does the step list (with its loop) exhibit a violation of ``kind`` (and ``name``)?"""
    if not isinstance(scenario, Scenario):
        scenario = scenario_from_dict(scenario)
    rep = replay_steps(scenario, steps)
    if rep.error:
        return Reproduction(False, rep.error, rep)
    last = rep.cores[-1]
    fired = rep.fired[-1]
    out = rep.outcomes[-1] if rep.outcomes else None

    def result(ok, msg):
        return Reproduction(ok, msg, rep)

    if kind in ("sometimes", "unreachable_goal", "forbidden_state"):
        goal = next((g for g in (scenario.never if kind == "forbidden_state" else scenario.sometimes)
                     if g.name == name), None)
        if goal is None:
            return result(False, f"the scenario has no goal {name!r}")
        if kind == "unreachable_goal":
            # unreachability is a claim about every path: re-explore, safety and liveness off
            from .goals import evaluate
            from .search import _run

            graph = _run(scenario, None, None, None, False, None, safety=False, liveness=False)
            if not graph.complete:
                return result(False, f"the exploration stopped at {graph.num_states} states ({graph.truncated_by})")
            (res,) = [r for r in evaluate(graph) if r.goal.name == name]
            return result(res.reached is False, goal.describe() if res.reached is False
                          else f"reached in {res.witness.length} step(s)")
        from .search import _Viewer

        if goal.cooperative_only and not all(scenario.action(s).cooperative for s in steps):
            return result(False, "the witness uses an adversarial action")
        view = _Viewer(scenario).view(last, fired)
        ok = holds(goal, view, C.is_drained(last))
        return result(ok, f"the final state has {goal.describe()}" if ok else f"the final state's phases are {view[0]}")
    if kind == "invariant":
        found = [n for n, _ in P.registered_invariants(last)]
        return result(name in found, f"invariants violated at the end: {found}")
    if kind == "fifo_order":
        msg = P.fifo_acceptance_order(last)
        return result(msg is not None, msg or "FIFO order holds at the end")
    if kind == "drained_pool_free":
        msg = P.drained_pool_free(last)
        return result(msg is not None, msg or "the final state is not a drained core holding KV")
    if kind == "internal_error":
        ok = out is not None and out.internal_error is not None
        return result(ok, out.label if out else "no step")
    if kind == "time_went_backwards":
        ok = out is not None and out.end_ms < out.now_ms
        return result(ok, "" if out is None else f"end_ms {out.end_ms}, now_ms {out.now_ms}")
    if kind == "rejected_changed_state":
        # MC-13: the core the last command is rejected on, keyed from scratch before and after it
        # (a rejection returns that same core, so only a change made in place can show)
        if out is None or out.rejected is None:
            return result(False, "the last step was not rejected" if out is not None else "no step")
        prefix = replay_steps(scenario, steps[:-1])
        core = prefix.cores[-1]
        key_before = node_key(core, 0, fresh=True)
        fire(core, scenario.action(steps[-1]), scenario.now_ms)
        ok = node_key(core, 0, fresh=True) != key_before
        return result(ok, out.label)
    if kind == "progress_without_change":
        ok = (out is not None and out.progress and len(rep.cores) > 1
              and node_key(rep.cores[-2], rep.fired[-2]) == node_key(last, fired))
        return result(ok, "" if out is None else out.label)
    if kind == "deadlock":
        if C.is_drained(last):
            return result(False, "the final state is drained")
        k = node_key(last, fired)
        for i, spec in _enabled(scenario, last, fired):
            if not spec.cooperative:
                continue
            new, o = fire(last, spec, scenario.now_ms)
            if new is None:
                continue
            f2 = fired | (1 << i) if spec.once else fired
            if node_key(new, f2) != k or o.progress:
                return result(False, f"{spec.name} still changes the state ({o.label})")
        return result(True, "no cooperative action changes the final state")
    if kind == "avoidable_goal":
        goal = next((g for g in scenario.eventually if g.name == name), None)
        if goal is None:
            return result(False, f"the scenario has no eventually goal {name!r}")
    if kind in ("livelock", "starvation", "avoidable_goal"):
        if loop is None:
            return result(False, "a lasso needs a loop index")
        if not 0 <= loop < len(rep.cores) - 1:
            return result(False, f"loop index {loop} is outside the {len(steps)}-step trace")
        if node_key(rep.cores[loop], rep.fired[loop]) != node_key(last, fired):
            return result(False, f"state {len(rep.cores) - 1} is not state {loop}: the loop does not close")
        cycle = steps[loop:]
        specs = [scenario.action(s) for s in cycle]
        outs = rep.outcomes[loop:]
        if not all(s.cooperative for s in specs):
            return result(False, "the loop uses an adversarial action")
        if kind == "livelock":
            ok = all(o.zero_time for o in outs) and any(o.progress for o in outs)
            return result(ok, "zero-time loop reporting progress" if ok else "the loop takes time or reports nothing")
        if kind == "starvation":
            # no cooperative continuation from the loop ever drains the core
            bad = lambda core, f: C.is_drained(core)  # noqa: E731
            what = "drained"
        else:
            # no state of the trace reaches the goal, and no cooperative continuation of the loop does
            from .search import _Viewer

            viewer = _Viewer(scenario)
            bad = lambda core, f: holds(goal, viewer.view(core, f), C.is_drained(core))  # noqa: E731
            what = f"with {goal.describe()}"
            for n, (core, f) in enumerate(zip(rep.cores, rep.fired)):
                if bad(core, f):
                    return result(False, f"state {n} of the trace already has {goal.describe()}")
        if bad(last, fired):
            return result(False, f"the loop state is {what}")
        seen = {node_key(last, fired)}
        q = deque([(last, fired)])
        while q:
            core, f = q.popleft()
            for i, spec in _enabled(scenario, core, f):
                if not spec.cooperative:
                    continue
                new, _o = fire(core, spec, scenario.now_ms)
                if new is None:
                    continue
                f2 = f | (1 << i) if spec.once else f
                if bad(new, f2):
                    return result(False, f"{spec.name} leads to a state {what}")
                k = node_key(new, f2)
                if k not in seen:
                    seen.add(k)
                    q.append((new, f2))
        return result(True, f"{len(seen)} cooperative continuation state(s), none {what}")
    return result(False, f"unknown violation kind {kind!r}")
