"""The explorer's path helpers (spec/model-checking.md MC-21, MC-33): shortest distances and the
shortest cycle through a state, on hand-built graphs and against a brute-force search."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from explorer.paths import bfs_dist, shortest_cycle_through, walk


def _succ(edges):
    out = {}
    for i, (src, dst, _tag) in enumerate(edges):
        out.setdefault(src, []).append((i, dst))
    return out


def _is_cycle(path, entry, edges, comp):
    at = entry
    for e in path:
        src, dst, _tag = edges[e]
        if src != at or dst not in comp:
            return False
        at = dst
    return at == entry and len(path) > 0


def _brute_shortest(entry, edges, comp, want):
    """Length of the shortest cycle from ``entry`` inside ``comp`` using a wanted edge: BFS over
    (node, a wanted edge used yet)."""
    start = (entry, False)
    dist = {start: 0}
    q = deque([start])
    best = None
    while q:
        node, used = q.popleft()
        for src, dst, tag in edges:
            if src != node or dst not in comp:
                continue
            used2 = used or want is None or want((src, dst, tag))
            if dst == entry and used2:
                cand = dist[(node, used)] + 1
                best = cand if best is None else min(best, cand)
            nxt = (dst, used2)
            if nxt not in dist:
                dist[nxt] = dist[(node, used)] + 1
                q.append(nxt)
    return best


def test_the_shortest_cycle_is_chosen_and_a_wanted_edge_forces_the_longer_one():
    # MC-33, by hand: from 0 a 4-edge loop 0-1-2-3-0 (its 2->3 edge tagged "slow") and a 2-edge
    # loop 0-4-0.  Any edge will do: the 2-edge loop.  Only a "slow" edge will do: the 4-edge one.
    edges = [(0, 1, ""), (1, 2, ""), (2, 3, "slow"), (3, 0, ""), (0, 4, ""), (4, 0, "")]
    comp = {0, 1, 2, 3, 4}
    succ = _succ(edges)
    assert shortest_cycle_through(0, comp, succ, edges, None) == [4, 5]
    assert shortest_cycle_through(0, comp, succ, edges, lambda e: e[2] == "slow") == [0, 1, 2, 3]
    # outside the component the loop through 4 does not exist
    assert shortest_cycle_through(0, {0, 1, 2, 3}, succ, edges, None) == [0, 1, 2, 3]
    assert shortest_cycle_through(0, {0, 1, 2}, succ, edges, None) is None


def test_bfs_distances_and_walk_follow_the_first_shortest_path():
    # MC-21, by hand: 0->1->3 and 0->2->3->4: 3 is 2 away (via 1, found first), 4 is 3 away
    edges = [(0, 1, ""), (0, 2, ""), (1, 3, ""), (2, 3, ""), (3, 4, "")]
    dist, via = bfs_dist(0, _succ(edges), {0, 1, 2, 3, 4})
    assert dist == {0: 0, 1: 1, 2: 1, 3: 2, 4: 3}
    assert walk(via, 0, 4) == [0, 2, 4]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from(["", "w"])), min_size=1, max_size=14),
    st.sets(st.integers(0, 5), min_size=1),
    st.booleans(),
)
def test_shortest_cycle_matches_a_brute_force_search(edges, extra, need_tag):
    # MC-33: the cycle returned is a real cycle through the entry, inside the component, with a
    # wanted edge, and no cycle is shorter; None exactly when there is none.
    entry = edges[0][0]
    comp = extra | {entry}
    want = (lambda e: e[2] == "w") if need_tag else None
    got = shortest_cycle_through(entry, comp, _succ(edges), edges, want)
    best = _brute_shortest(entry, edges, comp, want)
    if best is None:
        assert got is None
        return
    assert got is not None and len(got) == best
    assert _is_cycle(got, entry, edges, comp)
    assert want is None or any(want(edges[e]) for e in got)
