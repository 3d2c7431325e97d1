"""The engine-core interface shared by the vLLM/TRT-LLM and SGLang cores (spec/core-commands.md, CORE-1).

A core is a frozen value.  Every operation is a pure function returning the new
core and what the operation produced:

* ``apply_command_effects(core, command, allow_destination_admission)`` -> ``(core, CommandEffects)``
* ``apply_command(core, command)`` -> ``(core, CommandResult)`` (effects with the lifecycle
  events discarded, upstream S2)
* ``execute_pass(core, now_ms)`` / ``execute_hidden_pass(core, now_ms)`` -> ``(core, PassResult)``
* ``retry_pending_destinations(core)`` -> ``(core, RetryEffects)``
* queries: ``is_empty``, ``is_drained``, ``num_requests``, ``metrics``

:func:`new_core` dispatches on the engine type so callers never branch on it;
the module-level functions below dispatch on the core's class.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import attrs

from .engine_args import EngineArgs, EngineType
from .fpm import ForwardPassSnapshot
from .protocol import AdmissionEvent, Command, CommandResult, LifecycleEvent, OutputSignal


@attrs.frozen
class MockerMetrics:
    """CORE-4: the scheduler metrics taken at the end of every pass."""

    dp_rank: int
    active_decode_blocks: int
    total_blocks: int
    gpu_cache_usage_perc: float
    running_requests: int
    waiting_requests: int
    vllm_preemptions_total: int = 0
    sglang_cache_hit_tokens: int = 0
    sglang_cache_total_tokens: int = 0

    @classmethod
    def from_parts(cls, dp_rank, active, total, running, waiting, preemptions=0, hit=0, cache_total=0):
        """CORE-4: ``gpu_cache_usage_perc = active / total`` (0 when total is 0)
        (lib/mocker/src/scheduler/vllm/live.rs:36-62)."""
        perc = 0.0 if total == 0 else float(active) / float(total)
        return cls(dp_rank, active, total, perc, running, waiting, preemptions, hit, cache_total)


class Deferred:
    """CORE-3: a pure value computed on first use and kept (the vLLM pass's FPM snapshot, which
    only the step trace reads in full and the driver reads only for an otherwise idle pass).

    ``compute`` must be a pure function of values nobody changes afterwards."""

    __slots__ = ("_compute", "_value")

    def __init__(self, compute: Callable[[], Any]) -> None:
        self._compute: Optional[Callable[[], Any]] = compute
        self._value: Any = None

    def get(self) -> Any:
        if self._compute is not None:
            self._value = self._compute()
            self._compute = None
        return self._value

    def __repr__(self) -> str:
        return repr(self.get())


def _resolved(value: Any) -> Any:
    return value.get() if type(value) is Deferred else value


def _same_fpm(a: Any, b: Any) -> bool:
    return _resolved(a) == _resolved(b)


@attrs.frozen
class PassResult:
    """CORE-3: what one scheduling pass produced.

    ``token_ms`` is the timestamp every token of the pass is stamped with (and
    admissions are stamped ``now_ms``), so a driver can feed its collector.
    ``fpm`` may be given as a :class:`Deferred`; reading it (and comparing results)
    gives the snapshot either way.
    """

    now_ms: float
    end_ms: float
    token_ms: float
    completed_requests: int
    output_signals: Tuple[OutputSignal, ...]
    admissions: Tuple[AdmissionEvent, ...]
    lifecycle_events: Tuple[LifecycleEvent, ...]
    metrics: MockerMetrics
    router_event_visibility: str  # "pass_start" (vLLM) or "pass_end" (SGLang)
    kv_events: Tuple[object, ...]
    _fpm: Any = attrs.field(
        alias="fpm", eq=attrs.cmp_using(eq=_same_fpm, require_same_type=False), hash=False
    )
    accept_length_output_tokens: int
    accept_length_decode_forwards: int

    @property
    def fpm(self) -> Optional[ForwardPassSnapshot]:
        return _resolved(self._fpm)


@attrs.frozen
class RetryEffects:
    """CORE-5: the lifecycle and KV events of one standalone retry."""

    lifecycle_events: Tuple[LifecycleEvent, ...] = ()
    kv_events: Tuple[object, ...] = ()


def new_core(args: EngineArgs, *, dp_rank: int = 0, capture_kv_events: bool = False):
    """CORE-2: build an empty core for ``args`` (vLLM and TRT-LLM share the vLLM core)."""
    if args.engine_type in (EngineType.VLLM, EngineType.TRTLLM):
        from .vllm_core import new_vllm_core

        return new_vllm_core(args, dp_rank=dp_rank, capture_kv_events=capture_kv_events)
    from .sglang_core import new_sglang_core  # pragma: no cover - until the SGLang core lands

    return new_sglang_core(args, dp_rank=dp_rank, capture_kv_events=capture_kv_events)


def _impl(core):
    return type(core).ops


def apply_command_effects(core, command: Command, allow_destination_admission: bool = True):
    return _impl(core).apply_command_effects(core, command, allow_destination_admission)


def apply_command(core, command: Command) -> Tuple[object, CommandResult]:
    """CMD-9: ``apply_command_effects(command, allow=True)`` with its lifecycle events dropped (S2)."""
    new, effects = apply_command_effects(core, command, True)
    return new, effects.result


def execute_pass(core, now_ms: float):
    return _impl(core).execute_pass(core, now_ms)


def execute_hidden_pass(core, now_ms: float):
    """CORE-3: identical scheduling and timing; only a driver's collector differs."""
    return _impl(core).execute_pass(core, now_ms)


def retry_pending_destinations(core, now_ms: Optional[float] = None):
    return _impl(core).retry_pending_destinations(core, now_ms)


def is_empty(core) -> bool:
    return _impl(core).is_empty(core)


def is_drained(core) -> bool:
    return _impl(core).is_drained(core)


def num_requests(core) -> int:
    return _impl(core).num_requests(core)


def metrics(core) -> MockerMetrics:
    return _impl(core).metrics(core)


def request_status(core, request_id) -> Optional[str]:
    """CORE-6: where the scheduler holds ``request_id``: ``"waiting"`` (prebuilt prompt),
    ``"waiting(fresh)"`` (prompt still to be computed), ``"running"``, ``"preempted"``, or
    ``None`` when the scheduler does not own it.  Read-only; used by observers (the explorer)."""
    return _impl(core).request_status(core, request_id)


def queues(core) -> Tuple[Tuple[object, ...], Tuple[object, ...]]:
    """CORE-6: the live waiting and running request ids, in scheduling order, each once."""
    return _impl(core).queues(core)
