"""Engine arguments: the model's ``MockEngineArgs``.

Normative text: ``spec/engine-args.md`` (rules ARGS-1 .. ARGS-19).

:class:`EngineArgs` holds every argument that changes behaviour of the default
build (no ``kvbm-offload``, no AIC, no NPZ perf model).  Constructing one
applies upstream's normalisation (``materialize_defaults``) and validation, so
an ``EngineArgs`` value is always normalised: ``block_size`` is the effective
block size, never 0.

:func:`engine_args_from_json` reads the JSON object accepted by the mocker's
``--extra-engine-args`` file / ``MockEngineArgs.from_json`` (``dialect="json"``,
the default) or the keyword arguments of the Python constructor
``MockEngineArgs(**kwargs)`` (``dialect="kwargs"``; nested ``sglang`` /
``trtllm`` / ``reasoning`` values are then dicts of the nested constructor's
keyword arguments).  Every rejection is one :class:`InvalidInput` naming the
field and the value.
"""

from __future__ import annotations

import enum
import math
import os
from typing import Any, Mapping, Optional, Sequence

import attrs

from model.errors import InvalidInput, rust_display
from model.rustlib import RUST_WHITESPACE, rust_debug_str, rust_parse_f64, serde_json_number

# ---------------------------------------------------------------------------
# Enumerations (ARGS-3)
# ---------------------------------------------------------------------------


class EngineType(str, enum.Enum):
    """Which scheduler core runs: vLLM and TRT-LLM share one core, SGLang has its own."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class WorkerType(str, enum.Enum):
    """Role of a worker in (dis)aggregated serving."""

    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


class PreemptionMode(str, enum.Enum):
    """vLLM victim choice under KV pressure: LIFO = newest running request, FIFO = oldest."""

    LIFO = "lifo"
    FIFO = "fifo"


class KvTransferTimingMode(str, enum.Enum):
    """Token count charged for a disaggregated KV transfer (TIME-12)."""

    FULL_PROMPT = "full_prompt"
    DESTINATION_MISSING = "destination_missing"


class RouterQueuePolicy(str, enum.Enum):
    """Replay-only override of the KV router's pending-queue policy."""

    FCFS = "fcfs"
    LCFS = "lcfs"
    WSPT = "wspt"


class SchedulePolicy(str, enum.Enum):
    """SGLang waiting-queue policy after ARGS-12 resolution."""

    FIFO = "fifo"
    LPM = "lpm"


class SchedulingPolicy(str, enum.Enum):
    """Admission policy of the shared vLLM core (ARGS-16)."""

    VLLM = "vllm"
    TRTLLM_GUARANTEED_NO_EVICT = "trtllm_guaranteed_no_evict"


#: ARGS-2: block size used when ``block_size`` is 0 (SGLang: ``sglang.page_size`` first)
DEFAULT_BLOCK_SIZE = {EngineType.VLLM: 64, EngineType.TRTLLM: 32, EngineType.SGLANG: 1}

#: ARGS-12: SGLang sub-argument defaults
SGLANG_DEFAULT_MAX_PREFILL_TOKENS = 16384
SGLANG_DEFAULT_CHUNKED_PREFILL_SIZE = 8192
SGLANG_DEFAULT_CLIP_MAX_NEW_TOKENS = 4096
SGLANG_DEFAULT_SCHEDULE_CONSERVATIVENESS = 1.0
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600.0

#: the only TRT-LLM capacity scheduler policy upstream accepts (ARGS-10)
TRTLLM_GUARANTEED_NO_EVICT = "guaranteed_no_evict"

_U16_MAX = 2**16 - 1
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_USIZE_MAX = _U64_MAX


