"""LIVE-6: why a replay reached a dead end, from the workers that still hold requests.

A dead end (DRV-11, DRV-16, DIS-15) is upstream's own error and keeps upstream's text; this module
only explains it. Each stuck worker is classified from its core alone, with one counterfactual run
of the model: the head of its waiting queue submitted by itself to an empty core of the same
configuration (:func:`completes_alone`).

Pure: cores are values and nothing here changes them.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import attrs

from model import core as C
from model.engine_args import EngineArgs
from model.errors import ModelError
from model.protocol import DirectRequest, Submit

from .common import made_progress

__all__ = ["StuckWorker", "DeadEndDiagnosis", "CAUSES", "diagnose_stuck", "diagnose_dead_end", "completes_alone",
           "head_payload"]

#: LIVE-6: a lone request that makes no progress for this many passes in a row never will (the
#: single-worker driver's own dead-end bound, DRV-11)
QUIET_PASSES = 1024
#: LIVE-6: passes a lone request may take before the counterfactual gives up (a zero-time
#: self-preemption loop, LIVE-5, reports progress forever)
MAX_ALONE_PASSES = 20_000


@attrs.frozen
class StuckWorker:
    """A worker that still holds requests when the replay stopped: its stage (``aggregated``,
    ``prefill`` or ``decode``), index, core and engine arguments."""

    stage: str
    worker_idx: int
    core: Any = attrs.field(eq=False, repr=False)
    args: EngineArgs = attrs.field(eq=False, repr=False)


@attrs.frozen
class DeadEndDiagnosis:
    """LIVE-6: one stuck worker's cause (``cause`` is one of :data:`CAUSES`) and a readable line."""

    stage: str
    worker_idx: int
    cause: str
    text: str


#: LIVE-6 causes, in the order they are tested
CAUSES = (
    "zero_output_running",  # nothing waits; a running request asks for 0 output tokens (VLLM-Q4)
    "no_waiting_request",  # holds only reservations or held sources: it waits for another worker
    "retracted_destination",  # SGLang: S9, second half (spec/model-checking.md section 6)
    "never_completes_alone",  # the head cannot finish even alone on an empty worker (configuration)
    "blocked_head_before_activated_destination",  # vLLM: S6 (section 6)
    "half_prefilled_head",  # SGLang: S8's mechanism (section 6)
    "interaction",  # anything else
)


def _is_sglang(core) -> bool:
    """SGLang cores keep their requests in queues and look them up by id (``find``)."""
    return hasattr(core, "find")


def head_payload(core) -> Optional[DirectRequest]:
    """The head of ``core``'s waiting queue as a plain request (its prompt and output budget), or
    ``None`` when nothing waits. vLLM and TRT-LLM keep a sequence per request, SGLang the request."""
    waiting, _running = C.queues(core)
    if not waiting:
        return None
    uuid = waiting[0]
    if _is_sglang(core):
        req = core.find(uuid)
        return DirectRequest(tuple(req.prompt), req.max_output_tokens, uuid=uuid)
    seq = core.requests[uuid].sequence  # vLLM / TRT-LLM: a map from id to request
    return DirectRequest(tuple(seq.prompt), seq.max_output_tokens, uuid=uuid)


def completes_alone(args: EngineArgs, request: DirectRequest) -> bool:
    """LIVE-6 counterfactual: ``request`` submitted alone to an empty core built from ``args``,
    passes run back to back (time taken from each pass's end), completes (an output signal that
    completes it without rejecting it, VLLM-13 / SG-25 reject a prompt the pool can never hold).
    False when it is rejected, when QUIET_PASSES passes in a row make no progress (DRV-6's notion)
    or when MAX_ALONE_PASSES pass without draining."""
    core = C.new_core(args)
    try:
        core, _ = C.apply_command(core, Submit(request))
    except ModelError:
        return False
    now = 0.0
    quiet = 0
    for _ in range(MAX_ALONE_PASSES):
        core, res = C.execute_pass(core, now)
        for sig in res.output_signals:
            if sig.completed or sig.rejected:
                return sig.completed and not sig.rejected
        quiet = 0 if made_progress(res) else quiet + 1
        if quiet >= QUIET_PASSES:
            return False
        now = max(now, res.end_ms)
    return False


