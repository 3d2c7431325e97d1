"""Paths over an explored graph (spec/model-checking.md MC-21, MC-33): successor maps, shortest
distances and shortest cycles, shared by the search's liveness checks and the goals."""

from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Tuple


def successors(edges, actions, cooperative: bool = False) -> Dict[int, List[Tuple[int, int]]]:
    """``src -> [(edge index, dst)]`` over the explored edges that have a successor; only the
    cooperative actions' edges when ``cooperative``."""
    out: Dict[int, List[Tuple[int, int]]] = {}
    for idx, e in enumerate(edges):
        if e.dst >= 0 and (not cooperative or actions[e.action].cooperative):
            out.setdefault(e.src, []).append((idx, e.dst))
    return out


def bfs_dist(start: int, succ, allowed) -> Tuple[Dict[int, int], Dict[int, Tuple[int, int]]]:
    """Shortest distances from ``start`` inside ``allowed`` over ``succ[n] = [(edge, dst)]``."""
    dist = {start: 0}
    via: Dict[int, Tuple[int, int]] = {}
    q = deque([start])
    while q:
        n = q.popleft()
        for e, d in succ.get(n, ()):
            if d in allowed and d not in dist:
                dist[d] = dist[n] + 1
                via[d] = (n, e)
                q.append(d)
    return dist, via


def walk(via, start, end) -> List[int]:
    out = []
    n = end
    while n != start:
        p, e = via[n]
        out.append(e)
        n = p
    out.reverse()
    return out


def shortest_cycle_through(entry: int, comp: set, succ, edges, want) -> Optional[List[int]]:
    """MC-33: the shortest cycle from ``entry`` back to ``entry`` inside ``comp`` that uses at least
    one edge satisfying ``want`` (any edge when ``want`` is None)."""
    dist, via = bfs_dist(entry, succ, comp)
    # distances to ``entry`` over reversed edges, with the next edge towards it
    pred: Dict[int, List[Tuple[int, int]]] = {}
    for u in comp:
        for e, v in succ.get(u, ()):
            if v in comp:
                pred.setdefault(v, []).append((e, u))
    back = {entry: 0}
    nxt: Dict[int, Tuple[int, int]] = {}
    q = deque([entry])
    while q:
        x = q.popleft()
        for e, u in pred.get(x, ()):
            if u not in back:
                back[u] = back[x] + 1
                nxt[u] = (e, x)
                q.append(u)
    best = None
    for u in comp:
        if u not in dist:
            continue
        for e, v in succ.get(u, ()):
            if v not in comp or v not in back or (want is not None and not want(edges[e])):
                continue
            total = dist[u] + 1 + back[v]
            if best is None or total < best[0]:
                best = (total, u, e, v)
    if best is None:
        return None
    _, u, e, v = best
    out = walk(via, entry, u) + [e]
    while v != entry:
        e2, v = nxt[v]
        out.append(e2)
    return out