def _ascii_lower(text: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


# ---------------------------------------------------------------------------
# Upstream's refusal texts (ARGS-20): what the compiled build says, word for word, where the
# text is deterministic, so that a refusal compares exactly
# ---------------------------------------------------------------------------

#: ARGS-20: the Python classes of the nested constructors (their names appear in PyO3's texts)
_NESTED_CLASSES = {"sglang": "SglangArgs", "trtllm": "TrtllmArgs", "reasoning": "ReasoningConfig"}
#: ARGS-20: what the validator's struct-level refusals are prefixed with, per dialect
_VALIDATION_PREFIX = {"kwargs": "Failed to normalize MockEngineArgs: ", "json": "Failed to parse MockEngineArgs JSON: "}


def pyo3_conversion_text(param: str, value: Any, kind: str) -> str:
    """ARGS-20, DRV-19: PyO3's refusal of ``value`` for a parameter of Rust type ``kind`` (``usize``,
    ``u64``, ``u32``, ``u16``, ``isize``, ``f64``, ``bool``, ``str``, ``path`` or a nested class's
    field). A TypeError names the argument; an OverflowError (a Python int out of the type's
    range) does not."""
    tname = type(value).__name__
    if kind == "isize":  # through a C long
        if isinstance(value, int):
            return "Python int too large to convert to C long"
        return f"argument '{param}': '{tname}' object cannot be interpreted as an integer"
    if kind in (_USIZE, _U64):  # PyLong_AsUnsignedLongLong after operator.index
        if isinstance(value, int):
            return "can't convert negative int to unsigned" if value < 0 else "int too big to convert"
        return f"argument '{param}': '{tname}' object cannot be interpreted as an integer"
    if kind in (_U32, _U16):  # through a C long, then a checked narrowing
        if isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                return "Python int too large to convert to C long"
            return "out of range integral type conversion attempted"
        return f"argument '{param}': '{tname}' object cannot be interpreted as an integer"
    if kind == _F64:
        if isinstance(value, int):
            return "int too large to convert to float"
        return f"argument '{param}': must be real number, not {tname}"
    if kind == _BOOL:
        return f"argument '{param}': '{tname}' object cannot be converted to 'PyBool'"
    if kind == _PATH and not isinstance(value, (str, bytes)):
        return f"argument '{param}': expected str, bytes or os.PathLike object, not {tname}"
    if kind in _NESTED_CLASSES:
        return f"argument '{param}': '{tname}' object cannot be converted to '{_NESTED_CLASSES[kind]}'"
    return f"argument '{param}': '{tname}' object cannot be converted to 'PyString'"


def _unexpected_keyword_text(owner: str, key: Any) -> str:
    """ARGS-20: PyO3's refusal of an unknown keyword of ``MockEngineArgs`` or a nested class."""
    return f"{_NESTED_CLASSES.get(owner, 'MockEngineArgs')}.__new__() got an unexpected keyword argument '{key}'"


def _missing_arguments_text(owner: str, missing: Sequence[str]) -> str:
    """ARGS-20: PyO3's refusal of required keywords left out, in signature order, listed the way
    Python lists them ('a' / 'a' and 'b' / 'a', 'b', and 'c')."""
    quoted = [f"'{m}'" for m in missing]
    listed = quoted[0] if len(quoted) == 1 else (
        f"{quoted[0]} and {quoted[1]}" if len(quoted) == 2 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}")
    plural = "argument" if len(missing) == 1 else "arguments"
    return f"{_NESTED_CLASSES[owner]}.__new__() missing {len(missing)} required positional {plural}: {listed}"


def _struct_rule(field: str, value: Any, text: str, rule: str) -> InvalidInput:
    """ARGS-20: a refusal of the validator's struct-level rules (``__all__``); the dialect's prefix is
    added by :func:`engine_args_from_json`."""
    return _normalization_error(field, value, f"Failed to validate MockEngineArgs: __all__: {text}", rule)


def _normalization_error(field: str, value: Any, text: str, rule: str) -> InvalidInput:
    """ARGS-20: a refusal raised while upstream normalizes the arguments; :func:`engine_args_from_json`
    prefixes it as the dialect's caller does (``_VALIDATION_PREFIX``)."""
    err = InvalidInput(field, value, text, rule=rule)
    err.normalization = True  # type: ignore[attr-defined]
    return err


# ---------------------------------------------------------------------------
# SGLang sub-arguments (ARGS-11, ARGS-12)
# ---------------------------------------------------------------------------


@attrs.frozen
class SglangArgs:
    """Rule: ARGS-11. The ``sglang`` sub-object as given (None = not set)."""

    schedule_policy: Optional[str] = None
    page_size: Optional[int] = None
    max_prefill_tokens: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    clip_max_new_tokens: Optional[int] = None
    schedule_conservativeness: Optional[float] = None


@attrs.frozen
class SglangConfig:
    """Rule: ARGS-12. What the SGLang core reads, with defaults resolved and ratios derived."""

    schedule_policy: SchedulePolicy
    #: ``max_num_seqs``; None = unlimited
    max_running_requests: Optional[int]
    max_prefill_tokens: int
    chunked_prefill_size: int
    clip_max_new_tokens: int
    init_new_token_ratio: float
    min_new_token_ratio: float
    new_token_ratio_decay_step: float
    #: page size (= the normalised ``block_size``)
    block_size: int
    #: ``num_gpu_blocks * block_size``
    total_kv_tokens: int


# ---------------------------------------------------------------------------
# EngineArgs
# ---------------------------------------------------------------------------


def _enum_converter(enum_cls):
    def convert(value):
        if isinstance(value, enum_cls):
            return value
        return enum_cls(value)

    return convert


def _optional_enum_converter(enum_cls):
    inner = _enum_converter(enum_cls)

    def convert(value):
        return None if value is None else inner(value)

    return convert


@attrs.frozen
class EngineArgs:
    """Rule: ARGS-1. Normalised, validated engine arguments (upstream ``MockEngineArgs``).

    Defaults are upstream's builder defaults.  ``block_size=0`` means "engine
    default" and is replaced on construction (ARGS-2); all range and
    cross-field rules (ARGS-4 .. ARGS-10) are checked on construction and raise
    :class:`InvalidInput`.
    """

    engine_type: EngineType = attrs.field(default=EngineType.VLLM, converter=_enum_converter(EngineType))
    num_gpu_blocks: int = 16384
    block_size: int = 0
    #: None = unlimited
    max_num_seqs: Optional[int] = 256
    #: None = unlimited
    max_num_batched_tokens: Optional[int] = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    speedup_ratio: float = 1.0
    decode_speedup_ratio: float = 1.0
    dp_size: int = 1
    #: seconds; only used by replay worker scaling (a value <= 0 means no delay)
    startup_time: Optional[float] = None
    worker_type: WorkerType = attrs.field(default=WorkerType.AGGREGATED, converter=_enum_converter(WorkerType))
    kv_bytes_per_token: Optional[int] = None
    #: GB/s
    kv_transfer_bandwidth: Optional[float] = None
    kv_transfer_timing_mode: KvTransferTimingMode = attrs.field(
        default=KvTransferTimingMode.FULL_PROMPT, converter=_enum_converter(KvTransferTimingMode)
    )
    preemption_mode: PreemptionMode = attrs.field(
        default=PreemptionMode.LIFO, converter=_enum_converter(PreemptionMode)
    )
    router_queue_policy: Optional[RouterQueuePolicy] = attrs.field(
        default=None, converter=_optional_enum_converter(RouterQueuePolicy)
    )
    #: only its presence matters (KV events then carry token ids)
    zmq_kv_events_port: Optional[int] = None
    handoff_session_timeout_ms: int = 300_000
    #: GPUs per worker for the GPU-hours statistic (ARGS-17)
    aic_tp_size: Optional[int] = None
    aic_attention_dp_size: Optional[int] = None
    sglang: Optional[SglangArgs] = None
    #: TRT-LLM ``capacity_scheduler_policy``; validated only (ARGS-10)
    trtllm_capacity_scheduler_policy: Optional[str] = None

    def __attrs_post_init__(self) -> None:
        # ARGS-2: materialise the effective block size.
        if self.block_size == 0:
            if self.engine_type is EngineType.SGLANG and self.sglang is not None and self.sglang.page_size is not None:
                object.__setattr__(self, "block_size", self.sglang.page_size)
            else:
                object.__setattr__(self, "block_size", DEFAULT_BLOCK_SIZE[self.engine_type])
        _validate(self)

    # -- derived values ----------------------------------------------------

    @property
    def is_prefill(self) -> bool:
        return self.worker_type is WorkerType.PREFILL

    @property
    def is_decode(self) -> bool:
        return self.worker_type is WorkerType.DECODE

    @property
    def total_kv_tokens(self) -> int:
        """``num_gpu_blocks * block_size``: the KV pool in tokens, a usize product that wraps in
        release builds (sglang/config.rs:91, sglang/core.rs:120, vllm/core.rs:1811): an SGLang
        worker with 2^62 + 16 blocks of 4 tokens has a 64-token pool (ARGS-12, SG-1, TIME-10, TIME-11)."""
        return (self.num_gpu_blocks * self.block_size) % (_USIZE_MAX + 1)

    def scheduling_policy(self) -> SchedulingPolicy:
        """Rule: ARGS-16. TRT-LLM admits with guaranteed-no-evict; vLLM (and SGLang) use vLLM rules."""
        if self.engine_type is EngineType.TRTLLM:
            return SchedulingPolicy.TRTLLM_GUARANTEED_NO_EVICT
        return SchedulingPolicy.VLLM

    def needs_kv_publisher(self) -> bool:
        """Rule: ARGS-16. KV events are produced only with prefix caching on a non-decode worker."""
        return self.enable_prefix_caching and not self.is_decode

    def effective_handoff_capacity(self) -> int:
        """Rule: ARGS-17. ``max(max_num_seqs or num_gpu_blocks, 1)``: bound for live handoff queues."""
        bound = self.max_num_seqs if self.max_num_seqs is not None else self.num_gpu_blocks
        return max(bound, 1)

    def aic_gpus_per_worker(self) -> int:
        """Rule: ARGS-17. ``(aic_tp_size or 1) * (aic_attention_dp_size or 1)`` (GPU-hours factor), a
        usize product that wraps modulo 2^64 as in upstream's release build."""
        tp = self.aic_tp_size if self.aic_tp_size is not None else 1
        dp = self.aic_attention_dp_size if self.aic_attention_dp_size is not None else 1
        return (tp * dp) % (1 << 64)

    def startup_time_ms(self) -> Optional[float]:
        """Rule: ARGS-17. Worker start-up delay in ms: ``startup_time * 1000`` if it is > 0, else None."""
        if self.startup_time is not None and self.startup_time > 0.0:
            return self.startup_time * 1000.0
        return None

    def sglang_config(self) -> SglangConfig:
        """Rule: ARGS-12. Resolve the SGLang sub-arguments (defaults, policy, new-token ratios)."""
        sg = self.sglang if self.sglang is not None else SglangArgs()
        conservativeness = (
            sg.schedule_conservativeness
            if sg.schedule_conservativeness is not None
            else SGLANG_DEFAULT_SCHEDULE_CONSERVATIVENESS
        )
        init_ratio = SGLANG_INIT_NEW_TOKEN_RATIO * conservativeness
        min_ratio = init_ratio * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        decay_step = (init_ratio - min_ratio) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        return SglangConfig(
            schedule_policy=resolve_schedule_policy(sg.schedule_policy),
            max_running_requests=self.max_num_seqs,
            max_prefill_tokens=(
                sg.max_prefill_tokens if sg.max_prefill_tokens is not None else SGLANG_DEFAULT_MAX_PREFILL_TOKENS
            ),
            chunked_prefill_size=(
                sg.chunked_prefill_size
                if sg.chunked_prefill_size is not None
                else SGLANG_DEFAULT_CHUNKED_PREFILL_SIZE
            ),
            clip_max_new_tokens=(
                sg.clip_max_new_tokens if sg.clip_max_new_tokens is not None else SGLANG_DEFAULT_CLIP_MAX_NEW_TOKENS
            ),
            init_new_token_ratio=init_ratio,
            min_new_token_ratio=min_ratio,
            new_token_ratio_decay_step=decay_step,
            block_size=self.block_size,
            total_kv_tokens=self.total_kv_tokens,
        )


def resolve_schedule_policy(policy: Optional[str]) -> SchedulePolicy:
    """Rule: ARGS-12. Exact ``"lpm"`` selects LPM; anything else (incl. typos, other case) is FIFO."""
    if policy == "lpm":
        return SchedulePolicy.LPM
    return SchedulePolicy.FIFO


def _check_type(field: str, value: Any, kind: type | tuple, rule: str) -> None:
    if isinstance(value, bool) and kind is not bool and not (isinstance(kind, tuple) and bool in kind):
        raise InvalidInput(field, value, f"expected {_kind_name(kind)}", rule=rule)
    if not isinstance(value, kind):
        raise InvalidInput(field, value, f"expected {_kind_name(kind)}", rule=rule)


def _kind_name(kind) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def _validate(a: EngineArgs) -> None:
    """ARGS-4 .. ARGS-10 on a materialised EngineArgs (upstream ``validate_config``)."""
    # Types (a directly constructed EngineArgs may hold anything).
    for name in ("num_gpu_blocks", "block_size", "dp_size", "handoff_session_timeout_ms"):
        _check_type(name, getattr(a, name), int, "ARGS-4")
    for name in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_bytes_per_token",
        "zmq_kv_events_port",
        "aic_tp_size",
        "aic_attention_dp_size",
    ):
        value = getattr(a, name)
        if value is not None:
            _check_type(name, value, int, "ARGS-4")
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        _check_type(name, getattr(a, name), bool, "ARGS-4")
    for name in ("speedup_ratio", "decode_speedup_ratio"):
        _check_type(name, getattr(a, name), (int, float), "ARGS-4")
    for name in ("startup_time", "kv_transfer_bandwidth"):
        value = getattr(a, name)
        if value is not None:
            _check_type(name, value, (int, float), "ARGS-4")
    if a.sglang is not None and not isinstance(a.sglang, SglangArgs):
        raise InvalidInput("sglang", a.sglang, "expected SglangArgs", rule="ARGS-4")

    # ARGS-4: integer widths.
    _check_range_int("num_gpu_blocks", a.num_gpu_blocks, 0, _USIZE_MAX, "ARGS-4")
    _check_range_int("block_size", a.block_size, 0, _USIZE_MAX, "ARGS-4")
    _check_range_int("dp_size", a.dp_size, 0, _U32_MAX, "ARGS-4")
    _check_range_int("handoff_session_timeout_ms", a.handoff_session_timeout_ms, 0, _U64_MAX, "ARGS-4")
    for name, hi in (
        ("max_num_seqs", _USIZE_MAX),
        ("max_num_batched_tokens", _USIZE_MAX),
        ("kv_bytes_per_token", _USIZE_MAX),
        ("zmq_kv_events_port", _U16_MAX),
        ("aic_tp_size", _USIZE_MAX),
        ("aic_attention_dp_size", _USIZE_MAX),
    ):
        value = getattr(a, name)
        if value is not None:
            _check_range_int(name, value, 0, hi, "ARGS-4")

    # ARGS-6: field ranges (validator attributes).
    if a.num_gpu_blocks < 1:
        raise InvalidInput("num_gpu_blocks", a.num_gpu_blocks, "must be >= 1", rule="ARGS-6")
    if a.max_num_seqs is not None and a.max_num_seqs < 1:
        raise InvalidInput("max_num_seqs", a.max_num_seqs, "must be >= 1 (null means unlimited)", rule="ARGS-6")
    if a.max_num_batched_tokens is not None and a.max_num_batched_tokens < 1:
        raise InvalidInput(
            "max_num_batched_tokens", a.max_num_batched_tokens, "must be >= 1 (null means unlimited)", rule="ARGS-6"
        )
    if a.speedup_ratio < 0.0:
        raise InvalidInput("speedup_ratio", a.speedup_ratio, "must be >= 0", rule="ARGS-6")
    if a.decode_speedup_ratio < 0.0:
        raise InvalidInput("decode_speedup_ratio", a.decode_speedup_ratio, "must be >= 0", rule="ARGS-6")
    if a.dp_size < 1:
        raise InvalidInput("dp_size", a.dp_size, "must be >= 1", rule="ARGS-6")
    if a.startup_time is not None and a.startup_time < 0.0:
        raise InvalidInput("startup_time", a.startup_time, "must be >= 0", rule="ARGS-6")
    if a.handoff_session_timeout_ms < 1:
        raise InvalidInput("handoff_session_timeout_ms", a.handoff_session_timeout_ms, "must be >= 1", rule="ARGS-6")
    if a.kv_transfer_bandwidth is not None and a.kv_transfer_bandwidth < 0.0:
        raise InvalidInput("kv_transfer_bandwidth", a.kv_transfer_bandwidth, "must be >= 0", rule="ARGS-6")

    # ARGS-7: block size after materialisation.
    if a.block_size == 0:
        raise _struct_rule("block_size", a.block_size, "block_size must be greater than 0", "ARGS-7")

    # ARGS-10: TRT-LLM capacity scheduler policy (checked for every engine type).
    policy = a.trtllm_capacity_scheduler_policy
    if policy is not None and policy != TRTLLM_GUARANTEED_NO_EVICT:
        raise _struct_rule("trtllm.capacity_scheduler_policy", policy, "engine_type=trtllm v1 supports only "
                           f"capacity_scheduler_policy='guaranteed_no_evict', got '{policy}'", "ARGS-10")

    # ARGS-8 / ARGS-9: SGLang cross-field rules (only for engine_type sglang).
    if a.engine_type is EngineType.SGLANG and a.sglang is not None:
        page = a.sglang.page_size
        if page is not None and a.block_size != page:
            raise _struct_rule("sglang.page_size", page, "engine_type=sglang requires block_size and sglang.page_size "
                               f"to match when both are set, got block_size={a.block_size} and sglang.page_size={page}",
                               "ARGS-8")
        chunk = a.sglang.chunked_prefill_size
        if chunk is not None and chunk % a.block_size != 0:
            raise _struct_rule("sglang.chunked_prefill_size", chunk, "engine_type=sglang requires "
                               "sglang.chunked_prefill_size to be divisible by block_size, got "
                               f"chunked_prefill_size={chunk} and block_size={a.block_size}", "ARGS-9")

    # ARGS-5: finite floats, the model's own refusal, so after every check upstream makes (a NaN
    # passes upstream's ranges, and the model's, since every comparison with it is false).
    for name in ("speedup_ratio", "decode_speedup_ratio", "startup_time", "kv_transfer_bandwidth"):
        value = getattr(a, name)
        if value is not None and not math.isfinite(value):
            raise InvalidInput(name, value, "must be a finite number", rule="ARGS-5")
    if a.sglang is not None and a.sglang.schedule_conservativeness is not None:
        if not math.isfinite(a.sglang.schedule_conservativeness):
            raise InvalidInput(
                "sglang.schedule_conservativeness",
                a.sglang.schedule_conservativeness,
                "must be a finite number",
                rule="ARGS-5",
            )


