"""Offline trace replay drivers (spec/replay.md DRV, DIS and LIVE rules).

Pure: simulated time only, no I/O, no clocks, no randomness.  Each driver is a
function from (arguments, workload, empty collector) to the filled collector;
its mutable bookkeeping lives in a local object that never escapes the call.

Entry point: :func:`run_replay` (DRV-1) picks the runtime exactly as upstream:
disaggregated args give the disaggregated runtime; aggregated args with one
worker give the single-worker runtime; more workers give the event-loop
runtime.  Engine cores are used only through :mod:`model.core`, so any core
implementing that interface (vLLM/TRT-LLM now, SGLang when it lands) plugs in.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import attrs

from model.engine_args import EngineArgs, check_aggregated_replay_args, check_disagg_replay_args
from model.errors import InvalidInput
from model.report import SlaThresholds, TraceCollector
from model.workload import FlatWorkload, SessionWorkload, canonical_trace_format

from .admission import WorkloadDriver
from .agg import run_agg
from .common import ReplayDeadEnd, ReplayError
from .disagg import handoff_order, run_disagg
from .livelock import LivelockDiagnosis, ReplayLivelock
from .single import run_single

__all__ = [
    "ReplaySetup",
    "run_replay",
    "check_setup",
    "check_binding_arguments",
    "check_mode_arguments",
    "ReplayError",
    "ReplayDeadEnd",
    "ReplayLivelock",
    "LivelockDiagnosis",
]


@attrs.frozen
class ReplaySetup:
    """DRV-1: what to replay on: aggregated args (``engine_args``) or prefill + decode args."""

    engine_args: Optional[EngineArgs] = None
    prefill_args: Optional[EngineArgs] = None
    decode_args: Optional[EngineArgs] = None
    num_workers: int = 1
    num_prefill_workers: int = 1
    num_decode_workers: int = 1
    replay_concurrency: Optional[int] = None
    router_mode: str = "round_robin"
    #: DRV-18: stop the scheduling loop once the next timestamp passes this (None: no cap)
    max_sim_time_ms: Optional[float] = None
    #: REP-12: goodput thresholds (validated when built, as the binding checks its arguments)
    sla: SlaThresholds = attrs.field(factory=SlaThresholds)

    @property
    def is_disagg(self) -> bool:
        return self.prefill_args is not None or self.decode_args is not None


def check_setup(setup: ReplaySetup, *, trace_format: Optional[str] = None, synthetic: bool = False) -> None:
    """DRV-1: the binding's argument checks, in its order, then upstream's (validate.rs:9-185):
    :func:`check_binding_arguments`, then :func:`check_mode_arguments`. A trace file is read only
    after both; the synthetic entry point builds its workload between the two (DRV-1).
    Given two bad arguments, the refusal names the earlier one, as the compiled build does."""
    check_binding_arguments(setup, trace_format=trace_format, synthetic=synthetic)
    check_mode_arguments(setup)


def check_binding_arguments(setup: ReplaySetup, *, trace_format: Optional[str] = None,
                            synthetic: bool = False) -> None:
    """DRV-1: the binding's own checks. Trace entry point (binding:876-935): the args and worker
    counts, ``router_mode``, the ``trace_format`` when given (WL-19), ``max_sim_time_ms`` (DRV-18),
    the SLA thresholds (REP-12), ``replay_concurrency`` (binding:1689-1695). The synthetic entry
    point (``synthetic=True``, binding:1128-1169) checks the SLA thresholds first."""
    if synthetic:
        setup.sla.check()
    for name in ("num_workers", "num_prefill_workers", "num_decode_workers"):
        v = getattr(setup, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidInput(name, v, "must be a non-negative integer", rule="DRV-1")
    if setup.engine_args is not None and setup.is_disagg:
        raise InvalidInput("extra_engine_args", "given",
                           "extra_engine_args cannot be combined with prefill_engine_args/decode_engine_args",
                           rule="DRV-1")
    if setup.is_disagg:
        if setup.prefill_args is None or setup.decode_args is None:
            raise InvalidInput("prefill_engine_args" if setup.prefill_args is None else "decode_engine_args", None,
                               "prefill_engine_args and decode_engine_args must be provided together", rule="DRV-1")
        if setup.num_workers != 1:
            raise InvalidInput("num_workers", setup.num_workers,
                               "num_workers is only used for aggregated replay; use num_prefill_workers and "
                               "num_decode_workers for disagg replay", rule="DRV-1")
    elif setup.num_prefill_workers != 1 or setup.num_decode_workers != 1:
        bad = "num_prefill_workers" if setup.num_prefill_workers != 1 else "num_decode_workers"
        raise InvalidInput(bad, getattr(setup, bad),
                           "num_prefill_workers and num_decode_workers are only used for disagg replay; "
                           "use num_workers for aggregated replay", rule="DRV-1")
    if setup.router_mode not in ("round_robin", "kv_router"):
        raise InvalidInput("router_mode", setup.router_mode,
                           f"router_mode must be either 'round_robin' or 'kv_router', got '{setup.router_mode}'",
                           rule="DRV-1")
    if trace_format is not None:
        canonical_trace_format(trace_format)
    cap = setup.max_sim_time_ms
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap)
                            or cap < 0.0):
        raise InvalidInput("max_sim_time_ms", cap, "max_sim_time_ms must be a finite, non-negative value",
                           rule="DRV-18")
    if not synthetic:
        setup.sla.check()
    if setup.replay_concurrency is not None and (
        isinstance(setup.replay_concurrency, bool)
        or not isinstance(setup.replay_concurrency, int)
        or setup.replay_concurrency < 1
    ):
        raise InvalidInput("replay_concurrency", setup.replay_concurrency, "replay_concurrency must be at least 1",
                           rule="DRV-1")


def check_mode_arguments(setup: ReplaySetup) -> None:
    """DRV-1, ARGS-18: upstream's mode checks (validate.rs:9-185), which the entry points run
    before they read a trace file and after they built a synthetic workload."""
    mode = "trace replay" if setup.replay_concurrency is None else "concurrency replay"  # ARGS-18's texts
    if setup.is_disagg:
        check_disagg_replay_args(setup.prefill_args, setup.decode_args, setup.num_prefill_workers,
                                 setup.num_decode_workers, mode)
        handoff_order(setup.prefill_args, setup.decode_args)
    else:
        if setup.router_mode == "kv_router" and setup.num_workers <= 1:
            raise InvalidInput("router_mode", "kv_router",
                               "offline replay only supports router_mode=kv_router when num_workers > 1", rule="DRV-1")
        check_aggregated_replay_args(setup.engine_args or EngineArgs(), setup.num_workers, mode)
    if setup.router_mode == "kv_router":
        raise InvalidInput("router_mode", "kv_router", "kv_router replay is not supported yet by the model",
                           rule="DRV-1")


def run_replay(
    setup: ReplaySetup,
    workload: Union[FlatWorkload, SessionWorkload],
    *,
    capture_per_request: bool = True,
    collector: Optional[TraceCollector] = None,
    on_progress: Optional[Callable[[int, int], None]] = None,
) -> TraceCollector:
    """DRV-1: run one offline replay and return the filled collector (``model.report.finish`` makes the report).

    Raises :class:`ReplayDeadEnd` (upstream's dead-end error), :class:`ReplayLivelock`
    (where upstream spins forever), :class:`~model.errors.InvalidInput` for bad setups.
    ``on_progress(done, total)`` is an optional observer; it cannot change the run.
    """
    check_setup(setup)
    col = collector if collector is not None else TraceCollector()
    if setup.sla.is_set:
        col = col.with_sla(setup.sla)
    if capture_per_request:
        col = col.with_capture_per_request()
    conc = setup.replay_concurrency
    cap = setup.max_sim_time_ms
    if isinstance(workload, SessionWorkload):  # DRV-17: the session workload driver
        reqs = WorkloadDriver(workload.trace, conc, workload.accumulate_deltas)
    else:
        reqs = workload.requests
    if setup.is_disagg:
        return run_disagg(setup.prefill_args, setup.decode_args, setup.num_prefill_workers, setup.num_decode_workers,
                          reqs, conc, col, on_progress, max_sim_time_ms=cap)
    args = setup.engine_args or EngineArgs()
    if setup.num_workers == 1 and setup.router_mode != "kv_router":
        return run_single(args, reqs, conc, col, on_progress, max_sim_time_ms=cap)
    return run_agg(args, setup.num_workers, reqs, conc, col, on_progress, max_sim_time_ms=cap)
