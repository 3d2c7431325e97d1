"""Oracle test kit: Hypothesis strategies, a lockstep state machine and a pytest fixture (HARN-n).

For test use only (spec/oracle-kit.md §3, docs/oracle-kit.md).  Importing this module imports
neither Hypothesis nor pytest; they are loaded on first use:

* strategies (HARN-1..HARN-3): :func:`engine_args`, :func:`requests`, :func:`commands`,
  :func:`operations`, :func:`op_sequences`, :func:`traces` -- all produce the JSON shapes of a
  step trace (spec/step-trace.md), so what they draw can be written to a trace file as is;
* :class:`EngineAdapter` (HARN-4): the two methods an engine under test provides;
  :class:`ModelAdapter` is the model behind that interface;
* ``OracleMachine`` (HARN-5..HARN-7): a ``RuleBasedStateMachine`` base that runs the model and an
  adapter in lockstep and compares their effects after every step; a mismatch raises
  :class:`OracleMismatch`, which Hypothesis shrinks and which carries the counterexample as a
  step trace that ``mocker-spec check`` replays;
* :func:`oracle_machine` builds a machine class for an adapter; the ``oracle_harness`` pytest
  fixture (HARN-8) runs one.

The tests drive a second, independently written adapter through this interface: the plain
handoff engine of ``tests/plain_kernel.py`` (HARN-9), with deliberately injected bugs the machine
must catch (HARN-10).

The model stays pure: adapters and the machine are mutable by nature, but the model's cores
inside :class:`ModelAdapter` are the usual frozen values, replaced after every step.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: HARN-2: the default universe of ids (small, so that ids collide and get reused)
REQUEST_IDS = ("r0", "r1", "r2", "r3", "r4")
HANDOFF_IDS = ("h0", "h1", "h2", "h3")
ENGINES = ("vllm", "trtllm", "sglang")
#: HARN-5: the waits a pass may add to the lockstep clock (ms)
PASS_WAITS = (0.0, 0.0, 1.0, 25.0)


def _st():
    from hypothesis import strategies as st

    return st


def _steptrace():
    from mocker_spec import steptrace

    return steptrace


# ---------------------------------------------------------------------------------------------
# strategies (HARN-1..HARN-3)
# ---------------------------------------------------------------------------------------------


def _valid_engine_args(obj: Mapping[str, Any]) -> bool:
    from .engine_args import engine_args_from_json
    from .errors import InvalidInput

    try:
        engine_args_from_json(dict(obj))
    except InvalidInput:
        return False
    return True


def engine_args(engines: Sequence[str] = ENGINES, roles: Sequence[str] = ("aggregated", "prefill", "decode"),
                prefix_caching: Optional[bool] = None, max_blocks: int = 24):
    """HARN-1: small engine-args JSON objects (``--extra-engine-args`` form) that build a valid core.

    Small KV pools (1..``max_blocks`` blocks of 1..16 tokens) and slot limits make admission,
    preemption and pending destinations happen within a few steps.  ``prefix_caching`` pins
    ``enable_prefix_caching``; None draws it."""
    st = _st()

    @st.composite
    def build(draw):
        engine = draw(st.sampled_from(tuple(engines)))
        obj: Dict[str, Any] = {"engine_type": engine, "worker_type": draw(st.sampled_from(tuple(roles)))}
        sizes = (1, 2, 4, 8) if engine == "sglang" else (2, 4, 8, 16)
        obj["block_size"] = draw(st.sampled_from(sizes))
        obj["num_gpu_blocks"] = draw(st.integers(1, max_blocks))
        obj["max_num_seqs"] = draw(st.sampled_from((None, 1, 2, 4, 256)))
        obj["max_num_batched_tokens"] = draw(st.sampled_from((None, 8, 32, 8192)))
        obj["enable_prefix_caching"] = draw(st.booleans()) if prefix_caching is None else prefix_caching
        if engine != "sglang":
            obj["enable_chunked_prefill"] = draw(st.booleans())
        if draw(st.booleans()):
            obj["speedup_ratio"] = draw(st.sampled_from((0.5, 2.0)))
        if engine == "vllm" and draw(st.booleans()):
            obj["preemption_mode"] = "fifo"
        if draw(st.booleans()):
            obj["kv_bytes_per_token"] = draw(st.sampled_from((1, 1024)))
            obj["kv_transfer_bandwidth"] = draw(st.sampled_from((0.0, 1.5)))
        if engine == "sglang":
            sg: Dict[str, Any] = {"schedule_conservativeness": draw(st.sampled_from((0.0, 1.0)))}
            if draw(st.booleans()):
                sg["chunked_prefill_size"] = obj["block_size"] * draw(st.sampled_from((4, 8)))
            if draw(st.booleans()):
                sg["schedule_policy"] = draw(st.sampled_from(("fifo", "lpm")))
            obj["sglang"] = sg
        return obj

    return build().filter(_valid_engine_args)


_PRIVATE_BUCKETS = 4000


def _private_base(request_id: str) -> int:
    return 1_000_000 + (zlib.crc32(request_id.encode("utf-8")) % _PRIVATE_BUCKETS) * 1000


def claim_bucket(name: str, claimed: Dict[str, int], buckets: int) -> int:
    """The bucket of ``name`` among ``buckets``: its crc32 bucket, or, when a name claimed earlier
    (``claimed``, filled in first-appearance order) holds it, the next free one; so no two names
    of one set share a bucket. ``ValueError`` once every bucket is taken. Used for the harness's
    private prompts (HARN-2) and the scenarios' segment names (SCN-3)."""
    if name in claimed:
        return claimed[name]
    used = set(claimed.values())
    if len(used) >= buckets:
        raise ValueError(f"at most {buckets} names")
    bucket = zlib.crc32(name.encode("utf-8")) % buckets
    while bucket in used:
        bucket = (bucket + 1) % buckets
    claimed[name] = bucket
    return bucket