def _check_range_int(field: str, value: int, lo: int, hi: int, rule: str) -> None:
    if value < lo or value > hi:
        raise InvalidInput(field, value, f"out of range [{lo}, {hi}]", rule=rule)


# ---------------------------------------------------------------------------
# Replay-level checks on args (ARGS-18)
# ---------------------------------------------------------------------------


def _debug_name(value: str) -> str:
    """How upstream's ``{:?}`` prints a worker or engine type in its ARGS-18 texts: the Rust variant
    name, which is the value capitalised (``Prefill``, ``Vllm``, ``Sglang``)."""
    return value.capitalize()


def check_aggregated_replay_args(args: EngineArgs, num_workers: int, mode: str = "trace replay") -> None:
    """Rule: ARGS-18. Aggregated replay: >= 1 worker, aggregated worker type, dp_size 1; the
    reasons are upstream's texts, ``mode`` being ``trace replay`` or ``concurrency replay``."""
    if num_workers == 0:
        raise InvalidInput("num_workers", num_workers, f"{mode} requires num_workers >= 1", rule="ARGS-18")
    if args.worker_type is not WorkerType.AGGREGATED:
        raise InvalidInput("worker_type", args.worker_type.value,
                           f"{mode} only supports aggregated workers, got {_debug_name(args.worker_type.value)}",
                           rule="ARGS-18")
    if args.dp_size != 1:
        raise InvalidInput("dp_size", args.dp_size, f"{mode} only supports data_parallel_size=1, got {args.dp_size}",
                           rule="ARGS-18")


