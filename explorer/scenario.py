"""Scenario files: the finite universe a model-checking run explores (spec/scenarios.md, SCN-n).

A scenario names one engine core (its engine arguments), a finite universe of
requests and handoffs, the action alphabet (each action cooperative or
adversarial), the checks to run and the bounds of the search.  Files are JSON
(``.json``) or TOML (``.toml``); both decode to the same object, validated here
with the rules of ``spec/scenario.schema.json`` (the loader does not need a
JSON-Schema library; the schema file documents the same shape and the tests
check that the two agree on the library).

Everything in this module is pure except :func:`load_scenario`, which reads a file.
"""

from __future__ import annotations

import json
import pathlib
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs

from model.core import new_core
from model.engine_args import EngineArgs, engine_args_from_json
from model.errors import ModelError
from model.protocol import DirectRequest
from model.rustlib import fields_once, no_json_constant
from model.testing import claim_bucket


class ScenarioError(ModelError):
    """SCN-1: the scenario file is not valid (the CLI exits with status 2)."""

    rule = "SCN-1"


#: SCN-4: the command and driver actions an alphabet may contain
ACTION_KINDS = (
    "pass",
    "retry",
    "submit",
    "submit_prefill",
    "reserve",
    "activate",
    "release",
    "cancel_source",
    "cancel_destination",
)

#: SCN-5: guards an action may carry (evaluated on the core before the action fires)
GUARDS = (
    "always",
    "source_pending",
    "source_held",
    "destination_pending",
    "destination_reserved",
    "destination_active",
)

ROLES = ("plain", "source", "destination")

#: SCN-7: the checks a scenario can switch on or off (all on by default)
CHECKS = (
    "invariants",
    "fifo_order",
    "drained_pool_free",
    "transitions",
    "deadlock",
    "livelock",
    "starvation",
)

VIOLATION_KINDS = (
    "invariant",
    "fifo_order",
    "drained_pool_free",
    "rejected_changed_state",
    "time_went_backwards",
    "progress_without_change",
    "internal_error",
    "deadlock",
    "livelock",
    "starvation",
    "unreachable_goal",
    "avoidable_goal",
    "forbidden_state",
)

#: SCN-10: the phases a goal may name, per role (MC-41; the views of explorer.properties)
GOAL_PHASES = {
    "plain": ("unissued", "waiting", "waiting(fresh)", "running", "preempted", "done"),
    "source": ("S_unissued", "S_pending", "S_held", "S_detached", "S_absent"),
    "destination": ("D_unissued", "D_pending", "D_pending(tried)", "D_reserved", "D_active",
                    "D_active(waiting)", "D_active(waiting(fresh))", "D_active(running)",
                    "D_active(preempted)", "D_absent"),
}


@attrs.frozen
class Goal:
    """SCN-10..SCN-12: a condition on a state -- every named request in its phase (and, when
    ``drained`` is set, a drained core or not) -- that a ``sometimes`` goal asks some path to reach
    (MC-34; with ``cooperative_only``, by cooperative actions alone), an ``eventually`` goal every
    fair cooperative run (MC-35), and a ``never`` goal no path (MC-36)."""

    name: str
    #: (index of the request in the universe, its id, the phase it must be in)
    phases: Tuple[Tuple[int, str, str], ...]
    drained: Optional[bool] = None
    cooperative_only: bool = False

    def describe(self) -> str:
        parts = [f"{r} at {ph}" for _i, r, ph in self.phases]
        if self.drained is not None:
            parts.append("a drained core" if self.drained else "a core that is not drained")
        return ", ".join(parts)


@attrs.frozen
class RequestSpec:
    """SCN-3: one request of the universe."""

    id: str
    role: str  # plain / source / destination
    tokens: Tuple[int, ...]
    max_output_tokens: int
    handoff: Optional[str] = None
    allow_destination_admission: bool = True

    def direct(self, request_id: Optional[str] = None) -> DirectRequest:
        return DirectRequest(self.tokens, self.max_output_tokens, request_id or self.id)


@attrs.frozen
class ActionSpec:
    """SCN-4: one letter of the action alphabet.

    ``once`` actions fire at most once per path (the driver remembers it issued
    them); the others may repeat.  ``guard`` names a predicate on the core that
    must hold for the action to be enabled (SCN-5).
    """

    name: str
    kind: str
    cooperative: bool
    once: bool = False
    guard: str = "always"
    handoff: Optional[str] = None
    request: Optional[DirectRequest] = None
    allow_destination_admission: bool = True
    #: the universe request this action belongs to (symmetry classes, SCN-8)
    owner: Optional[str] = None
    #: written out in the scenario's ``actions`` list (its owner is then not interchangeable)
    explicit: bool = False


