"""Canonical state identity is sound (spec/model-checking.md MC-1..MC-4).

Two states with the same key must behave the same under every action: the
tests enumerate raw states (exact core equality, so generation bumps, ticks and
counters are told apart) and check that equal-key states have equal-key
successors, the same outcomes and the same property verdicts -- exhaustively
for one step, and along random action sequences (Hypothesis).
"""

from __future__ import annotations

import pathlib
from collections import defaultdict, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer import explore, load_scenario
from explorer import properties as P
from explorer.actions import fire, guard_holds
from explorer.canon import canonical_key, node_key, symmetry_for
from model import core as C

LIB = pathlib.Path(__file__).resolve().parent.parent / "spec" / "scenarios"


def _enabled(sc, core, fired):
    for i, a in enumerate(sc.actions):
        if a.once and fired >> i & 1:
            continue
        if a.guard != "always" and not guard_holds(core, a):
            continue
        yield i, a


def _raw_states(sc, depth_bound):
    """Reachable (core, fired) pairs up to ``depth_bound``, deduplicated by exact equality."""
    core0 = C.new_core(sc.args)
    seen = {(core0, 0): 0}
    q = deque([(core0, 0)])
    while q:
        c, f = q.popleft()
        d = seen[(c, f)]
        if d >= depth_bound:
            continue
        for i, a in _enabled(sc, c, f):
            new, _o = fire(c, a, sc.now_ms)
            if new is None:
                continue
            f2 = f | (1 << i) if a.once else f
            if (new, f2) not in seen:
                seen[(new, f2)] = d + 1
                q.append((new, f2))
    return list(seen)


def _signature(sc, core, fired, sym, by_action):
    succ = []
    for i, a in _enabled(sc, core, fired):
        new, o = fire(core, a, sc.now_ms)
        f2 = fired | (1 << i) if a.once else fired
        k = None if new is None else node_key(new, f2, sym)
        item = (k, o.progress, o.zero_time, o.rejected is not None, o.internal_error is not None)
        succ.append((i,) + item if by_action else item)
    props = (
        tuple(sorted(n for n, _m in P.registered_invariants(core))),
        P.fifo_acceptance_order(core) is None,
        C.is_drained(core),
        P.leaked_kv(core),
    )
    return (tuple(succ) if by_action else frozenset(succ)), props


def _groups(sc, raw, sym):
    groups = defaultdict(list)
    for c, f in raw:
        groups[node_key(c, f, sym)].append((c, f))
    return [g for g in groups.values() if len(g) > 1]


SCENARIOS = [
    ("known-defects/s7-vllm-zero-time-livelock.json", 12),
    ("known-defects/s6-vllm-activated-fifo-deadlock.json", 12),
    ("known-defects/s1-fifo-tombstone-revival.json", 7),
    # the SGLang key (node-id and tick ranks, slot relabelling)
    ("known-defects/s10-sglang-slot-leak.json", 7),
    ("sglang/sglang-decode-three-handoffs.json", 9),
]


@pytest.mark.parametrize("name,depth", SCENARIOS, ids=[s[0].split("/")[1][:16] for s in SCENARIOS])
def test_equal_keys_have_equal_successors(name, depth):
    """MC-1/MC-2: among raw states that share a key, every action gives equal-key successors with
    the same outcome class, and every state property agrees (one-step bisimulation over the
    reachable raw states, which makes the key relation a bisimulation)."""
    sc = load_scenario(LIB / name)
    raw = _raw_states(sc, depth)
    groups = _groups(sc, raw, None)
    assert groups, "the abstraction merges nothing here: the test would be vacuous"
    for g in groups:
        sigs = {_signature(sc, c, f, None, True) for c, f in g}
        assert len(sigs) == 1, f"{len(g)} states share a key but behave differently"


def test_symmetry_keys_are_a_bisimulation():
    """MC-4: with symmetry, equal-key states have the same set of successor keys and the same
    property verdicts (the action correspondence is the permutation, so sets are compared)."""
    sc = load_scenario(LIB / "clean" / "vllm-decode-three-handoffs.json")
    sym = symmetry_for(sc)
    assert sym is not None and sym.size == 6
    raw = _raw_states(sc, 7)
    groups = _groups(sc, raw, sym)
    assert groups
    for g in groups:
        sigs = {_signature(sc, c, f, sym, False) for c, f in g}
        assert len(sigs) == 1