def check_disagg_replay_args(
    prefill: EngineArgs, decode: EngineArgs, num_prefill_workers: int, num_decode_workers: int,
    mode: str = "trace replay",
) -> None:
    """Rule: ARGS-18. Disaggregated replay, in upstream's check order and with its texts."""
    p_engine, d_engine = prefill.engine_type.value, decode.engine_type.value
    if prefill.engine_type is EngineType.TRTLLM or decode.engine_type is EngineType.TRTLLM:
        raise InvalidInput("engine_type", "trtllm", f"{mode} disaggregation does not support TRT-LLM", rule="ARGS-18")
    if prefill.engine_type is not decode.engine_type:
        raise InvalidInput("decode_engine_args.engine_type", d_engine,
                           f"{mode} disaggregation requires matching prefill/decode engine_type, got "
                           f"{_debug_name(p_engine)} and {_debug_name(d_engine)}", rule="ARGS-18")
    if num_prefill_workers == 0:
        raise InvalidInput("num_prefill_workers", 0, f"{mode} requires num_prefill_workers >= 1", rule="ARGS-18")
    if num_decode_workers == 0:
        raise InvalidInput("num_decode_workers", 0, f"{mode} requires num_decode_workers >= 1", rule="ARGS-18")
    for side, args, wanted in (("prefill", prefill, WorkerType.PREFILL), ("decode", decode, WorkerType.DECODE)):
        if args.worker_type is not wanted:
            raise InvalidInput(f"{side}_engine_args.worker_type", args.worker_type.value,
                               f"{mode} requires {side}_engine_args.worker_type={wanted.value}, got "
                               f"{_debug_name(args.worker_type.value)}", rule="ARGS-18")
    for side, args in (("prefill", prefill), ("decode", decode)):
        if args.dp_size != 1:
            raise InvalidInput(f"{side}_engine_args.dp_size", args.dp_size,
                               f"{mode} only supports {side} data_parallel_size=1, got {args.dp_size}",
                               rule="ARGS-18")
    if prefill.block_size != decode.block_size:
        raise InvalidInput("decode_engine_args.block_size", decode.block_size,
                           f"{mode} requires matching prefill/decode block_size, got {prefill.block_size} and "
                           f"{decode.block_size}", rule="ARGS-18")


# ---------------------------------------------------------------------------
# Loader (ARGS-11 .. ARGS-15)
# ---------------------------------------------------------------------------

# Value kinds of the accepted keys.
_USIZE, _U32, _U16, _U64, _F64, _BOOL, _STR, _ANY = "usize", "u32", "u16", "u64", "f64", "bool", "str", "any"
_PATH = "path"  # a Rust PathBuf: a string, or in the constructor dialect also an os.PathLike (ARGS-13)
_SGLANG, _TRTLLM, _REASONING = "sglang", "trtllm", "reasoning"

#: key -> (kind, nullable).  ``nullable`` False means an explicit null is rejected
#: (upstream ``into_non_null`` / a non-Option constructor parameter).
_COMMON_KEYS: dict[str, tuple[str, bool]] = {
    "engine_type": (_STR, False),
    "num_gpu_blocks": (_USIZE, True),
    "block_size": (_USIZE, False),
    "max_num_seqs": (_USIZE, True),
    "max_num_batched_tokens": (_USIZE, True),
    "enable_prefix_caching": (_BOOL, False),
    "enable_chunked_prefill": (_BOOL, False),
    "speedup_ratio": (_F64, False),
    "decode_speedup_ratio": (_F64, False),
    "dp_size": (_U32, False),
    "startup_time": (_F64, True),
    "worker_type": (_STR, False),
    "planner_profile_data": (_PATH, True),
    "aic_backend": (_STR, True),
    "aic_system": (_STR, True),
    "aic_backend_version": (_STR, True),
    "aic_tp_size": (_USIZE, True),
    "aic_model_path": (_STR, True),
    "aic_moe_tp_size": (_USIZE, True),
    "aic_moe_ep_size": (_USIZE, True),
    "aic_attention_dp_size": (_USIZE, True),
    "aic_gemm_dtype": (_STR, True),
    "aic_moe_dtype": (_STR, True),
    "aic_fmha_dtype": (_STR, True),
    "aic_kv_cache_dtype": (_STR, True),
    "aic_comm_dtype": (_STR, True),
    "aic_nextn": (_USIZE, True),
    "aic_nextn_accept_rates": (_STR, True),
    "aic_mtp_seed": (_U64, False),
    "gpu_memory_utilization": (_F64, True),
    "mem_fraction_static": (_F64, True),
    "free_gpu_memory_fraction": (_F64, True),
    "enable_local_indexer": (_BOOL, False),
    "bootstrap_port": (_U16, True),
    "handoff_session_timeout_ms": (_U64, False),
    "kv_bytes_per_token": (_USIZE, True),
    "kv_transfer_bandwidth": (_F64, True),
    "kv_transfer_timing_mode": (_STR, False),
    "num_g2_blocks": (_USIZE, True),
    "num_g3_blocks": (_USIZE, True),
    "enable_g4_storage": (_BOOL, False),
    "offload_batch_size": (_USIZE, True),
    "bandwidth_g1_to_g2_gbps": (_F64, True),
    "bandwidth_g2_to_g1_gbps": (_F64, True),
    "bandwidth_g2_to_g3_gbps": (_F64, True),
    "bandwidth_g3_to_g2_gbps": (_F64, True),
    "bandwidth_g2_to_g4_gbps": (_F64, True),
    "bandwidth_g4_to_g2_gbps": (_F64, True),
    "reasoning": (_REASONING, True),
    "zmq_kv_events_port": (_U16, True),
    "zmq_replay_port": (_U16, True),
    "preemption_mode": (_STR, False),
    "router_queue_policy": (_STR, True),
    "sglang": (_SGLANG, True),
    "trtllm": (_TRTLLM, True),
    # present in the 1.3.0.post1 build (not in the source commit); live-only
    "response_replay_trace_path": (_PATH, True),
}

