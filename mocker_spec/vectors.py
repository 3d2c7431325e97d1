"""Conformance vectors: a deterministic corpus of step traces with the model's effects (VEC-n).

Two families (spec/oracle-kit.md §2):

* explorer vectors (VEC-2..VEC-5): every scenario of the library, retargeted to each engine, is
  explored (``explorer.explore``, read-only, bounded by ``max_states``); the vectors are paths
  of the explored graph chosen so that every action enabled in every distinct phase of the
  scenario's handoffs is fired at least once from that phase;
* sequence vectors (VEC-6): long operation sequences drawn by the Hypothesis strategies of
  :mod:`model.testing` under a fixed seed.

Each vector is recorded on the model (``steptrace.record``), so its ``effects`` are what a
conforming engine must observe.  :func:`build_corpus` is a function of its arguments;
:func:`write_corpus` writes the files (all or nothing).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs

from . import steptrace as S

ENGINES = ("vllm", "trtllm", "sglang")
#: VEC-3: the per-scenario bound on explored states
DEFAULT_MAX_STATES = 1500
#: VEC-4: the longest explorer vector
MAX_VECTOR_STEPS = 40
#: VEC-6: sequence vectors per engine, their length range and the default seed
DEFAULT_SEQUENCES = 6
SEQUENCE_STEPS = (40, 120)
DEFAULT_SEED = 1
RECORDED_BY = "mocker-spec vectors (the model)"


def default_scenario_root() -> Path:
    return Path(__file__).resolve().parent.parent / "spec" / "scenarios"


def library(root: Path) -> List[Tuple[str, Dict[str, Any]]]:
    """VEC-2: ``(relative path, decoded scenario)`` of every ``.json`` scenario under ``root``, sorted.

    A file that is not a valid scenario for its own engine raises ``ValueError`` naming it (a
    scenario retargeted to another engine may still fail there: that is recorded per scenario)."""
    from explorer import ScenarioError, scenario_from_dict

    from .formats import read_input_file

    out = []
    for p in sorted(root.rglob("*.json")):
        rel = p.relative_to(root).as_posix()
        obj = read_input_file(p, parse_json=True, label=rel)  # InputFileError is a ValueError
        try:
            scenario_from_dict(obj, path=str(p))
        except ScenarioError as exc:
            raise ValueError(f"{rel}: {exc}") from None
        out.append((rel, obj))
    return out


def retarget(obj: Mapping[str, Any], engine: str) -> Dict[str, Any]:
    """VEC-2: the scenario with its core switched to ``engine``.

    SGLang sub-arguments are dropped for the vLLM-family engines; a scenario retargeted to SGLang
    without its own sub-arguments gets ``schedule_conservativeness: 0`` (as the SGLang library
    scenarios do), which pins the new-token ratio so that idle passes do not make new states."""
    out = json.loads(json.dumps(obj))
    out.pop("$schema", None)
    eng = dict(out["engine"])
    eng["engine_type"] = engine
    if engine != "sglang":
        eng.pop("sglang", None)
    elif "sglang" not in eng:
        eng["sglang"] = {"schedule_conservativeness": 0.0}
    out["engine"] = eng
    return out


def action_op(spec) -> Dict[str, Any]:
    """VEC-4: the step object of an explorer action (passes run at the recorder's clock)."""
    kind = spec.kind
    if kind == "pass":
        return {"op": "pass", "now_ms": None}
    if kind == "retry":
        return {"op": "retry"}
    op = {
        "submit": "submit",
        "submit_prefill": "submit_prefill",
        "reserve": "reserve_destination",
        "activate": "activate_destination",
        "release": "release_source",
        "cancel_source": "cancel_source",
        "cancel_destination": "cancel_destination",
    }[kind]
    out: Dict[str, Any] = {"op": op}
    if spec.handoff is not None and op != "submit":
        out["handoff_id"] = spec.handoff
    if spec.request is not None:
        out["request"] = S.encode_request(spec.request)
    if not spec.allow_destination_admission:
        out["allow_destination_admission"] = False
    return out


@attrs.frozen
class Coverage:
    """VEC-3: what one scenario's exploration asked for and what the chosen paths cover."""

    scenario: str
    engine: str
    states: int
    complete: bool
    phases: int
    pairs: int
    covered: int
    vectors: int
    error: Optional[str] = None


def cover_paths(exploration, max_steps: int = MAX_VECTOR_STEPS) -> Tuple[List[List[int]], int, int, int]:
    """VEC-3 / VEC-4: explored paths (edge indices) that fire every (phase, action) pair.

    A pair is a distinct phase of the scenario's handoffs and requests (the explorer's phase
    view, MC-40) and an action explored from some state in that phase.  Pairs are taken in BFS
    order; each uncovered pair starts a path: the shortest path to the shallowest state of its
    phase where the action was explored, the action, then, while the path is shorter than
    ``max_steps``, any explored action whose pair is still uncovered from the state reached.  An
    action with no explored successor (an internal error, or the state bound) ends a path.
    Returns ``(paths, phases, pairs, covered)``."""
    ex = exploration
    out_edges: Dict[int, List[int]] = {}
    for i, e in enumerate(ex.edges):
        out_edges.setdefault(e.src, []).append(i)
    phase = [v[0] for v in ex.views]
    first: Dict[Tuple[Any, int], int] = {}
    for node in range(ex.num_states):
        for ei in out_edges.get(node, ()):
            first.setdefault((phase[node], ex.edges[ei].action), ei)
    covered = set()
    paths: List[List[int]] = []
    for pair, ei in first.items():
        if pair in covered:
            continue
        path = ex.path_to(ex.edges[ei].src) + [ei]
        cur = ex.edges[ei].dst
        while cur >= 0 and len(path) < max_steps:
            nxt = None
            for cand in out_edges.get(cur, ()):
                if (phase[cur], ex.edges[cand].action) not in covered and \
                        all((phase[ex.edges[p].src], ex.edges[p].action) != (phase[cur], ex.edges[cand].action)
                            for p in path):
                    nxt = cand
                    break
            if nxt is None:
                break
            path.append(nxt)
            cur = ex.edges[nxt].dst
        for p in path:
            covered.add((phase[ex.edges[p].src], ex.edges[p].action))
        paths.append(path)
    return paths, len(set(phase)), len(first), len(covered & set(first))


def scenario_vectors(engine: str, rel: str, obj: Mapping[str, Any], max_states: int = DEFAULT_MAX_STATES,
                     max_steps: int = MAX_VECTOR_STEPS) -> Tuple[List[Tuple[str, List[Dict[str, Any]]]], Coverage]:
    """VEC-2..VEC-5: the explorer vectors of one library scenario on ``engine``."""
    from explorer import ScenarioError, explore, scenario_from_dict

    target = retarget(obj, engine)
    name = str(obj.get("name", rel))
    try:
        sc = scenario_from_dict(target)
    except ScenarioError as err:
        return [], Coverage(name, engine, 0, False, 0, 0, 0, 0, f"not valid on {engine}: {err}")
    ex = explore(attrs.evolve(sc, checks=()), max_states=max_states, symmetry=False)
    paths, phases, pairs, covered = cover_paths(ex, max_steps)
    vectors = []
    for k, path in enumerate(paths):
        specs = [sc.actions[ex.edges[e].action] for e in path]
        ops = []
        for spec in specs:
            op = action_op(spec)
            op["note"] = spec.name
            ops.append(op)
        vname = f"{engine}/scenarios/{name}/{k:04d}"
        header = S.make_header(target["engine"], capture_kv_events=True, recorded_by=RECORDED_BY, name=vname,
                               meta={"origin": "explorer", "scenario": name, "scenario_file": rel,
                                     "engine": engine, "explored_states": ex.num_states,
                                     "exploration_complete": ex.complete})
        vectors.append((f"{engine}/scenarios/{name}/{k:04d}.jsonl", S.record(header, ops)))
    return vectors, Coverage(name, engine, ex.num_states, ex.complete, phases, pairs, covered, len(vectors))


def draw_examples(strategy, seed: int, count: int) -> List[Any]:
    """VEC-6: ``count`` examples of a Hypothesis strategy, the same for the same seed (and
    Hypothesis version): the generate phase only, no example database."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    out: List[Any] = []

    @hseed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate], derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        out.append(example)

    collect()
    return out[:count]


def sequence_vectors(engine: str, seed: int = DEFAULT_SEED, count: int = DEFAULT_SEQUENCES,
                     steps: Tuple[int, int] = SEQUENCE_STEPS) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """VEC-6: ``count`` long Hypothesis-drawn sequences on ``engine`` (``model.testing.traces``)."""
    from model import testing as T

    examples = draw_examples(T.traces(engines=(engine,), min_steps=steps[0], max_steps=steps[1]), seed, count)
    out = []
    for i, (args, ops) in enumerate(examples):
        vname = f"{engine}/sequences/seed{seed}-{i:03d}"
        header = S.make_header(args, capture_kv_events=True, recorded_by=RECORDED_BY, name=vname,
                               meta={"origin": "hypothesis", "engine": engine, "seed": seed, "index": i})
        out.append((vname + ".jsonl", S.record(header, ops)))
    return out


@attrs.frozen
class Corpus:
    files: Dict[str, str]
    coverage: Tuple[Coverage, ...]
    engines: Tuple[str, ...]
    seed: int

    def manifest(self) -> Dict[str, Any]:
        return {
            "format": "mocker-spec/vectors",
            "model_version": S.MODEL_VERSION,
            "step_trace_format": S.FORMAT,
            "step_trace_version": S.VERSION,
            "engines": list(self.engines),
            "seed": self.seed,
            "vectors": sorted(p for p in self.files if p.endswith(".jsonl")),
            "coverage": [attrs.asdict(c) for c in self.coverage],
        }


def build_corpus(engines: Sequence[str] = ENGINES, *, scenario_root: Optional[Path] = None,
                 scenarios: Optional[Sequence[str]] = None, max_states: int = DEFAULT_MAX_STATES,
                 sequences: int = DEFAULT_SEQUENCES, seed: int = DEFAULT_SEED,
                 sequence_steps: Tuple[int, int] = SEQUENCE_STEPS, progress=None) -> Corpus:
    """VEC-1: the whole corpus in memory: ``{relative path: JSONL text}`` plus coverage figures.

    VEC-8: a function of the arguments, the library and the Hypothesis version (no clock, no
    unseeded randomness, ties broken by exploration order).

    ``scenarios`` keeps only library scenarios whose name is listed; ``progress(label)`` is
    called before each unit of work."""
    root = scenario_root or default_scenario_root()
    lib = library(root)
    if scenarios is not None:
        wanted = set(scenarios)
        lib = [(rel, obj) for rel, obj in lib if obj.get("name") in wanted]
    files: Dict[str, str] = {}
    cover: List[Coverage] = []
    for engine in engines:
        for rel, obj in lib:
            if progress is not None:
                progress(f"{engine}: {obj.get('name', rel)}")
            vecs, cov = scenario_vectors(engine, rel, obj, max_states)
            cover.append(cov)
            for path, objs in vecs:
                files[path] = S.dumps_trace(objs)
        if sequences > 0:
            if progress is not None:
                progress(f"{engine}: Hypothesis sequences")
            for path, objs in sequence_vectors(engine, seed, sequences, sequence_steps):
                files[path] = S.dumps_trace(objs)
    corpus = Corpus(files, tuple(cover), tuple(engines), seed)
    files["MANIFEST.json"] = json.dumps(corpus.manifest(), indent=1) + "\n"
    files["README.md"] = readme(corpus)
    return corpus


def readme(corpus: Corpus) -> str:
    """VEC-7: the corpus README (how an engine replays the vectors)."""
    n = sum(1 for p in corpus.files if p.endswith(".jsonl"))
    rows = "\n".join(
        f"| {c.engine} | {c.scenario} | {c.states}{'' if c.complete else ' (bounded)'} | {c.phases} | "
        f"{c.covered}/{c.pairs} | {c.vectors} |" + (f" {c.error}" if c.error else "")
        for c in corpus.coverage
    )
    return f"""# Conformance vectors for dynamo-mocker {S.MODEL_VERSION}

{n} step traces (format `{S.FORMAT}` version {S.VERSION}; spec/step-trace.md in the mocker-spec
repository) for the engines {", ".join(corpus.engines)}, written by `mocker-spec vectors` from the
executable model. Every step carries the effects the model produces; a conforming engine core
produces the same.

## Layout

- `<engine>/scenarios/<scenario>/<nnnn>.jsonl`: paths through the explored state graph of a
  library scenario, retargeted to the engine; together they fire every action from every
  distinct handoff phase the exploration reached (the table below).
- `<engine>/sequences/seed<seed>-<nnn>.jsonl`: long seeded random operation sequences.
- `MANIFEST.json`: the vector list and the coverage figures.

## Replaying a vector on an engine

1. Read the header (line 1). Build an empty engine core from `engine_args` (the
   `--extra-engine-args` JSON of the mocker), on data-parallel rank `dp_rank`, capturing KV
   events if `capture_kv_events` is true. `worker_role` repeats the engine args' worker type.
2. For each following line, in order, run the step's `op` on the core:
   - a command (`submit`, `submit_prefill`, `release_source`, `cancel_source`,
     `reserve_destination`, `activate_destination`, `cancel_destination`) with its `request`
     and/or `handoff_id`, through the command-effects entry point with
     `allow_destination_admission` (default true);
   - `pass` / `hidden_pass`: one scheduling pass at `now_ms`;
   - `retry`: the standalone pending-destination retry.
   A rejected command leaves the core as it was.
3. Compare what the engine observed with `effects`: the result (or the error kind), lifecycle
   events, admissions, output signals, `end_ms`, KV events, metrics, forward-pass metrics.
   Floats are written with full precision and compare exactly.

Or record your engine's own observations in the same format (same header and ops, your
`effects`) and let the model judge them: `mocker-spec check YOUR_TRACE.jsonl` prints `conforms`
or the first divergent step and field, with the model state at that point (exit 0 / 1; 2 for a
malformed trace). Fields you do not observe may be left out of `effects`; they are not compared.

## Coverage of the explorer vectors

| engine | scenario | explored states | distinct phases | (phase, action) pairs covered | vectors |
|---|---|---|---|---|---|
{rows}
"""


def write_corpus(out: Path, corpus: Corpus) -> int:
    """VEC-1: write every file under ``out`` (which must be absent or empty); all or nothing
    (:func:`explorer.files.publish`): the files go to a temporary sibling directory renamed to
    ``out`` at the end.  Returns the number of files written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    from explorer.files import publish

    publish(out, sorted(corpus.files.items()))  # staged beside out, renamed into place at the end
    return len(corpus.files)