def test_symmetry_keys_are_invariant_under_the_permutations():
    """MC-4: the symmetric key is the same for a state and each of its images.  Every explored
    state's BFS-tree path is replayed with its actions renamed by each permutation of the class
    (the action map of ``Symmetry.perms``), on a fresh core; all images get one key.  So the
    reduced search visits at most one state per orbit (fewer where data independence merges
    more), here exactly one."""
    sc = load_scenario(LIB / "clean" / "vllm-decode-three-handoffs.json")
    sym = symmetry_for(sc)
    exp = explore(sc, symmetry=False)
    orbits = set()
    for node in range(exp.num_states):
        path = [exp.edges[e].action for e in exp.path_to(node)]
        keys = set()
        for _ids, _keys, action_map in sym.perms:
            core, fired = C.new_core(sc.args), 0
            for i in path:
                a = sc.actions[action_map[i]]
                core, _out = fire(core, a, sc.now_ms)
                if a.once:
                    fired |= 1 << action_map[i]
            keys.add(node_key(core, fired, sym))
        assert len(keys) == 1, f"state {node}: {len(keys)} keys for one orbit"
        orbits |= keys
    assert explore(sc, symmetry=True).num_states == len(orbits) < exp.num_states


def test_symmetry_is_off_when_an_id_can_be_issued_twice():
    """MC-4: a request id issued by two actions could meet its own earlier blocks: no reduction."""
    from explorer import scenario_from_dict
    import json

    raw = json.loads((LIB / "clean" / "vllm-decode-three-handoffs.json").read_text())
    raw["actions"] = [{"kind": "reserve", "handoff": "hZ", "request": "A"}]
    assert symmetry_for(scenario_from_dict(raw)) is None


_S7 = load_scenario(LIB / "known-defects" / "s7-vllm-zero-time-livelock.json")
_S7_RAW = _raw_states(_S7, 10)
_S7_GROUPS = _groups(_S7, _S7_RAW, None)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_action_sequences_keep_equal_keys_equal(data):
    """MC-1 (Hypothesis): from two states with one key, the same random action sequence gives
    states with one key at every step (and the same enabled actions)."""
    g = data.draw(st.sampled_from(_S7_GROUPS))
    (c1, f1), (c2, f2) = data.draw(st.permutations(g))[:2]
    for _ in range(data.draw(st.integers(1, 8))):
        en1 = [i for i, _a in _enabled(_S7, c1, f1)]
        en2 = [i for i, _a in _enabled(_S7, c2, f2)]
        assert en1 == en2
        i = data.draw(st.sampled_from(en1))
        a = _S7.actions[i]
        n1, o1 = fire(c1, a, 0.0)
        n2, o2 = fire(c2, a, 0.0)
        assert (o1.progress, o1.zero_time, o1.rejected) == (o2.progress, o2.zero_time, o2.rejected)
        if a.once:
            f1 |= 1 << i
            f2 |= 1 << i
        c1, c2 = n1, n2
        assert node_key(c1, f1) == node_key(c2, f2)


def test_time_is_not_part_of_a_state():
    """MC-3: a pass at any ``now`` gives the same successor, and zero duration does not depend on now."""
    sc = _S7
    for c, f in _S7_RAW[:40]:
        results = [C.execute_pass(c, now) for now in (0.0, 17.25, 1.0e6)]
        keys = {canonical_key(new) for new, _r in results}
        assert len(keys) == 1
        zero = {r.end_ms == r.now_ms for _n, r in results}
        assert len(zero) == 1
        durations = {round(r.end_ms - r.now_ms, 6) for _n, r in results}
        assert len(durations) == 1
    assert sc.now_ms == 0.0


def test_generation_and_counters_are_abstracted():
    """MC-2: the S7 loop state repeats under the key although the generation, the preemption counter
    and the lineage ticks all moved."""
    sc = _S7
    core = C.new_core(sc.args)
    for name in ("reserve(hX,X)", "reserve(hY,Y)", "activate(hY)"):
        core, _o = fire(core, sc.action(name), 0.0)
    a, _ = C.execute_pass(core, 0.0)
    b, _ = C.execute_pass(a, 0.0)
    assert a != b
    assert a.ledger.capacity_generation != b.ledger.capacity_generation
    assert a.preemptions_total != b.preemptions_total
    assert canonical_key(a) == canonical_key(b)