#: ARGS-11: keys only the JSON form accepts
_JSON_ONLY_KEYS: dict[str, tuple[str, bool]] = {
    "is_prefill": (_BOOL, False),
    "is_decode": (_BOOL, False),
    "has_perf_model": (_ANY, True),
}

#: ARGS-6: float ranges of accepted-but-unmodelled fields
_F64_RANGES: dict[str, tuple[float, Optional[float]]] = {
    "gpu_memory_utilization": (0.0, 1.0),
    "mem_fraction_static": (0.0, 1.0),
    "free_gpu_memory_fraction": (0.0, 1.0),
    "bandwidth_g1_to_g2_gbps": (0.0, None),
    "bandwidth_g2_to_g1_gbps": (0.0, None),
    "bandwidth_g2_to_g3_gbps": (0.0, None),
    "bandwidth_g3_to_g2_gbps": (0.0, None),
    "bandwidth_g2_to_g4_gbps": (0.0, None),
    "bandwidth_g4_to_g2_gbps": (0.0, None),
}

_SGLANG_FIELDS: tuple[tuple[str, str], ...] = (
    ("schedule_policy", _STR),
    ("page_size", _USIZE),
    ("max_prefill_tokens", _USIZE),
    ("chunked_prefill_size", _USIZE),
    ("clip_max_new_tokens", _USIZE),
    ("schedule_conservativeness", _F64),
)
_TRTLLM_FIELDS: tuple[tuple[str, str], ...] = (("capacity_scheduler_policy", _STR),)
_REASONING_FIELDS: tuple[tuple[str, str], ...] = (
    ("start_thinking_token_id", "u32"),
    ("end_thinking_token_id", "u32"),
    ("thinking_ratio", _F64),
)

_INT_LIMITS = {_USIZE: _USIZE_MAX, _U64: _U64_MAX, _U32: _U32_MAX, _U16: _U16_MAX}


def _parse_scalar(field: str, value: Any, kind: str, dialect: str) -> Any:
    """ARGS-13: type check of one non-null value.  Returns the Python value to use. A refusal in the
    constructor dialect carries PyO3's text (ARGS-20), the model's own words as its detail."""
    try:
        return _check_scalar(field, value, kind, dialect)
    except InvalidInput as err:
        if dialect != "kwargs" or err.rule != "ARGS-13":
            raise
        raise InvalidInput(field, value, pyo3_conversion_text(field.split(".")[-1], value, kind), rule="ARGS-13",
                           detail=err.reason) from None


def _check_scalar(field: str, value: Any, kind: str, dialect: str) -> Any:
    if kind == _ANY:
        return value
    if kind in _INT_LIMITS:
        # JSON: a boolean is not a number.  kwargs: Python's bool is an int and is accepted.
        if isinstance(value, bool):
            if dialect == "json":
                raise InvalidInput(field, value, f"invalid type: boolean, expected {kind}", rule="ARGS-13")
            value = int(value)
        if not isinstance(value, int):
            raise InvalidInput(field, value, f"invalid type, expected {kind}", rule="ARGS-13")
        if value < 0 or value > _INT_LIMITS[kind]:
            raise InvalidInput(field, value, f"invalid value, expected {kind}", rule="ARGS-13")
        return value
    if kind == _F64:
        if isinstance(value, bool):
            if dialect == "json":
                raise InvalidInput(field, value, "invalid type: boolean, expected f64", rule="ARGS-13")
            value = float(value)
        # JSON: the text serde_json reads is Python's (dynamo.replay's CLI loads the file and dumps
        # it again for from_json), and serde_json values it its own way (not correctly rounded: an
        # integer past u64, or a 17-digit repr, can land 1 ulp away)
        if isinstance(value, int):
            try:
                return float(serde_json_number(str(value)) if dialect == "json" else value)
            except (OverflowError, ValueError):
                raise InvalidInput(field, value, "number out of range for f64", rule="ARGS-13") from None
        if not isinstance(value, float):
            raise InvalidInput(field, value, "invalid type, expected f64", rule="ARGS-13")
        if dialect == "json":
            if not math.isfinite(value):  # serde refuses the token where it stands
                raise InvalidInput(field, value, "must be a finite number", rule="ARGS-5")
            return float(serde_json_number(repr(value)))
        return value  # the constructor takes it; the model refuses it last (ARGS-5)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise InvalidInput(field, value, "invalid type, expected a boolean", rule="ARGS-13")
        return value
    if kind == _PATH and dialect == "kwargs" and not isinstance(value, str) and hasattr(value, "__fspath__"):
        # PyO3 converts a PathBuf parameter through os.fspath (pathlib.Path and the like)
        path = os.fspath(value)
        if not isinstance(path, str):
            raise InvalidInput(field, value, "invalid type, expected a string or a path", rule="ARGS-13")
        return path
    if kind in (_STR, _PATH):
        if not isinstance(value, str):
            raise InvalidInput(field, value, "invalid type, expected a string", rule="ARGS-13")
        return value
    raise AssertionError(kind)  # pragma: no cover


def _parse_nested(field: str, value: Any, fields: tuple[tuple[str, str], ...], dialect: str,
                  required: bool) -> dict[str, Any]:
    """ARGS-11: a nested object (``sglang``, ``trtllm``, ``reasoning``): the keywords of its own
    constructor, or a JSON object (or serde's sequence form of one)."""
    if isinstance(value, (list, tuple)) and dialect == "json":
        return _parse_nested_sequence(field, value, fields, dialect, required)
    if not isinstance(value, Mapping):
        reason = "invalid type, expected an object"
        if dialect == "kwargs":
            raise InvalidInput(field, value, pyo3_conversion_text(field, value, field), rule="ARGS-13", detail=reason)
        raise InvalidInput(field, value, reason, rule="ARGS-13")
    if dialect == "kwargs":
        return _parse_nested_keywords(field, value, fields, required)
    known = {name for name, _ in fields}
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in known:
            continue  # JSON: unknown keys inside nested objects are ignored
        kind = dict(fields)[key]
        if item is None:
            if required:
                raise InvalidInput(f"{field}.{key}", item, "must not be null", rule="ARGS-13")
            out[key] = None
        else:
            out[key] = _parse_scalar(f"{field}.{key}", item, kind, dialect)
    if required:
        for name, _ in fields:
            if name not in out:
                raise InvalidInput(f"{field}.{name}", None, "missing field", rule="ARGS-13")
    return out


