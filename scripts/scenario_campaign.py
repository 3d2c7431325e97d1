#!/usr/bin/env python3
"""Explore many random small scenarios and group what the explorer finds, for triage.

    python scripts/scenario_campaign.py [--seed S] [--count N] [--max-states M] [--by-shape] [--minimize]
                                        [--out DIR]

Each scenario is a pure function of ``(seed, index)``: a vLLM or SGLang core with a small pool
(block size 1-16, a pool between half and all of what the requests' prompts need, plus up to three
blocks), 1-3 requests (plain, handoff source, handoff destination; private prompts or a shared
leading segment), random ``max_num_seqs`` / ``max_num_batched_tokens`` / chunked prefill / prefix
caching, and random adversarial flags (SCN-6). Every scenario is explored with all checks on
(``explorer.explore``, bounded by ``--max-states``).

Findings are grouped by *(property, engine, cooperative or adversarial)*. A finding is
*cooperative* when the scenario shows it with its adversarial flags removed (that twin is explored
too, and is what the group keeps), *adversarial* when it needs adversarial actions. ``--by-shape``
splits each group further by the *shape* of the state the counterexample stops in (:func:`shape_of`:
the phases of its requests and handoffs without their names, whether the queues are empty, whether
the pool is exhausted, and the invariant's name), so that two defects of one property found in one
family are both kept instead of only the shorter. A deadlock group gets the replay's dead-end
diagnosis of the state its shortest counterexample stops in (``cause``, spec/replay.md LIVE-6), which
names S6, S9's retraction or S8's half-prefilled head when the state is one of them.
``--minimize`` then shrinks each group's kept scenario (:func:`minimize`: fewer requests, engine
options and adversarial flags, shorter prompts and outputs, a smaller pool, while the group's
property still fails in a state of the same shape and in no more steps, so that shrinking cannot
slide into a different, trivial defect such as a request larger than the pool), diagnoses the shrunk
deadlock again, and records which of its requests show the property on their own (``alone``: empty
for a defect of the requests' interaction; a request listed there fails even by itself). Per
group the
script prints how many scenarios showed it and keeps the one with the shortest counterexample. With
``--out`` it writes that scenario as ``<group>.json`` (loadable by ``mocker-spec explore``) and a
``summary.json`` of every group. A group is not a verdict: most adversarial deadlocks are a
reservation the adversary made and the cooperative driver never activates. Triage each group's
scenario by hand against spec/model-checking.md section 6.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import sys
from typing import Any, Dict

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explorer import ScenarioError, explore, scenario_from_dict  # noqa: E402
from explorer.outputs import deadlock_diagnosis, step_names  # noqa: E402
from explorer.search import graph_of  # noqa: E402
from explorer.scenario import ADVERSARIAL_FLAGS  # noqa: E402


def random_scenario(seed: int, index: int, max_states: int) -> Dict[str, Any]:
    """Scenario ``index`` of family ``seed`` (a dict in the scenario file format, SCN-2)."""
    rng = random.Random(f"campaign-{seed}-{index}")
    engine = rng.choice(["vllm", "vllm", "sglang"])
    bs = rng.choice([4, 8, 16] if engine == "vllm" else [1, 4, 8, 16])
    requests = []
    handoffs = 0
    blocks_needed = 0
    for k in range(rng.randint(1, 3)):
        role = rng.choice(["plain", "source", "destination", "destination"])
        req: Dict[str, Any] = {"id": f"R{k}", "role": role, "max_output_tokens": rng.randint(1, 3)}
        if rng.random() < 0.3:  # a shared leading segment (SCN-3) then a private tail
            req["segments"] = [[rng.choice(["a", "b"]), bs * rng.randint(1, 2)], [f"p{k}", rng.randint(1, 2 * bs)]]
            length = sum(n for _name, n in req["segments"])
        else:
            length = req["prompt_len"] = rng.randint(1, 3 * bs)
        blocks_needed += -(-length // bs) + 1
        if role != "plain":
            handoffs += 1
            req["handoff"] = f"h{handoffs}"
            if role == "destination" and rng.random() < 0.3:
                req["allow_destination_admission"] = False
        requests.append(req)
    args: Dict[str, Any] = {"engine_type": engine, "block_size": bs,
                            "num_gpu_blocks": rng.randint(max(2, blocks_needed // 2), blocks_needed + 3)}
    if rng.random() < 0.4:
        args["max_num_seqs"] = rng.randint(1, 3)
    if rng.random() < 0.4:
        args["max_num_batched_tokens"] = rng.choice([8, 16, 32, 64, 2048])
    if engine == "vllm" and rng.random() < 0.3:
        args["enable_chunked_prefill"] = False
    if rng.random() < 0.3:
        args["enable_prefix_caching"] = False
    if engine == "sglang" and rng.random() < 0.5:
        # a constant new-token ratio keeps SGLang graphs small (spec/model-checking.md MC-2)
        args["sglang"] = {"schedule_conservativeness": 0.0}
    adversarial = {flag: True for flag in ADVERSARIAL_FLAGS if rng.random() < 0.35}
    return {"name": f"campaign-{seed}-{index}", "engine": args, "requests": requests,
            "adversarial": adversarial, "bounds": {"max_states": max_states}}


#: phases of requests and handoffs that are not (or no longer) in the core: left out of a shape
SETTLED_PHASES = frozenset({"unissued", "done", "S_unissued", "S_absent", "D_unissued", "D_absent"})


def shape_of(exploration, v) -> str:
    """The shape of the state ``v`` stops in (the cycle's entry for a lasso): the live phases of the
    scenario's requests and handoffs as a sorted multiset (names and settled phases dropped, so
    renamed or padded copies of one defect share a shape), then which queues hold requests and
    whether the pool is exhausted; an invariant violation also names its invariant."""
    phases, waiting, running, free = graph_of(v, exploration).views[v.node]
    parts = ["+".join(sorted(p for _name, p in phases if p not in SETTLED_PHASES)) or "nothing live"]
    parts.append("&".join(q for q, held in (("waiting", waiting), ("running", running)) if held) or "idle")
    if free is not None:
        # below 0 on SGLang, where the metric counts running requests' decode reservations (SG-6)
        parts.append("pool exhausted" if free <= 0 else "pool free")
    if v.kind == "invariant":
        parts.insert(0, v.name)
    return " | ".join(parts)


#: engine arguments a minimized scenario may lose (the core falls back to its defaults)
OPTIONAL_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                        "enable_prefix_caching", "sglang")


def _smaller(raw: Dict[str, Any]):
    """Every scenario one reduction step smaller than ``raw``, most drastic first (may be invalid)."""
    reqs = raw["requests"]
    if len(reqs) > 1:
        for k in range(len(reqs)):
            yield dict(raw, requests=reqs[:k] + reqs[k + 1:])
    for key in OPTIONAL_ENGINE_ARGS:
        if key in raw["engine"]:
            yield dict(raw, engine={k: v for k, v in raw["engine"].items() if k != key})
    flags = raw.get("adversarial", {})
    if len(flags) > 1:  # an adversarial finding keeps at least one flag (its mode does not change)
        for flag in flags:
            yield dict(raw, adversarial={f: v for f, v in flags.items() if f != flag})
    blocks = raw["engine"]["num_gpu_blocks"]
    for n in dict.fromkeys((blocks // 2, blocks - 1)):
        if n >= 1:
            yield dict(raw, engine=dict(raw["engine"], num_gpu_blocks=n))
    for k, req in enumerate(reqs):
        variants = []
        if "segments" in req:
            plain = {f: v for f, v in req.items() if f != "segments"}
            variants.append(dict(plain, prompt_len=sum(n for _name, n in req["segments"])))
        if "allow_destination_admission" in req:
            variants.append({f: v for f, v in req.items() if f != "allow_destination_admission"})
        for field in ("prompt_len", "max_output_tokens"):
            if field in req:
                for n in dict.fromkeys((req[field] // 2, req[field] - 1)):
                    if n >= 1:
                        variants.append(dict(req, **{field: n}))
        for v in variants:
            yield dict(raw, requests=reqs[:k] + [v] + reqs[k + 1:])


def _shows(raw: Dict[str, Any], kind: str, shape: str | None, max_steps: int | None = None):
    """The exploration of ``raw`` if it is valid and shows a ``kind`` violation (of ``shape``, in at
    most ``max_steps`` steps)."""
    try:
        exp = explore(scenario_from_dict(raw))
    except ScenarioError:
        return None
    v = exp.violation(kind)
    if v is None or (shape is not None and shape_of(exp, v) != shape) or (
            max_steps is not None and v.length > max_steps):
        return None
    return exp


def minimize(raw: Dict[str, Any], kind: str, shape: str | None = None):
    """Greedy shrinking: take the first smaller scenario (:func:`_smaller`) that is valid and still
    shows a ``kind`` violation, stopping in a state of ``shape`` when one is given, with a
    counterexample no longer than before (dropping a constant SGLang ratio would otherwise trade a
    few steps for 600 passes of ratio decay), until none does. Returns the scenario and its
    exploration; no single step smaller shows the same."""
    best = _shows(raw, kind, shape)
    assert best is not None, (raw["name"], kind, shape)
    while True:
        for cand in _smaller(raw):
            exp = _shows(cand, kind, shape, best.violation(kind).length)
            if exp is not None:
                raw, best = cand, exp
                break
        else:
            return raw, best


def alone(raw: Dict[str, Any], kind: str):
    """The ids of ``raw``'s requests that show a ``kind`` violation in a scenario of their own."""
    return [r["id"] for r in raw["requests"] if _shows(dict(raw, requests=[r]), kind, None) is not None]