@attrs.frozen
class Expectation:
    """SCN-9: what the scenario's test expects (``clean`` or a violation kind)."""

    verdict: str = "clean"  # clean / violation / unreachable
    kind: Optional[str] = None
    max_steps: Optional[int] = None
    defect: Optional[str] = None


@attrs.frozen
class Scenario:
    """SCN-2: a validated scenario."""

    name: str
    description: str
    engine: Dict[str, Any]
    args: EngineArgs
    requests: Tuple[RequestSpec, ...]
    actions: Tuple[ActionSpec, ...]
    checks: Tuple[str, ...]
    max_states: int
    max_depth: int
    now_ms: float
    symmetry: bool
    expect: Expectation
    path: Optional[str] = None
    #: SCN-10: reachability goals, in file order
    sometimes: Tuple[Goal, ...] = ()
    #: SCN-11: goals every fair cooperative run reaches, in file order
    eventually: Tuple[Goal, ...] = ()
    #: SCN-12: states no path may reach, in file order
    never: Tuple[Goal, ...] = ()
    #: the decoded file, kept so counterexample tests can embed the scenario (MC-46)
    raw: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def engine_type(self) -> str:
        return self.args.engine_type.value

    def action(self, name: str) -> ActionSpec:
        for a in self.actions:
            if a.name == name:
                return a
        raise KeyError(name)

    def handoffs(self) -> Tuple[Tuple[str, str], ...]:
        """Every (handoff id, side) pair of the universe, side ``source`` or ``destination``."""
        out = []
        for r in self.requests:
            if r.handoff is not None:
                out.append((r.handoff, r.role))
        for a in self.actions:
            if a.handoff is not None and a.kind in ("reserve", "submit_prefill"):
                side = "destination" if a.kind == "reserve" else "source"
                if (a.handoff, side) not in out:
                    out.append((a.handoff, side))
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# Tokens (SCN-3)
# ---------------------------------------------------------------------------------------------


#: SCN-3: the longest prompt a scenario request may have; each request's private tokens and each
#: segment name get a token range of this size, so a longer prompt would run into the next one
MAX_PROMPT_TOKENS = 100_000


#: SCN-3: private prompts take (index + 1) * 1,000,000 onwards, so at most this many requests keep
#: below the segment range, which starts at 2,100,000,000 (20,000 names of 100,000 tokens each)
MAX_REQUESTS = 2_099
_SEGMENT_BUCKETS = 20_000


def _segment_base(name: str, claimed: Optional[Dict[str, int]] = None) -> int:
    """SCN-3: the first token of a segment name: its crc32 bucket, or, among the names of one
    scenario (``claimed``), the next free one, so different names never share a token."""
    if claimed is None:
        bucket = zlib.crc32(name.encode("utf-8")) % _SEGMENT_BUCKETS
    else:
        try:
            bucket = claim_bucket(name, claimed, _SEGMENT_BUCKETS)
        except ValueError as exc:
            raise ScenarioError(f"segments: {exc}") from None
    return 2_100_000_000 + bucket * 100_000


def request_tokens(index: int, spec: Mapping[str, Any], where: str,
                   segment_bases: Optional[Dict[str, int]] = None) -> Tuple[int, ...]:
    """SCN-3: a request's prompt: explicit ``tokens``, named ``segments`` (equal names give equal
    tokens across requests: prefix sharing; ``segment_bases`` keeps a scenario's names apart), or
    ``prompt_len`` tokens unique to the request."""
    given = [k for k in ("tokens", "segments", "prompt_len") if k in spec]
    if len(given) != 1:
        raise ScenarioError(f"{where}: give exactly one of tokens, segments, prompt_len (got {given or 'none'})")
    if "tokens" in spec:
        toks = spec["tokens"]
        if not isinstance(toks, list) or not all(_is_int(t) and 0 <= t < 2**32 for t in toks):
            raise ScenarioError(f"{where}: tokens must be a list of u32 integers")
        return tuple(toks)
    if "segments" in spec:
        segs = spec["segments"]
        out: List[int] = []
        if not isinstance(segs, list) or not segs:
            raise ScenarioError(f"{where}: segments must be a non-empty list of [name, length] pairs")
        for seg in segs:
            if (not isinstance(seg, list) or len(seg) != 2 or not isinstance(seg[0], str)
                    or not _is_int(seg[1]) or seg[1] < 1):
                raise ScenarioError(f"{where}: a segment is [name, length >= 1], got {seg!r}")
            if len(out) + seg[1] > MAX_PROMPT_TOKENS:
                raise ScenarioError(f"{where}: segments={segs!r}: the prompt may have at most "
                                    f"{MAX_PROMPT_TOKENS} tokens")
            base = _segment_base(seg[0], segment_bases)
            out.extend(base + j for j in range(seg[1]))
        return tuple(out)
    n = spec["prompt_len"]
    if index >= MAX_REQUESTS:
        raise ScenarioError(f"{where}: a scenario may issue at most {MAX_REQUESTS} requests")
    if not _is_int(n) or n < 0:
        raise ScenarioError(f"{where}: prompt_len must be an integer >= 0")
    if n > MAX_PROMPT_TOKENS:
        raise ScenarioError(f"{where}: prompt_len={n}: at most {MAX_PROMPT_TOKENS} tokens")
    base = (index + 1) * 1_000_000
    return tuple(base + j for j in range(n))


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