def _parse_nested_sequence(field: str, value: Sequence[Any], fields: tuple[tuple[str, str], ...],
                           dialect: str, required: bool) -> dict[str, Any]:
    """ARGS-11: serde's sequence form of a nested object, read as serde reads it: element by element
    in declaration order, each checked before the next is looked at (a bad element is named by its
    index, ``sglang[1]``); then too few elements are an invalid length and too many are trailing
    characters, both naming the object."""
    out: dict[str, Any] = {}
    for index, (name, kind) in enumerate(fields):
        if index == len(value):
            raise InvalidInput(field, value, f"invalid length {len(value)}, expected {len(fields)} elements",
                               rule="ARGS-13")
        item = value[index]
        if item is None:
            if required:
                raise InvalidInput(f"{field}[{index}]", item, f"invalid type: null, expected {kind}",
                                   rule="ARGS-13")
            out[name] = None
        else:
            out[name] = _parse_scalar(f"{field}[{index}]", item, kind, dialect)
    if len(value) > len(fields):
        raise InvalidInput(field, value, f"trailing characters: {len(value)} elements, expected {len(fields)}",
                           rule="ARGS-13")
    return out


def _parse_enum(field: str, value: str, enum_cls, case_insensitive: bool, rule: str = "ARGS-3"):
    text = _ascii_lower(value) if case_insensitive else value
    for member in enum_cls:
        if member.value == text:
            return member
    allowed = ", ".join(repr(m.value) for m in enum_cls)
    raise InvalidInput(field, value, f"must be one of {allowed}", rule=rule)


def _normalize_accept_rates(nextn: int, rates: Optional[str]) -> None:
    """ARGS-10: upstream's MTP rate validation (the model then rejects MTP, ARGS-14)."""
    if not 1 <= nextn <= 5:
        raise InvalidInput("aic_nextn", nextn, "must be in 1..=5", rule="ARGS-10")
    stripped = rates.strip(RUST_WHITESPACE) if rates is not None else ""
    if not stripped:
        return
    parsed = []
    for part in stripped.split(","):  # every entry parsed before any is range-checked
        text = part.strip(RUST_WHITESPACE)
        try:
            parsed.append(rust_parse_f64(text))
        except ValueError:
            why = "cannot parse float from empty string" if not text else "invalid float literal"
            raise _normalization_error("aic_nextn_accept_rates", rates, "invalid aic_nextn_accept_rates value "
                                       f"{rust_debug_str(part)}: {why}", "ARGS-10") from None
    for index, rate in enumerate(parsed):  # entries past aic_nextn included (upstream drops them after)
        if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
            raise _normalization_error("aic_nextn_accept_rates", rates, f"aic_nextn_accept_rates[{index}] must be "
                                       f"finite and in [0, 1], got {rust_display(rate)}", "ARGS-10")



#: ARGS-11: the constructor's parameters in its signature's order (bindings replay.rs:174), the
#: order in which PyO3 converts them; ``test_kwargs_signature_order_matches_the_build`` checks it
#: against the compiled build's ``__text_signature__``
_SIGNATURE_ORDER: tuple[str, ...] = (
    "engine_type", "num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
    "enable_prefix_caching", "enable_chunked_prefill", "speedup_ratio", "decode_speedup_ratio", "dp_size",
    "startup_time", "worker_type", "planner_profile_data", "aic_backend", "aic_system", "aic_backend_version",
    "aic_tp_size", "aic_model_path", "aic_moe_tp_size", "aic_moe_ep_size", "aic_attention_dp_size", "aic_nextn",
    "aic_nextn_accept_rates", "aic_mtp_seed", "aic_gemm_dtype", "aic_moe_dtype", "aic_fmha_dtype",
    "aic_kv_cache_dtype", "aic_comm_dtype", "gpu_memory_utilization", "mem_fraction_static",
    "free_gpu_memory_fraction", "enable_local_indexer", "bootstrap_port", "handoff_session_timeout_ms",
    "kv_bytes_per_token", "kv_transfer_bandwidth", "kv_transfer_timing_mode", "reasoning",
    "response_replay_trace_path",  # the compiled build's place for it (the pin has no such parameter)
    "zmq_kv_events_port",
    "zmq_replay_port", "preemption_mode", "router_queue_policy", "sglang", "trtllm", "num_g2_blocks",
    "num_g3_blocks", "offload_batch_size", "bandwidth_g1_to_g2_gbps", "bandwidth_g2_to_g1_gbps",
    "bandwidth_g2_to_g3_gbps", "bandwidth_g3_to_g2_gbps", "enable_g4_storage", "bandwidth_g2_to_g4_gbps",
    "bandwidth_g4_to_g2_gbps",
)
#: ARGS-11: the nested constructors a constructor-dialect caller runs first, in this order (a
#: nested value that is not a mapping is left to the constructor, which refuses it)
_NESTED_CONSTRUCTORS: tuple[tuple[str, tuple[tuple[str, str], ...], bool], ...] = (
    ("reasoning", _REASONING_FIELDS, True),
    ("sglang", _SGLANG_FIELDS, False),
    ("trtllm", _TRTLLM_FIELDS, False),
)
#: ARGS-3: the enumerations the constructor's body parses, in its order (bindings replay.rs:233-245)
_CONSTRUCTOR_ENUMS = ("engine_type", "worker_type", "preemption_mode", "kv_transfer_timing_mode",
                      "router_queue_policy")
#: ARGS-13, ARGS-3: the JSON dialect's conversion (common/protocols.rs:995-1216) refuses the nulls of
#: these fields and parses the enumerations among them in this order, after serde has read every
#: key and type in document order
_JSON_CONVERSION_ORDER = ("engine_type", "block_size", "enable_prefix_caching", "enable_chunked_prefill",
                          "speedup_ratio", "decode_speedup_ratio", "dp_size", "worker_type", "aic_mtp_seed",
                          "enable_local_indexer", "handoff_session_timeout_ms", "kv_transfer_timing_mode",
                          "enable_g4_storage", "preemption_mode", "router_queue_policy")
_ENUMS = {
    "engine_type": (EngineType, True),
    "worker_type": (WorkerType, True),
    "preemption_mode": (PreemptionMode, True),
    "kv_transfer_timing_mode": (KvTransferTimingMode, None),  # case-insensitive in both dialects
    "router_queue_policy": (RouterQueuePolicy, False),
}


def _parse_value(key: str, value: Any, kind: str, dialect: str) -> Any:
    if kind == _SGLANG:
        return _parse_nested(key, value, _SGLANG_FIELDS, dialect, required=False)
    if kind == _TRTLLM:
        return _parse_nested(key, value, _TRTLLM_FIELDS, dialect, required=False)
    if kind == _REASONING:
        return _parse_nested(key, value, _REASONING_FIELDS, dialect, required=True)
    return _parse_scalar(key, value, kind, dialect)


