"""State-graph exports and quotient graphs (spec/model-checking.md MC-42..MC-45).

:func:`to_networkx` turns an exploration into a ``networkx.MultiDiGraph``;
the writers serialise it as DOT (TLC-style ``/\\ var = value`` node labels,
action-labelled edges), GraphML, node-link JSON and Mermaid.  :func:`quotient`
projects every state onto one handoff's lifecycle phase, which derives the
per-handoff state diagram from the reachable graph.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import networkx as nx

from .search import Exploration


def node_label(exp: Exploration, node: int) -> str:
    """MC-42: a TLC-like label: one ``/\\ var = value`` line per variable of the node's view."""
    phases, waiting, running, free = exp.views[node]
    lines = [
        "/\\ waiting = <<" + ", ".join(f'"{w}"' for w in waiting) + ">>",
        "/\\ running = <<" + ", ".join(f'"{r}"' for r in running) + ">>",
    ]
    if free is not None:
        lines.append(f"/\\ free = {free}")
    for h, p in phases:
        lines.append(f'/\\ {h} = "{p}"')
    return "\n".join(lines)


def to_networkx(exp: Exploration) -> nx.MultiDiGraph:
    """MC-42: nodes are explored states (attributes: label, depth, drained, initial); edges are
    transitions (action, outcome, cooperative, progress, zero_time).  Transitions that raised an
    internal error or hit the state bound have no target and are left out."""
    g = nx.MultiDiGraph(name=exp.scenario.name)
    actions = exp.scenario.actions
    for n in range(exp.num_states):
        g.add_node(n, label=node_label(exp, n), depth=exp.depth[n], drained=exp.drained[n], initial=(n == 0))
    for i, e in enumerate(exp.edges):
        if e.dst < 0:
            continue
        a = actions[e.action]
        g.add_edge(e.src, e.dst, key=i, action=a.name, kind=a.kind, outcome=e.outcome.label,
                   cooperative=a.cooperative, progress=e.outcome.progress, zero_time=e.outcome.zero_time)
    return g


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def to_dot(g: nx.MultiDiGraph, title: Optional[str] = None) -> str:
    """MC-42: DOT in the shape of TLC's ``-dump dot,actionlabels`` (the initial state filled)."""
    out = [f'digraph "{_dot_escape(title or g.graph.get("name", "states"))}" {{', "nodesep=0.35;",
           'node [shape=box, fontname="monospace", fontsize=9];', 'edge [fontname="monospace", fontsize=8];']
    for n, d in g.nodes(data=True):
        style = ', style=filled, fillcolor="lightgrey"' if d.get("initial") else ""
        out.append(f'{n} [label="{_dot_escape(str(d.get("label", n)))}"{style}];')
    for u, v, d in g.edges(data=True):
        color = "black" if d.get("cooperative", True) else "red"
        label = d.get("action", "")
        out.append(f'{u} -> {v} [label="{_dot_escape(str(label))}", color="{color}", fontcolor="{color}"];')
    out.append("}")
    return "\n".join(out) + "\n"


def to_mermaid(g: nx.MultiDiGraph, state_diagram: bool = False) -> str:
    """MC-42: a Mermaid ``flowchart`` (state graphs) or ``stateDiagram-v2`` (quotient graphs)."""
    if state_diagram:
        lines = ["stateDiagram-v2"]
        ids = {n: f"s{i}" for i, n in enumerate(g.nodes)}
        for n in g.nodes:
            lines.append(f'    state "{n}" as {ids[n]}')
        for n, d in g.nodes(data=True):
            if d.get("initial"):
                lines.append(f"    [*] --> {ids[n]}")
        for u, v, d in g.edges(data=True):
            lines.append(f"    {ids[u]} --> {ids[v]}: {d.get('label', d.get('action', ''))}")
        return "\n".join(lines) + "\n"
    lines = ["flowchart TD"]
    for n, d in g.nodes(data=True):
        text = str(d.get("label", n)).replace('"', "'").replace("\n", "<br/>")
        lines.append(f'    n{n}["{text}"]')
    for u, v, d in g.edges(data=True):
        arrow = "-->" if d.get("cooperative", True) else "-.->"
        label = str(d.get("action", "")).replace('"', "'").replace("|", "/")
        lines.append(f'    n{u} {arrow}|"{label}"| n{v}')
    return "\n".join(lines) + "\n"


def write_graphml(g: nx.MultiDiGraph, path) -> None:
    nx.write_graphml(g, str(path))


def to_node_link(g: nx.MultiDiGraph) -> dict:
    return nx.node_link_data(g, edges="links")


def from_node_link(data: dict) -> nx.MultiDiGraph:
    return nx.node_link_graph(data, edges="links")


# ---------------------------------------------------------------------------------------------
# Quotient graphs (MC-45)
# ---------------------------------------------------------------------------------------------


def handoff_keys(exp: Exploration) -> List[str]:
    """The names the quotient can project on: handoff ids (and plain request ids)."""
    return [h for h, _p in exp.views[0][0]]


def quotient(exp: Exploration, handoff: str, *, self_loops: bool = False) -> nx.MultiDiGraph:
    """MC-45: project every state onto ``handoff``'s lifecycle phase.

    Nodes are phases; there is one edge per (phase, action kind, outcome class, phase) that some
    explored transition realises, with ``count`` transitions.  Projected self-loops are dropped
    unless asked for.  The initial phase is marked ``initial``."""
    pos = handoff_keys(exp).index(handoff)
    actions = exp.scenario.actions
    g = nx.MultiDiGraph(name=f"{exp.scenario.name}:{handoff}")
    phase_of = [exp.views[n][0][pos][1] for n in range(exp.num_states)]
    for n in range(exp.num_states):
        if phase_of[n] not in g:
            g.add_node(phase_of[n], initial=False, states=0)
        g.nodes[phase_of[n]]["states"] += 1
    g.nodes[phase_of[0]]["initial"] = True
    seen: Dict[Tuple[str, str, str], int] = {}
    for e in exp.edges:
        if e.dst < 0:
            continue
        a, b = phase_of[e.src], phase_of[e.dst]
        if a == b and not self_loops:
            continue
        a_spec = actions[e.action]
        kind = a_spec.kind
        if a_spec.handoff not in (None, handoff) or (kind in ("submit",) and a_spec.owner != handoff):
            kind = f"{kind}(other)"
        label = kind if a_spec.cooperative else f"{kind} [adv]"
        k = (a, b, label)
        if k in seen:
            g.edges[a, b, seen[k]]["count"] += 1
        else:
            seen[k] = g.add_edge(a, b, label=label, action=label, count=1, cooperative=a_spec.cooperative)
    return g


def quotient_to_dot(g: nx.MultiDiGraph) -> str:
    out = [f'digraph "{_dot_escape(g.graph.get("name", "quotient"))}" {{', "rankdir=LR;",
           'node [shape=ellipse, fontname="sans-serif", fontsize=10];', 'edge [fontsize=8];']
    for n, d in g.nodes(data=True):
        style = ", style=filled" if d.get("initial") else ""
        out.append(f'"{_dot_escape(n)}" [label="{_dot_escape(n)}"{style}];')
    for u, v, d in g.edges(data=True):
        color = "black" if d.get("cooperative", True) else "red"
        out.append(f'"{_dot_escape(u)}" -> "{_dot_escape(v)}" [label="{_dot_escape(d["label"])}", color="{color}"];')
    out.append("}")
    return "\n".join(out) + "\n"