_TOP_KEYS = {"$schema", "name", "description", "engine", "requests", "adversarial", "actions", "checks",
             "bounds", "now_ms", "symmetry", "expect", "sometimes", "eventually", "never"}
_REQ_KEYS = {"id", "role", "handoff", "tokens", "segments", "prompt_len", "max_output_tokens",
             "allow_destination_admission"}
_ACTION_KEYS = {"name", "kind", "handoff", "request", "cooperative", "once", "guard",
                "allow_destination_admission"}
#: SCN-6 adversarial flags, in a fixed order (validation reports the first bad one; generators draw them in turn)
ADVERSARIAL_FLAGS = ("cancel", "out_of_order", "reuse_ids", "unknown_ids")


def _check_keys(obj: Mapping[str, Any], allowed, where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {unknown}")


def _objects(raw: List[Any], field: str, allowed):
    """SCN-1: each item of the list ``raw`` (the scenario's ``field``) with its location, after
    checking that it is an object with known keys only."""
    for i, item in enumerate(raw):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{where} must be an object")
        _check_keys(item, allowed, where)
        yield where, item


def _new_name(obj: Mapping[str, Any], key: str, where: str, seen: set, what: str) -> str:
    """SCN-1: ``obj[key]``, a non-empty string not in ``seen`` (which it joins)."""
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}.{key} must be a non-empty string")
    if value in seen:
        raise ScenarioError(f"{where}: duplicate {what} {value!r}")
    seen.add(value)
    return value


def _is_int(v) -> bool:
    """A JSON integer: Python's bool is an int, JSON's true and false are not (the schema's "integer")."""
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(obj, key, default, where):
    v = obj.get(key, default)
    if not isinstance(v, bool):
        raise ScenarioError(f"{where}.{key} must be true or false")
    return v