def _read_json_object(obj: Mapping[Any, Any]) -> dict[str, Any]:
    """ARGS-19, ARGS-11, ARGS-13: serde's pass over a JSON object: keys and non-null value types in document
    order (``deny_unknown_fields``); nulls are kept for the conversion."""
    accepted = dict(_COMMON_KEYS)
    accepted.update(_JSON_ONLY_KEYS)
    values: dict[str, Any] = {}
    for key, value in obj.items():
        if not isinstance(key, str) or key not in accepted:
            raise InvalidInput(str(key), value, "unknown field", rule="ARGS-11")
        values[key] = None if value is None else _parse_value(key, value, accepted[key][0], "json")
    return values


#: ARGS-20: upstream's refusal of an unknown enumeration value, per dialect (bindings replay.rs:33-63,
#: 233-245; common/protocols.rs's conversion; kv-router's queue-policy parse)
_ENUM_TEXTS = {
    ("engine_type", "kwargs"): "engine_type must be one of 'vllm', 'sglang', or 'trtllm', got '{v}'",
    ("worker_type", "kwargs"): "worker_type must be one of 'aggregated', 'prefill', or 'decode', got '{v}'",
    ("preemption_mode", "kwargs"): "preemption_mode must be either 'lifo' or 'fifo', got '{v}'",
    ("kv_transfer_timing_mode", "kwargs"):
        "Invalid kv_transfer_timing_mode '{v}'. Must be 'full_prompt' or 'destination_missing'.",
    ("router_queue_policy", "kwargs"):
        "invalid router_queue_policy {d}: unknown queue policy: {d}, expected 'fcfs', 'lcfs', or 'wspt'",
    ("engine_type", "json"): "Failed to parse MockEngineArgs JSON: Invalid engine_type '{v}'. "
                             "Must be 'vllm', 'sglang', or 'trtllm'.",
    ("worker_type", "json"): "Failed to parse MockEngineArgs JSON: Invalid worker_type '{v}'. "
                             "Must be 'aggregated', 'prefill', or 'decode'.",
    ("preemption_mode", "json"): "Failed to parse MockEngineArgs JSON: Invalid preemption_mode: '{v}'. "
                                 "Must be 'lifo' or 'fifo'.",
    ("kv_transfer_timing_mode", "json"): "Failed to parse MockEngineArgs JSON: Invalid kv_transfer_timing_mode '{v}'. "
                                         "Must be 'full_prompt' or 'destination_missing'.",
    ("router_queue_policy", "json"): "Failed to parse MockEngineArgs JSON: unknown queue policy: {d}, "
                                     "expected 'fcfs', 'lcfs', or 'wspt'",
}


def _enum(key: str, value: Any, dialect: str) -> Any:
    enum_cls, json_only_ci = _ENUMS[key]
    case_insensitive = True if json_only_ci is None else (json_only_ci and dialect == "json")
    try:
        return _parse_enum(key, value, enum_cls, case_insensitive)
    except InvalidInput as err:
        text = _ENUM_TEXTS[(key, dialect)].format(v=value, d=rust_debug_str(value))
        raise InvalidInput(err.field, err.value, text, rule=err.rule, detail=err.reason) from None


def _json_conversion(values: dict[str, Any]) -> dict[str, Any]:
    """ARGS-19, ARGS-13, ARGS-3: the JSON dialect's conversion, in its order: a null where the field is not
    nullable, then (for an enumeration) its parse, field by field."""
    fields: dict[str, Any] = {}
    for key in _JSON_CONVERSION_ORDER:
        if key == "worker_type" and "worker_type" not in values:
            for flag in ("is_prefill", "is_decode"):
                if flag in values and values[flag] is None:
                    raise InvalidInput(flag, None, "must not be null", rule="ARGS-13")
            is_prefill = bool(values.get("is_prefill") or False)
            is_decode = bool(values.get("is_decode") or False)
            if is_prefill and is_decode:
                raise InvalidInput("is_decode", True, "is_prefill and is_decode cannot both be true", rule="ARGS-3")
            fields["worker_type"] = (
                WorkerType.PREFILL if is_prefill else WorkerType.DECODE if is_decode else WorkerType.AGGREGATED
            )
            continue
        if key not in values:
            continue
        if values[key] is None:
            if not _COMMON_KEYS[key][1]:
                raise InvalidInput(key, None, "must not be null", rule="ARGS-13")
            continue
        if key in _ENUMS:
            fields[key] = _enum(key, values[key], "json")
    return fields


def _parse_nested_keywords(key: str, value: Mapping[Any, Any], members: tuple[tuple[str, str], ...],
                           required: bool) -> dict[str, Any]:
    """ARGS-19, ARGS-11: a nested constructor called with keywords, as PyO3 checks them: an unknown keyword
    first (the first in the mapping's order), then the missing required members, then each member's
    conversion in signature order."""
    known = [name for name, _ in members]
    for name, item in value.items():
        if name not in known:
            raise InvalidInput(f"{key}.{name}", item, _unexpected_keyword_text(key, name), rule="ARGS-11",
                               detail="unknown field")
    if required:
        missing = [name for name in known if name not in value]
        if missing:
            raise InvalidInput(f"{key}.{missing[0]}", None, _missing_arguments_text(key, missing), rule="ARGS-13",
                               detail="missing field")
    out: dict[str, Any] = {}
    for name, kind in members:
        if name not in value:
            continue
        item = value[name]
        if item is None:
            if required:
                raise InvalidInput(f"{key}.{name}", item, pyo3_conversion_text(name, None, kind), rule="ARGS-13",
                                   detail="must not be null")
            out[name] = None
        else:
            out[name] = _parse_scalar(f"{key}.{name}", item, kind, "kwargs")
    return out


def _read_constructor_keywords(obj: Mapping[Any, Any]) -> dict[str, Any]:
    """ARGS-19, ARGS-11, ARGS-13: ``MockEngineArgs(**obj)`` as PyO3 checks it, after the caller has built the
    nested objects given as mappings (``_NESTED_CONSTRUCTORS``): an unknown keyword first (the first
    in the mapping's order), then each parameter's conversion in signature order, a null refused
    where the parameter is not optional."""
    nested: dict[str, Any] = {}
    for key, members, required in _NESTED_CONSTRUCTORS:
        if isinstance(obj.get(key), Mapping):
            nested[key] = _parse_nested(key, obj[key], members, "kwargs", required)
    for key, value in obj.items():
        if not isinstance(key, str) or key not in _COMMON_KEYS:
            raise InvalidInput(str(key), value, _unexpected_keyword_text("", key), rule="ARGS-11",
                               detail="unknown field")
    values: dict[str, Any] = {}
    for key in _SIGNATURE_ORDER:
        if key not in obj:
            continue
        value = obj[key]
        kind, nullable = _COMMON_KEYS[key]
        if key in nested:
            values[key] = nested[key]
        elif value is None:
            if not nullable:
                raise InvalidInput(key, None, pyo3_conversion_text(key, None, kind), rule="ARGS-13",
                                   detail="must not be null")
            values[key] = None
        else:
            values[key] = _parse_value(key, value, kind, "kwargs")
    return values