def _max_output_tokens(core, uuid) -> int:
    if _is_sglang(core):
        return core.find(uuid).max_output_tokens
    return core.requests[uuid].sequence.max_output_tokens


def diagnose_stuck(w: StuckWorker) -> DeadEndDiagnosis:
    """LIVE-6: classify one stuck worker (the first cause of :data:`CAUSES` that applies)."""
    core = w.core
    where = f"{w.stage} worker {w.worker_idx}"
    waiting, running = C.queues(core)
    m = C.metrics(core)
    free = m.total_blocks - m.active_decode_blocks
    units = f"{free} of {m.total_blocks} blocks free"
    led = getattr(core, "ledger", None)
    active = frozenset(led.active_destinations.by_handoff.values()) if led is not None else frozenset()

    def made(cause: str, text: str) -> DeadEndDiagnosis:
        return DeadEndDiagnosis(w.stage, w.worker_idx, cause, f"{where}: {text}")

    head = head_payload(core)
    if head is None:
        zero = [u.value for u in running if _max_output_tokens(core, u) == 0]
        if zero:
            return made("zero_output_running",
                        f"no request waits; {', '.join(zero)} runs with max_output_tokens 0, so it is never "
                        f"ready to emit and never completes (VLLM-Q4; {units})")
        return made("no_waiting_request", f"no request waits ({len(running)} running); it holds reservations "
                                          f"or held sources for other workers ({units})")
    name = head.uuid.value
    status = C.request_status(core, head.uuid)
    n = len(waiting)
    is_sglang = _is_sglang(core)
    if is_sglang and not running and head.uuid in active and status == "waiting(fresh)":
        alone = "passes" if completes_alone(w.args, head) else "fails even"
        return made("retracted_destination",
                    f"the head {name} is an activated destination that was retracted and must be prefilled "
                    f"again as a fresh request; that admission {alone} alone on an empty worker, and never "
                    f"passes here (S9; {units})")
    if not completes_alone(w.args, head):
        return made("never_completes_alone",
                    f"the head {name} ({len(head.tokens)} prompt tokens, {status}) cannot complete even alone "
                    f"on an empty worker of this configuration; {n} request(s) wait behind or with it ({units})")
    behind = [u for u in waiting[1:] if u in active]
    if not is_sglang and not running and behind:
        return made("blocked_head_before_activated_destination",
                    f"the head {name} ({status}) does not fit now though it completes alone on an empty "
                    f"worker, and {len(behind)} activated destination(s) behind it hold the blocks it needs "
                    f"(S6; {units})")
    part = core.find(head.uuid).materialized_tokens if is_sglang and not running else 0
    if part > 0:
        why = ("a destination is pending, so no prefill batch runs (SG-28)" if led is not None
               and led.pending_destinations.live_order() else
               "its next chunk and output reserve never pass the admission check (SG-12)")
        return made("half_prefilled_head",
                    f"the head {name} was prefilled in part ({part} of {len(head.tokens)} prompt tokens) and "
                    f"keeps those slots, but {why}, though alone on an empty worker it completes "
                    f"(S8's mechanism; {units})")
    return made("interaction", f"the head {name} ({status}) completes alone but not here; "
                               f"{n} waiting, {len(running)} running ({units})")


def diagnose_dead_end(stuck: Tuple[StuckWorker, ...]) -> Tuple[DeadEndDiagnosis, ...]:
    """LIVE-6: one diagnosis per stuck worker, in pool order."""
    return tuple(diagnose_stuck(w) for w in stuck)