def scenario_from_dict(obj: Any, *, path: Optional[str] = None) -> Scenario:
    """SCN-2..SCN-12: validate a decoded scenario and build its action alphabet."""
    if not isinstance(obj, Mapping):
        raise ScenarioError("a scenario is a JSON/TOML object")
    _check_keys(obj, _TOP_KEYS, "scenario")
    if "$schema" in obj and not isinstance(obj["$schema"], str):
        raise ScenarioError("scenario.$schema must be a string (a reference to the JSON Schema; it is not read)")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError("scenario.name must be a non-empty string")
    engine = obj.get("engine")
    if not isinstance(engine, Mapping):
        raise ScenarioError("scenario.engine must be an engine-args object (spec/engine-args.md)")
    try:
        args = engine_args_from_json(dict(engine))
        new_core(args)  # a core the model cannot build (an SGLang pool beyond POOL-1's bound) is bad input
    except ModelError as err:
        raise ScenarioError(f"scenario.engine: {err}") from err

    # SCN-3: requests
    raw_reqs = obj.get("requests", [])
    if not isinstance(raw_reqs, list):
        raise ScenarioError("scenario.requests must be a list")
    requests: List[RequestSpec] = []
    seen_ids: set = set()
    segment_bases: Dict[str, int] = {}  # SCN-3: this scenario's segment names, kept apart
    seen_handoffs = set()
    for i, (where, r) in enumerate(_objects(raw_reqs, "requests", _REQ_KEYS)):
        rid = _new_name(r, "id", where, seen_ids, "request id")
        role = r.get("role", "plain")
        if role not in ROLES:
            raise ScenarioError(f"{where}.role must be one of {ROLES}")
        handoff = r.get("handoff")
        if role == "plain":
            if handoff is not None:
                raise ScenarioError(f"{where}: a plain request has no handoff")
        else:
            if not isinstance(handoff, str) or not handoff:
                raise ScenarioError(f"{where}: a {role} request needs a handoff id")
            if (handoff, role) in seen_handoffs:
                raise ScenarioError(f"{where}: handoff {handoff!r} already has a {role}")
            seen_handoffs.add((handoff, role))
        mot = r.get("max_output_tokens")
        if not _is_int(mot) or mot < 0:
            raise ScenarioError(f"{where}.max_output_tokens must be an integer >= 0")
        requests.append(
            RequestSpec(rid, role, request_tokens(i, r, where, segment_bases), mot, handoff,
                        _bool(r, "allow_destination_admission", True, where))
        )

    actions: List[ActionSpec] = [
        ActionSpec("pass", "pass", True),
        ActionSpec("retry", "retry", True),
    ]
    # SCN-4: the cooperative driver of every request
    for r in requests:
        if r.role == "plain":
            actions.append(ActionSpec(f"submit({r.id})", "submit", True, once=True, request=r.direct(), owner=r.id))
        elif r.role == "source":
            actions.append(ActionSpec(f"submit_prefill({r.handoff},{r.id})", "submit_prefill", True, once=True,
                                      handoff=r.handoff, request=r.direct(), owner=r.id))
            actions.append(ActionSpec(f"release({r.handoff})", "release", True, once=True, guard="source_held",
                                      handoff=r.handoff, owner=r.id))
        else:
            actions.append(ActionSpec(f"reserve({r.handoff},{r.id})", "reserve", True, once=True,
                                      handoff=r.handoff, request=r.direct(),
                                      allow_destination_admission=r.allow_destination_admission, owner=r.id))
            actions.append(ActionSpec(f"activate({r.handoff})", "activate", True, once=True,
                                      guard="destination_reserved", handoff=r.handoff, owner=r.id))

    # SCN-6: generated adversarial actions
    adv = obj.get("adversarial", {})
    if not isinstance(adv, Mapping):
        raise ScenarioError("scenario.adversarial must be an object")
    _check_keys(adv, ADVERSARIAL_FLAGS, "adversarial")
    for k in ADVERSARIAL_FLAGS:
        _bool(adv, k, False, "adversarial")
    for r in requests:
        if r.role == "plain":
            continue
        h = r.handoff
        if adv.get("cancel"):
            kind = "cancel_source" if r.role == "source" else "cancel_destination"
            actions.append(ActionSpec(f"{kind}({h})", kind, False, handoff=h, owner=r.id))
        if adv.get("out_of_order"):
            kind = "release" if r.role == "source" else "activate"
            actions.append(ActionSpec(f"early_{kind}({h})", kind, False, handoff=h, owner=r.id))
        if adv.get("reuse_ids"):
            kind = "submit_prefill" if r.role == "source" else "reserve"
            rid2 = r.id + "'"
            actions.append(ActionSpec(f"{kind}({h},{rid2})", kind, False, once=True, handoff=h,
                                      request=r.direct(rid2), allow_destination_admission=r.allow_destination_admission,
                                      owner=r.id))
    if adv.get("unknown_ids"):
        for kind in ("activate", "release", "cancel_source", "cancel_destination"):
            actions.append(ActionSpec(f"{kind}(unknown)", kind, False, handoff="unknown"))

    # SCN-4: explicit extra actions
    raw_actions = obj.get("actions", [])
    if not isinstance(raw_actions, list):
        raise ScenarioError("scenario.actions must be a list")
    by_id = {r.id: r for r in requests}
    for i, a in enumerate(raw_actions):
        where = f"actions[{i}]"
        if not isinstance(a, Mapping):
            raise ScenarioError(f"{where} must be an object")
        _check_keys(a, _ACTION_KEYS, where)
        kind = a.get("kind")
        if kind not in ACTION_KINDS:
            raise ScenarioError(f"{where}.kind must be one of {ACTION_KINDS}")
        guard = a.get("guard", "always")
        if guard not in GUARDS:
            raise ScenarioError(f"{where}.guard must be one of {GUARDS}")
        handoff = a.get("handoff")
        request = None
        owner = None
        if kind in ("submit", "submit_prefill", "reserve"):
            req = a.get("request")
            if isinstance(req, str):
                if req not in by_id:
                    raise ScenarioError(f"{where}.request names unknown request {req!r}")
                request = by_id[req].direct()
                owner = req
            elif isinstance(req, Mapping):
                _check_keys(req, {"id", "like", "tokens", "segments", "prompt_len", "max_output_tokens"},
                            f"{where}.request")
                rid = req.get("id")
                if not isinstance(rid, str) or not rid:
                    raise ScenarioError(f"{where}.request.id must be a non-empty string")
                like = req.get("like")
                if like is not None:
                    given = [k for k in ("tokens", "segments", "prompt_len") if k in req]
                    if given:
                        raise ScenarioError(f"{where}.request: like takes its prompt from {like!r}; "
                                            f"drop {given[0]}")
                    if not isinstance(like, str) or like not in by_id:  # a list would not even hash
                        raise ScenarioError(f"{where}.request.like names unknown request {like!r}")
                    base = by_id[like]
                    toks = base.tokens
                    mot = req.get("max_output_tokens", base.max_output_tokens)
                    owner = like
                else:
                    toks = request_tokens(len(requests) + i, req, f"{where}.request", segment_bases)
                    mot = req.get("max_output_tokens")
                if not _is_int(mot) or mot < 0:
                    raise ScenarioError(f"{where}.request.max_output_tokens must be an integer >= 0")
                request = DirectRequest(toks, mot, rid)
            else:
                raise ScenarioError(f"{where}.request must name a request or describe one")
        elif "request" in a:
            raise ScenarioError(f"{where}.request: a {kind} action issues no request")
        if kind not in ("pass", "retry", "submit") and not isinstance(handoff, str):
            raise ScenarioError(f"{where}: a {kind} action needs a handoff id")
        if kind in ("pass", "retry", "submit") and handoff is not None:
            raise ScenarioError(f"{where}.handoff: a {kind} action takes no handoff id")
        cooperative = _bool(a, "cooperative", False, where)
        default_once = kind in ("submit", "submit_prefill", "reserve")
        nm = a.get("name") or _default_name(kind, handoff, request)
        if any(x.name == nm for x in actions):
            raise ScenarioError(f"{where}: duplicate action name {nm!r}")
        actions.append(ActionSpec(nm, kind, cooperative, once=_bool(a, "once", default_once, where), guard=guard,
                                  handoff=handoff, request=request,
                                  allow_destination_admission=_bool(a, "allow_destination_admission", True, where),
                                  owner=owner, explicit=True))

    # SCN-7: checks
    checks = obj.get("checks", {})
    if not isinstance(checks, Mapping):
        raise ScenarioError("scenario.checks must be an object")
    _check_keys(checks, CHECKS, "checks")
    enabled = tuple(c for c in CHECKS if _bool(checks, c, True, "checks"))

    bounds = obj.get("bounds", {})
    if not isinstance(bounds, Mapping):
        raise ScenarioError("scenario.bounds must be an object")
    _check_keys(bounds, {"max_states", "max_depth"}, "bounds")
    max_states = bounds.get("max_states", 200_000)
    max_depth = bounds.get("max_depth", 10_000)
    for k, v in (("max_states", max_states), ("max_depth", max_depth)):
        if not _is_int(v) or v < 1:
            raise ScenarioError(f"bounds.{k} must be an integer >= 1")
    now_ms = obj.get("now_ms", 0.0)
    if not isinstance(now_ms, (int, float)) or isinstance(now_ms, bool) or now_ms < 0:
        raise ScenarioError("now_ms must be a number >= 0")

    raw_expect = obj.get("expect", {"verdict": "clean"})
    if not isinstance(raw_expect, Mapping):
        raise ScenarioError("scenario.expect must be an object")
    _check_keys(raw_expect, {"verdict", "kind", "max_steps", "defect"}, "expect")
    verdict = raw_expect.get("verdict", "clean")
    if verdict not in ("clean", "violation", "unreachable"):
        raise ScenarioError("expect.verdict must be clean, violation or unreachable")
    kind = raw_expect.get("kind")
    if kind is not None and kind not in VIOLATION_KINDS:
        raise ScenarioError(f"expect.kind must be one of {VIOLATION_KINDS}")
    if verdict in ("violation", "unreachable") and kind is None:
        raise ScenarioError(f"expect.kind is required when expect.verdict is {verdict}")
    if verdict == "clean" and kind is not None:
        raise ScenarioError("expect.kind is only for the violation and unreachable verdicts")
    max_steps = raw_expect.get("max_steps")
    if max_steps is not None and (not _is_int(max_steps) or max_steps < 0):
        raise ScenarioError("expect.max_steps must be an integer >= 0")
    defect = raw_expect.get("defect")
    if defect is not None and not isinstance(defect, str):
        raise ScenarioError("expect.defect must be a string")
    desc = obj.get("description", "")
    if not isinstance(desc, str):
        raise ScenarioError("scenario.description must be a string")
    sometimes = _goals(obj.get("sometimes", []), requests, "sometimes")
    eventually = _goals(obj.get("eventually", []), requests, "eventually")
    never = _goals(obj.get("never", []), requests, "never")
    return Scenario(
        name=name,
        description=desc,
        engine=dict(engine),
        args=args,
        requests=tuple(requests),
        actions=tuple(actions),
        checks=enabled,
        max_states=max_states,
        max_depth=max_depth,
        now_ms=float(now_ms),
        symmetry=_bool(obj, "symmetry", False, "scenario"),
        expect=Expectation(verdict, kind, max_steps, defect),
        path=path,
        raw=json.loads(json.dumps(obj)),
        sometimes=sometimes,
        eventually=eventually,
        never=never,
    )