def _constructor_enumerations(values: dict[str, Any]) -> dict[str, Any]:
    """ARGS-19, ARGS-3: the constructor's body parses its enumerations in ``_CONSTRUCTOR_ENUMS`` order; an
    absent ``worker_type`` is the parameter's default, aggregated. The body then loads
    ``planner_profile_data`` before any range is validated (bindings replay.rs:307-315), so the
    model's refusal of it (ARGS-14) stands here in this dialect."""
    fields: dict[str, Any] = {}
    for key in _CONSTRUCTOR_ENUMS:
        if values.get(key) is not None:
            fields[key] = _enum(key, values[key], "kwargs")
    fields.setdefault("worker_type", WorkerType.AGGREGATED)
    if values.get("planner_profile_data") is not None:
        raise _planner_not_supported(values["planner_profile_data"])
    return fields


def _planner_not_supported(path: Any) -> InvalidInput:
    return InvalidInput("planner_profile_data", path, "the NPZ-interpolated perf model is not supported by the model",
                        rule="ARGS-14")



def _offload_and_mtp_rules(num_g2: Optional[int], num_g3: Optional[int], g4: bool, nextn: Optional[int],
                           rates: Optional[str], decode_speedup_ratio: float) -> Optional[InvalidInput]:
    """ARGS-19, ARGS-15, ARGS-10: the first of upstream's offload and MTP struct rules that fails (G3 and G4
    need G2; MTP needs a decode speed-up of 1; accept rates need MTP), or None."""
    if num_g3 is not None and num_g2 is None:
        return _struct_rule("num_g3_blocks", num_g3,
                            "num_g3_blocks requires num_g2_blocks because mocker stages G3 through G2", "ARGS-15")
    if g4 and num_g2 is None:
        return _struct_rule("enable_g4_storage", True,
                            "enable_g4_storage requires num_g2_blocks because mocker stages G4 through G2", "ARGS-15")
    if nextn is not None and decode_speedup_ratio != 1.0:
        return _struct_rule("decode_speedup_ratio", decode_speedup_ratio,
                            "aic_nextn requires decode_speedup_ratio=1.0 because MTP output acceleration is modeled by "
                            f"burst sampling, got {rust_display(float(decode_speedup_ratio))}", "ARGS-10")
    if nextn is None and rates is not None:
        return _struct_rule("aic_nextn_accept_rates", rates, "aic_nextn_accept_rates requires aic_nextn", "ARGS-10")
    return None


def engine_args_from_json(obj: Any, *, dialect: str = "json") -> EngineArgs:
    """Rules: ARGS-11 .. ARGS-15. Build :class:`EngineArgs` from engine-args JSON / constructor kwargs.

    ``dialect="json"``: the ``--extra-engine-args`` / ``MockEngineArgs.from_json``
    object.  ``dialect="kwargs"``: ``MockEngineArgs(**obj)``.  Raises
    :class:`InvalidInput` for unknown keys, wrong types, invalid values, and for
    accepted upstream inputs that would select behaviour the model does not
    implement (ARGS-14).
    """
    if dialect not in ("json", "kwargs"):
        raise ValueError(f"unknown dialect {dialect!r}")
    if not isinstance(obj, Mapping):
        raise InvalidInput("engine_args", obj, "must be a JSON object", rule="ARGS-11")
    try:
        return _engine_args_from(obj, dialect)
    except InvalidInput as err:
        if not getattr(err, "normalization", False):
            raise
        # ARGS-20: a refusal of upstream's normalization, as the dialect's caller words it
        raise InvalidInput(err.field, err.value, _VALIDATION_PREFIX[dialect] + err.reason, rule=err.rule) from None


def _engine_args_from(obj: Mapping[Any, Any], dialect: str) -> EngineArgs:
    """:func:`engine_args_from_json` after its argument checks."""
    if dialect == "json":
        values = _read_json_object(obj)
        fields = _json_conversion(values)
    else:
        values = _read_constructor_keywords(obj)
        fields = _constructor_enumerations(values)

    # ARGS-1: plain copies (num_gpu_blocks: null keeps the default).
    if values.get("num_gpu_blocks") is not None:
        fields["num_gpu_blocks"] = values["num_gpu_blocks"]
    for key in (
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "speedup_ratio",
        "decode_speedup_ratio",
        "dp_size",
        "startup_time",
        "kv_bytes_per_token",
        "kv_transfer_bandwidth",
        "zmq_kv_events_port",
        "handoff_session_timeout_ms",
        "aic_tp_size",
        "aic_attention_dp_size",
    ):
        if key in values:
            fields[key] = values[key]
    if values.get("sglang") is not None:
        fields["sglang"] = SglangArgs(**values["sglang"])
    if values.get("trtllm") is not None:
        fields["trtllm_capacity_scheduler_policy"] = values["trtllm"].get("capacity_scheduler_policy")

    # ARGS-6: ranges of fields the model accepts but does not model.
    for key, (lo, hi) in _F64_RANGES.items():
        value = values.get(key)
        if value is not None and (value < lo or (hi is not None and value > hi)):
            bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise InvalidInput(key, value, f"must be {bound}", rule="ARGS-6")
    # ARGS-15, ARGS-10: upstream's struct-level rules on the arguments the model keeps outside
    # EngineArgs. Upstream runs its struct rules only when every field range passed, in this order:
    # block size (ARGS-7), these, then the TRT-LLM policy and the SGLang rules (ARGS-10, ARGS-8/9)
    # (common/protocols.rs:905-990); the model's own finite-float refusal (ARGS-5) comes last.
    num_g2 = values.get("num_g2_blocks") or None
    num_g3 = values.get("num_g3_blocks") or None
    nextn = values.get("aic_nextn")
    rates = values.get("aic_nextn_accept_rates")
    if nextn is not None and not 1 <= nextn <= 5:  # a field range (validator attribute), so first
        raise InvalidInput("aic_nextn", nextn, "must be in 1..=5", rule="ARGS-10")
    rule_error = _offload_and_mtp_rules(num_g2, num_g3, bool(values.get("enable_g4_storage")), nextn, rates,
                                        fields.get("decode_speedup_ratio", 1.0))
    try:
        args = EngineArgs(**fields)  # ARGS-2 and ARGS-4 .. ARGS-10 on the modelled arguments
    except InvalidInput as error:
        if rule_error is not None and error.rule not in ("ARGS-4", "ARGS-6", "ARGS-7"):
            raise rule_error from None
        if error.rule == "ARGS-5" and nextn is not None:  # upstream parses the rates; ARGS-5 is the model's
            _normalize_accept_rates(nextn, rates)
        raise
    if rule_error is not None:
        raise rule_error

    if nextn is not None:
        _normalize_accept_rates(nextn, rates)
    # ARGS-5: the constructor dialect's non-finite floats in the arguments the model does not
    # model (the modelled ones were refused last by the construction above)
    for key in _SIGNATURE_ORDER:
        value = values.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(key, value, "must be a finite number", rule="ARGS-5")

    # ARGS-14: accepted upstream, but selects behaviour the model does not implement.
    if values.get("planner_profile_data") is not None:  # the JSON dialect's place (ARGS-14)
        raise _planner_not_supported(values["planner_profile_data"])
    if values.get("aic_backend") is not None:
        raise InvalidInput(
            "aic_backend", values["aic_backend"], "the AIC perf model is not supported by the model", rule="ARGS-14"
        )
    if nextn is not None:
        raise InvalidInput("aic_nextn", nextn, "MTP speculative decoding is not supported by the model", rule="ARGS-14")
    if num_g2 is not None:
        raise InvalidInput(
            "num_g2_blocks", num_g2, "KVBM G2/G3/G4 offload is not supported by the model", rule="ARGS-14"
        )
    return args