def group_name(kind: str, engine: str, mode: str, shape: str | None) -> str:
    """``kind-engine-mode``, with ``--by-shape`` followed by eight hex digits of the shape's SHA-1."""
    name = f"{kind}-{engine}-{mode}"
    if shape is not None:
        name += "-" + hashlib.sha1(shape.encode()).hexdigest()[:8]
    return name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="scenario family (default 1)")
    ap.add_argument("--count", type=int, default=100, help="scenarios to explore (default 100)")
    ap.add_argument("--max-states", type=int, default=20_000, help="state bound per scenario (default 20000)")
    ap.add_argument("--by-shape", action="store_true",
                    help="split each group by the shape of the state its counterexample stops in")
    ap.add_argument("--minimize", action="store_true",
                    help="shrink each group's kept scenario while its property still fails in the same shape")
    ap.add_argument("--out", help="directory for each group's shortest scenario and summary.json")
    a = ap.parse_args(argv)
    for name in ("count", "max_states"):
        if getattr(a, name) < 1:
            print(f"scenario_campaign: --{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}",
                  file=sys.stderr)
            return 2
    out = pathlib.Path(a.out) if a.out else None
    if out is not None:
        from mocker_spec.messages import output_dir_problem

        problem = output_dir_problem(a.out)
        if problem:
            print(f"scenario_campaign: --out {out}: {problem}", file=sys.stderr)
            return 2

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    groups: Dict[str, Dict[str, Any]] = {}
    incomplete = 0
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("exploring", total=a.count)
        for index in range(a.count):
            raw = random_scenario(a.seed, index, a.max_states)
            try:
                exp = explore(scenario_from_dict(raw))
            except ScenarioError as err:  # a generator bug: say which scenario and stop
                print(f"scenario_campaign: scenario {index} of seed {a.seed} is invalid: {err}", file=sys.stderr)
                return 1
            incomplete += not exp.complete
            twin = twin_exp = None
            if raw["adversarial"] and exp.violations:
                # which findings need the adversary: explore the same scenario without its flags
                twin = dict(raw, adversarial={}, name=raw["name"] + "-cooperative")
                twin_exp = explore(scenario_from_dict(twin))
            for kind in sorted({v.kind for v in exp.violations}):
                src, found = raw, exp
                if not raw["adversarial"] or twin_exp.violation(kind) is not None:
                    mode = "cooperative"
                    if twin_exp is not None:
                        src, found = twin, twin_exp
                else:
                    mode = "adversarial"
                v = found.violation(kind)
                shape = shape_of(found, v)
                name = group_name(kind, raw["engine"]["engine_type"], mode, shape if a.by_shape else None)
                g = groups.setdefault(name, {"scenarios": 0, "steps": None})
                g["scenarios"] += 1
                if g["steps"] is None or v.length < g["steps"]:
                    g.update(steps=v.length, scenario=src, message=v.message, shape=shape,
                             counterexample=step_names(found, v))
                    if kind == "deadlock" and not a.minimize:  # --minimize diagnoses the shrunk scenario
                        g["cause"] = deadlock_diagnosis(found, v).cause
            progress.advance(task)

    if a.minimize:
        groups = _minimized(groups)
    table = Table(title=f"seed {a.seed}: {a.count} scenarios, {incomplete} hit the state bound")
    for col in ("group", "scenarios", "shortest counterexample", "cause") + (("shape",) if a.by_shape else ()):
        table.add_column(col)
    for name in sorted(groups):
        g = groups[name]
        table.add_row(name, str(g["scenarios"]), f"{g['steps']} steps", g.get("cause", ""),
                      *((g["shape"],) if a.by_shape else ()))
    wide = Console(width=None if sys.stdout.isatty() else 200)  # a piped table keeps whole shapes
    wide.print(table if groups else f"seed {a.seed}: {a.count} scenarios, no violation")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, g in groups.items():
            (out / f"{name}.json").write_text(json.dumps(g["scenario"], indent=1) + "\n")
        summary = {"seed": a.seed, "count": a.count, "max_states": a.max_states, "by_shape": a.by_shape,
                   "minimized": a.minimize,
                   "incomplete": incomplete,
                   "groups": {n: {k: g[k] for k in ("scenarios", "steps", "shape", "message", "counterexample",
                                                    "alone", "cause") if k in g}
                              for n, g in sorted(groups.items())}}
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def _minimized(groups: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Each group's kept scenario shrunk (:func:`minimize`, keeping its shape), with the ids of the
    requests that show the property alone; the counts and names stay."""
    out: Dict[str, Dict[str, Any]] = {}
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("minimizing", total=len(groups))
        for name, g in sorted(groups.items()):
            kind = name.split("-")[0]
            raw, exp = minimize(g["scenario"], kind, g["shape"])
            v = exp.violation(kind)
            out[name] = dict(g, steps=v.length, scenario=raw, message=v.message,
                             counterexample=step_names(exp, v), alone=alone(raw, kind))
            if kind == "deadlock":
                out[name]["cause"] = deadlock_diagnosis(exp, v).cause
            progress.advance(task)
    return out


if __name__ == "__main__":
    sys.exit(main())