def _goals(raw: Any, requests: Sequence[RequestSpec], field: str) -> Tuple[Goal, ...]:
    """SCN-10..SCN-12: validate the ``sometimes``, ``eventually`` or ``never`` list against the
    universe (``cooperative_only`` belongs to ``sometimes``: an eventually goal is about cooperative
    runs, and a forbidden state is forbidden whoever reaches it)."""
    if not isinstance(raw, list):
        raise ScenarioError(f"scenario.{field} must be a list")
    index = {r.id: i for i, r in enumerate(requests)}
    out: List[Goal] = []
    names: set = set()
    keys = {"name", "phases", "drained", "cooperative_only"} if field == "sometimes" else {"name", "phases", "drained"}
    for where, g in _objects(raw, field, keys):
        name = _new_name(g, "name", where, names, "goal name")
        phases = g.get("phases", {})
        if not isinstance(phases, Mapping):
            raise ScenarioError(f"{where}.phases must be an object mapping request ids to phases")
        conds = []
        for rid, ph in phases.items():
            if rid not in index:
                raise ScenarioError(f"{where}.phases names unknown request {rid!r}")
            allowed = GOAL_PHASES[requests[index[rid]].role]
            if ph not in allowed:
                raise ScenarioError(f"{where}.phases.{rid} must be one of {allowed} (a {requests[index[rid]].role} "
                                    f"request), got {ph!r}")
            conds.append((index[rid], rid, ph))
        drained = g.get("drained")
        if drained is not None and not isinstance(drained, bool):
            raise ScenarioError(f"{where}.drained must be true or false")
        if not conds and drained is None:
            raise ScenarioError(f"{where} needs a condition: phases or drained")
        out.append(Goal(name, tuple(conds), drained, _bool(g, "cooperative_only", False, where)))
    return tuple(out)