def private_bases(ids: Sequence[str]) -> Dict[str, int]:
    """HARN-2: the first private token of each id of a universe (:func:`claim_bucket`), so that no
    two ids of one universe share a private token (up to 4,000 ids)."""
    claimed: Dict[str, int] = {}
    return {rid: 1_000_000 + claim_bucket(rid, claimed, _PRIVATE_BUCKETS) * 1000 for rid in ids}


def prompt_lengths(max_prompt: int) -> Tuple[int, ...]:
    """HARN-2: the prompt lengths drawn: 0, 1 and fractions of ``max_prompt``, so that requests
    of one run fit a small pool alone but not together."""
    return tuple(sorted({0, 1, max_prompt // 4, max_prompt // 3, max_prompt // 2, (2 * max_prompt) // 3,
                         (3 * max_prompt) // 4, max_prompt}))


def make_request(uuid: str, length: int, max_output_tokens: int, segments: Sequence[int] = (),
                 prompts: str = "shared", base: Optional[int] = None) -> Dict[str, Any]:
    """HARN-2: the request object with id ``uuid``: ``length`` tokens, the shared ``segments``
    (8 tokens each, from a pool of three) first unless ``prompts`` is ``"private"``, then tokens
    private to the id, from ``base`` (by default the id's own bucket; :func:`private_bases` gives
    the bases of a universe, no two alike)."""
    base = _private_base(uuid) if base is None else base
    private = [base + i for i in range(length)]
    if prompts == "private":
        tokens = private
    else:
        shared: List[int] = []
        for seg in segments:
            shared.extend(7_000_000 + seg * 100 + i for i in range(8))
        tokens = (shared + private)[:length]
    return {"uuid": uuid, "tokens": tokens, "max_output_tokens": max_output_tokens}


def requests(ids: Sequence[str] = REQUEST_IDS, max_prompt: int = 40, max_output: int = 4,
             prompts: str = "shared"):
    """HARN-2: request objects of a step trace over a small id universe (:func:`make_request`).

    ``prompts="private"``: a request's tokens are a function of its id and length only (two ids
    never share a block).  ``"shared"``: a prompt starts with segments drawn from a small common
    pool, so prefix caching and cache hits happen."""
    st = _st()
    lengths = prompt_lengths(max_prompt)
    bases = private_bases(ids)

    @st.composite
    def build(draw):
        uuid = draw(st.sampled_from(tuple(ids)))
        n = draw(st.sampled_from(lengths))
        segs = () if prompts == "private" else draw(st.lists(st.sampled_from((0, 1, 2)), max_size=3))
        return make_request(uuid, n, draw(st.integers(0, max_output)), segs, prompts, bases[uuid])

    return build()


def commands(request_ids: Sequence[str] = REQUEST_IDS, handoff_ids: Sequence[str] = HANDOFF_IDS,
             prompts: str = "shared", max_prompt: int = 40, max_output: int = 4):
    """HARN-3: one of the seven commands as a step object (``op`` and its inputs); reservations
    sometimes come with ``allow_destination_admission: false``."""
    st = _st()
    reqs = requests(request_ids, max_prompt, max_output, prompts)
    hs = st.sampled_from(tuple(handoff_ids))

    @st.composite
    def reserve(draw):
        op = {"op": "reserve_destination", "handoff_id": draw(hs), "request": draw(reqs)}
        if draw(st.integers(0, 3)) == 0:
            op["allow_destination_admission"] = False
        return op

    return st.one_of(
        st.builds(lambda r: {"op": "submit", "request": r}, reqs),
        st.builds(lambda h, r: {"op": "submit_prefill", "handoff_id": h, "request": r}, hs, reqs),
        reserve(),
        *(st.builds(lambda h, op=op: {"op": op, "handoff_id": h}, hs)
          for op in ("release_source", "cancel_source", "activate_destination", "cancel_destination")),
    )


def operations(request_ids: Sequence[str] = REQUEST_IDS, handoff_ids: Sequence[str] = HANDOFF_IDS,
               prompts: str = "shared", ops: Sequence[str] = ("command", "pass", "hidden_pass", "retry")):
    """HARN-3: one operation; a pass has ``now_ms: None`` (the recorder's clock, STEP-19) and
    passes are drawn as often as commands, so requests get scheduled and finish."""
    st = _st()
    choices = []
    if "command" in ops:
        choices.append(commands(request_ids, handoff_ids, prompts))
    if "pass" in ops:
        choices.append(st.just({"op": "pass", "now_ms": None}))
        choices.append(st.just({"op": "pass", "now_ms": None}))
    if "hidden_pass" in ops:
        choices.append(st.just({"op": "hidden_pass", "now_ms": None}))
    if "retry" in ops:
        choices.append(st.just({"op": "retry"}))
    return st.one_of(*choices)


def op_sequences(min_size: int = 1, max_size: int = 40, **kw):
    """HARN-3: lists of operations (see :func:`operations`)."""
    return _st().lists(operations(**kw), min_size=min_size, max_size=max_size)


def traces(engines: Sequence[str] = ENGINES, min_steps: int = 1, max_steps: int = 40, **kw):
    """HARN-3: ``(engine args, operations)`` pairs: a whole step trace minus its effects, ready
    for :func:`mocker_spec.steptrace.record`."""
    st = _st()
    return st.tuples(engine_args(engines), op_sequences(min_steps, max_steps, **kw))


# ---------------------------------------------------------------------------------------------
# adapters (HARN-4)
# ---------------------------------------------------------------------------------------------


class EngineAdapter:
    """HARN-4: what an engine under test provides to the harness.

    ``start(header)`` resets the engine to an empty core built from a step-trace header
    (engine args, worker role, dp rank, KV-event capture); ``step(op)`` runs one step object and
    returns the effects it observed, in the step-trace shapes.  An adapter may leave out any
    effect it does not observe (it is then not compared) and lists the operations it can run in
    ``supported_ops`` (the machine draws no other)."""

    name = "engine"
    supported_ops: Tuple[str, ...] = (
        "submit", "submit_prefill", "release_source", "cancel_source", "reserve_destination",
        "activate_destination", "cancel_destination", "pass", "hidden_pass", "retry",
    )

    def start(self, header: Mapping[str, Any]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, op: Mapping[str, Any]) -> Dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError


class ModelAdapter(EngineAdapter):
    """HARN-4: the model behind the adapter interface (the lockstep reference, and an adapter
    in its own right: the model must agree with itself through the trace encoding)."""

    name = "model"

    def __init__(self) -> None:
        self.core = None
        self.steps = 0
        self.header = None

    def start(self, header: Mapping[str, Any]) -> None:
        S = _steptrace()
        self.header = S.parse_header(dict(header), 1)
        self.core = S.new_model_core(self.header)
        self.steps = 0

    def step(self, op: Mapping[str, Any]) -> Dict[str, Any]:
        S = _steptrace()
        if self.core is None:
            raise RuntimeError("the model core has ended (an earlier step panicked) or was never started")
        self.steps += 1
        obj = {"step": self.steps, **{k: v for k, v in op.items() if k not in ("step", "effects")}}
        step = S.parse_step(obj, self.steps + 1, self.steps)
        self.core, effects = S.run_step(self.core, step)
        return effects


# ---------------------------------------------------------------------------------------------
# the lockstep machine (HARN-5..HARN-7)
# ---------------------------------------------------------------------------------------------


class OracleMismatch(AssertionError):
    """HARN-6: the engine's effects differ from the model's at ``step``.

    ``ops`` are the steps run so far (the counterexample, shrunk by Hypothesis when raised from
    a machine); ``trace`` is the counterexample as step-trace objects carrying the *engine's*
    effects, so ``mocker-spec check`` on it reports the same divergence."""

    def __init__(self, engine: str, header: Mapping[str, Any], ops: List[Dict[str, Any]],
                 observed: List[Dict[str, Any]], mismatch, crash: Optional[str] = None) -> None:
        self.engine = engine
        self.header = dict(header)
        self.ops = [dict(o) for o in ops]
        self.observed = [dict(e) for e in observed]
        self.mismatch = mismatch
        self.step = len(ops)
        S = _steptrace()
        self.trace = [dict(self.header)] + [
            {"step": i, **op, "effects": eff} for i, (op, eff) in enumerate(zip(self.ops, self.observed), start=1)
        ]
        what = crash or (f"field {mismatch.field}: expected {mismatch.expected!r}, observed {mismatch.observed!r}")
        text = (f"engine {engine!r} diverges from the model at step {self.step} of {len(self.ops)} "
                f"({self.ops[-1].get('op')}): {what}\n"
                "counterexample (step trace; `mocker-spec check` replays it):\n" + S.dumps_trace(self.trace))
        super().__init__(text)


def _compare_step(engine, header, ops, observed, expected, rel_tol) -> Optional[OracleMismatch]:
    """HARN-6: run the last of ``ops`` on ``engine``, record what it observed, compare with the
    model's ``expected`` effects; the mismatch (or the engine's crash) or None."""
    S = _steptrace()
    name = getattr(engine, "name", "engine")
    try:
        got = engine.step(dict(ops[-1]))
    except Exception as exc:  # a crash of the engine under test is a divergence too
        observed.append({"error": f"crash: {type(exc).__name__}"})
        return OracleMismatch(name, header, ops, observed, None,
                              crash=f"the engine raised {type(exc).__name__}: {exc}")
    observed.append(dict(got))
    mismatch = S.compare_effects(expected, got, rel_tol)
    if mismatch is not None:
        return OracleMismatch(name, header, ops, observed, mismatch)
    return None


def lockstep(adapter_factory: Callable[[], EngineAdapter], header: Mapping[str, Any],
             ops: Sequence[Mapping[str, Any]], rel_tol: float = 0.0) -> Optional[OracleMismatch]:
    """HARN-6: run ``ops`` on the model and a fresh ``adapter_factory()`` in lockstep; the first
    divergence as an :class:`OracleMismatch` (its ``ops`` end at the diverging step), or None."""
    model = ModelAdapter()
    engine = adapter_factory()
    model.start(header)
    engine.start(header)
    done: List[Dict[str, Any]] = []
    observed: List[Dict[str, Any]] = []
    for op in ops:
        expected = model.step(op)
        done.append(dict(op))
        err = _compare_step(engine, header, done, observed, expected, rel_tol)
        if err is not None:
            return err
        if expected.get("error") == "InternalInvariantBroken":
            return None
    return None


def minimize(adapter_factory: Callable[[], EngineAdapter], header: Mapping[str, Any],
             ops: Sequence[Mapping[str, Any]], rel_tol: float = 0.0) -> Optional[OracleMismatch]:
    """HARN-6: greedy step deletion on a diverging run: drop any single step whose removal keeps
    some divergence, until no step can go (a 1-minimal counterexample); None if ``ops`` does not
    diverge at all."""
    best = lockstep(adapter_factory, header, ops, rel_tol)
    if best is None:
        return None
    current = best.ops
    changed = True
    while changed:
        changed = False
        for i in range(len(current) - 1, -1, -1):
            candidate = current[:i] + current[i + 1:]
            if not candidate:
                continue
            err = lockstep(adapter_factory, header, candidate, rel_tol)
            if err is not None:
                best, current, changed = err, err.ops, True
                break
    return best


def _is_final_run() -> bool:
    try:
        from hypothesis.control import current_build_context

        return bool(current_build_context().is_final)
    except Exception:  # outside a Hypothesis run
        return False


def _build_machine_class():
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

    class OracleMachine(RuleBasedStateMachine):
        """HARN-5: drives the model and ``adapter_factory()`` in lockstep.

        Class attributes configure a subclass: ``adapter_factory`` (required), ``engine_args``
        (a strategy of engine-args objects; default :func:`engine_args`), ``request_ids``,
        ``handoff_ids``, ``prompts`` (``"shared"`` or ``"private"``), ``max_prompt``, ``op_weights``, ``rel_tol`` (float
        comparison, default exact) and ``capture_kv_events`` (default true)."""

        adapter_factory: Optional[Callable[[], EngineAdapter]] = None
        engine_args = None
        request_ids: Tuple[str, ...] = REQUEST_IDS
        handoff_ids: Tuple[str, ...] = HANDOFF_IDS
        prompts = "shared"
        max_prompt = 40
        #: how often each operation kind is drawn (HARN-5); kinds the adapter cannot run are skipped
        op_weights: Dict[str, int] = {
            "reserve_destination": 3, "activate_destination": 2, "cancel_destination": 2, "submit": 2,
            "submit_prefill": 2, "release_source": 1, "cancel_source": 1, "pass": 3, "hidden_pass": 1, "retry": 2,
        }
        #: HARN-5: half the time name live handoffs and free request ids (deeper runs, weaker shrinking)
        bias_live = True
        rel_tol = 0.0
        capture_kv_events = True

        def __init__(self) -> None:
            super().__init__()
            if type(self).adapter_factory is None:
                raise TypeError("an OracleMachine subclass must set adapter_factory")
            self.reference = ModelAdapter()
            self.engine = type(self).adapter_factory()
            self.header: Optional[Dict[str, Any]] = None
            self.ops: List[Dict[str, Any]] = []
            self.observed: List[Dict[str, Any]] = []
            self.clock = 0.0
            self.ended = False

        # -- configuration helpers ------------------------------------------------------------

        @classmethod
        def _strategies(cls):
            cache = cls.__dict__.get("_strategy_cache")
            if cache is None:
                args = cls.engine_args if cls.engine_args is not None else engine_args()
                cache = (args,)
                cls._strategy_cache = cache
            return cache

        def _weighted_kinds(self) -> Tuple[str, ...]:
            cls = type(self)
            cache = cls.__dict__.get("_kinds_cache")
            if cache is None or cache[0] is not self.engine.__class__:
                kinds = []
                for op, w in cls.op_weights.items():
                    if self._supports(op):
                        kinds.extend([op] * int(w))
                cache = (self.engine.__class__, tuple(kinds))
                cls._kinds_cache = cache
            return cache[1]

        def _supports(self, op: str) -> bool:
            return op in getattr(self.engine, "supported_ops", EngineAdapter.supported_ops)

        def _live(self) -> bool:
            return self.header is not None and not self.ended

        # -- lockstep (HARN-6) -------------------------------------------------------------------

        def _step(self, op: Dict[str, Any]) -> None:
            expected = self.reference.step(op)
            if "end_ms" in expected:
                self.clock = max(self.clock, expected["end_ms"])
            self.ops.append(dict(op))
            err = _compare_step(self.engine, self.header, self.ops, self.observed, expected, type(self).rel_tol)
            if err is not None:
                if _is_final_run():
                    # HARN-6: Hypothesis has shrunk the run; drop every step the divergence does not need
                    err = minimize(type(self).adapter_factory, self.header, self.ops, type(self).rel_tol) or err
                raise err
            if expected.get("error") == "InternalInvariantBroken":
                self.ended = True  # STEP-8: a panic ends the trace

        # -- rules (HARN-5) ------------------------------------------------------------------------

        @initialize(data=st.data())
        def start(self, data):
            args = self._strategies()[0]
            S = _steptrace()
            self.header = S.make_header(data.draw(args, label="engine_args"),
                                        capture_kv_events=type(self).capture_kv_events,
                                        recorded_by=f"OracleMachine ({getattr(self.engine, 'name', 'engine')})")
            self.reference.start(self.header)
            self.engine.start(self.header)

        def _live_handoffs(self, side: str) -> List[str]:
            core = self.reference.core
            if core is None:
                return []
            led = core.ledger
            if side == "source":
                hs = list(led.source_holds.pending_by_handoff) + list(led.source_holds.held_by_handoff)
            else:
                hs = (list(led.pending_destinations.by_handoff) + list(led.destination_holds.by_handoff)
                      + list(led.active_destinations.by_handoff))
            return sorted({h.value for h in hs})

        def _free_request_ids(self) -> List[str]:
            from . import core as C
            from .ids import RequestId

            core = self.reference.core
            if core is None:
                return []
            return [r for r in type(self).request_ids
                    if C.request_status(core, RequestId(r)) is None and not core.ledger.owns_request(RequestId(r))]

        def _command(self, data, op: str) -> None:
            """HARN-5: one command.  Half the time a release, activation or cancel names a handoff
            that is live on the model (in the matching stage), and a new request takes an id the
            model does not own, so that runs reach deep handoff states; otherwise ids come from
            the whole universe (unknown, reused and colliding ids)."""
            cls = type(self)
            step: Dict[str, Any] = {"op": op}
            side = "destination" if op in ("reserve_destination", "activate_destination", "cancel_destination") \
                else "source"
            if op != "submit":
                live = self._live_handoffs(side) if cls.bias_live and op not in ("submit_prefill",
                                                                                "reserve_destination") else []
                if live and data.draw(st.booleans(), label="live handoff"):
                    step["handoff_id"] = data.draw(st.sampled_from(live), label="handoff_id")
                else:
                    step["handoff_id"] = data.draw(st.sampled_from(tuple(cls.handoff_ids)), label="handoff_id")
            if op in ("submit", "submit_prefill", "reserve_destination"):
                free = self._free_request_ids() if cls.bias_live else []
                if free and data.draw(st.booleans(), label="free id"):
                    uuid = data.draw(st.sampled_from(free), label="uuid")
                else:
                    uuid = data.draw(st.sampled_from(tuple(cls.request_ids)), label="uuid")
                n = data.draw(st.sampled_from(prompt_lengths(cls.max_prompt)), label="prompt length")
                segs = () if cls.prompts == "private" else data.draw(
                    st.lists(st.sampled_from((0, 1, 2)), max_size=3), label="segments")
                step["request"] = make_request(uuid, n, data.draw(st.integers(0, 4), label="max_output_tokens"),
                                               segs, cls.prompts, private_bases(cls.request_ids)[uuid])
            if op == "reserve_destination" and not data.draw(st.booleans(), label="allow_destination_admission"):
                step["allow_destination_admission"] = False
            self._step(step)

        @precondition(lambda self: self._live())
        @rule(data=st.data())
        def step(self, data):
            """HARN-5: draw one operation kind by ``op_weights`` among those the adapter runs."""
            kinds = self._weighted_kinds()
            op = data.draw(st.sampled_from(kinds), label="op")
            if op in ("pass", "hidden_pass"):
                wait = data.draw(st.sampled_from(PASS_WAITS), label="wait_ms")
                self._step({"op": op, "now_ms": self.clock + wait})
            elif op == "retry":
                self._step({"op": "retry"})
            else:
                self._command(data, op)

    return OracleMachine


@functools.lru_cache(maxsize=None)
def _machine_class():
    return _build_machine_class()


def oracle_machine(adapter_factory: Callable[[], EngineAdapter], *, name: Optional[str] = None, **config):
    """HARN-7: an ``OracleMachine`` subclass for ``adapter_factory`` (``config``: the class
    attributes listed on ``OracleMachine``)."""
    base = _machine_class()
    attrs_ = {"adapter_factory": staticmethod(adapter_factory), **config}
    return type(name or "OracleMachineFor" + getattr(adapter_factory, "__name__", "Engine"), (base,), attrs_)


def run_oracle(adapter_factory: Callable[[], EngineAdapter], *, max_examples: int = 100, steps: int = 30,
               settings=None, shrink: bool = True, **config) -> None:
    """HARN-7: run the lockstep machine for ``adapter_factory``; raises :class:`OracleMismatch`
    when the engine diverges.  Derandomized, without example database or explain phase, so CI
    runs are repeatable.  ``shrink=False`` skips Hypothesis's shrink phase: the counterexample is
    then reduced by step deletion alone (HARN-6), which is much faster and keeps the drawn
    values as they were."""
    from hypothesis import HealthCheck, Phase
    from hypothesis import settings as hsettings
    from hypothesis.stateful import run_state_machine_as_test

    machine = oracle_machine(adapter_factory, **config)
    if settings is None:
        phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())
        settings = hsettings(max_examples=max_examples, stateful_step_count=steps, deadline=None, database=None,
                             derandomize=True, suppress_health_check=list(HealthCheck), phases=phases)
    run_state_machine_as_test(machine, settings=settings)


@functools.lru_cache(maxsize=None)
def _fixture():
    import pytest

    @pytest.fixture
    def oracle_harness():
        """HARN-8: a function ``run(adapter_factory, **options)`` that runs the lockstep machine
        (:func:`run_oracle`) and fails the test with the shrunk counterexample."""
        return run_oracle

    return oracle_harness


def __getattr__(name: str):
    """``OracleMachine`` and the ``oracle_harness`` fixture are built on first access, so that
    importing this module needs neither Hypothesis nor pytest."""
    if name == "OracleMachine":
        return _machine_class()
    if name == "oracle_harness":
        return _fixture()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