def _default_name(kind: str, handoff: Optional[str], request: Optional[DirectRequest]) -> str:
    parts = [p for p in (handoff, None if request is None else request.uuid.value) if p is not None]
    return f"{kind}({','.join(parts)})" if parts else kind


def load_scenario(path) -> Scenario:
    """SCN-1: read a ``.json`` or ``.toml`` scenario file; :class:`ScenarioError` if it is invalid."""
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(f"cannot read {p}: {err}") from err
    except UnicodeDecodeError:
        raise ScenarioError(f"cannot read {p}: not UTF-8") from None
    try:
        if p.suffix == ".toml":
            try:
                import tomllib
            except ImportError as err:  # Python 3.10
                raise ScenarioError("TOML scenarios need Python 3.11 (tomllib); use JSON") from err
            obj = tomllib.loads(text)  # TOML itself refuses a key given twice
        else:
            # SCN-1: a key given twice is refused (json would keep the last one without a word),
            # and so are NaN and Infinity, which are not JSON
            obj = json.loads(text, parse_constant=no_json_constant, object_pairs_hook=fields_once(
                lambda k: ScenarioError(f"{p.name}: key {k!r} is given twice in one object")))
    except ScenarioError:
        raise
    except ValueError as err:
        raise ScenarioError(f"{p.name}: not valid {p.suffix.lstrip('.') or 'JSON'}: {err}") from err
    return scenario_from_dict(obj, path=str(p))
