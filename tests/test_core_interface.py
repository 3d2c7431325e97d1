"""The engine-core interface and the shared command skeleton (spec/core-commands.md)."""

from __future__ import annotations

import pytest

from model import core as C
from model.core import MockerMetrics
from model.engine_args import engine_args_from_json
from model.errors import RequestAlreadyActive
from model.handoff_commands import MissingRequestId
from model.ids import HandoffId, RequestId
from model.protocol import (
    CancelDestination,
    DestinationAccepted,
    DestinationReserved,
    DirectRequest,
    ReserveDestination,
    Submit,
    Submitted,
)
from model.vllm_core import VllmCore


def _core(**over):
    return C.new_core(engine_args_from_json({"num_gpu_blocks": 4, "block_size": 4, **over}))


def test_new_core_dispatches_on_engine_type():
    """CORE-2: vLLM and TRT-LLM share the vLLM core."""
    assert isinstance(_core(engine_type="vllm"), VllmCore)
    trt = _core(engine_type="trtllm")
    assert isinstance(trt, VllmCore) and trt.args.engine_type == "trtllm"


def test_submit_returns_submitted_and_rejects_duplicates_and_missing_ids():
    """CMD-1, CMD-2: Submitted(r); a second submit of r, or a request without id, is rejected
    and the old core is untouched."""
    core = _core()
    core, eff = C.apply_command_effects(core, Submit(DirectRequest([1, 2, 3], 2, "a")))
    assert eff.result == Submitted("a") and eff.lifecycle_events == ()
    with pytest.raises(RequestAlreadyActive):
        C.apply_command_effects(core, Submit(DirectRequest([1], 1, "a")))
    with pytest.raises(MissingRequestId):
        C.apply_command_effects(core, Submit(DirectRequest([1], 1, None)))
    assert C.num_requests(core) == 1


def test_metrics_usage_is_active_over_total():
    """CORE-4: gpu_cache_usage_perc = active / total, 0 for an empty pool."""
    m = MockerMetrics.from_parts(0, 3, 12, 1, 2)
    assert m.gpu_cache_usage_perc == 0.25
    assert MockerMetrics.from_parts(0, 0, 0, 0, 0).gpu_cache_usage_perc == 0.0
    assert C.metrics(_core()).total_blocks == 4


def test_standalone_retry_reserves_the_head_once():
    """CORE-5, RETRY-3, RETRY-4: a reservation queued without admission is reserved by the next
    retry, which pops it into the destination holds and reports DestinationReserved; the
    transferable tokens are the unpublished blocks times the block size (6 tokens → 2 blocks → 8)."""
    core = _core()
    core, eff = C.apply_command_effects(core, ReserveDestination("h", DirectRequest([1] * 6, 2, "d")), False)
    assert eff.result == DestinationAccepted("d") and eff.lifecycle_events == ()
    core, ret = C.retry_pending_destinations(core)
    assert ret.lifecycle_events == (DestinationReserved("h", "d", 8),)
    assert core.ledger.destination_holds.contains(HandoffId("h"))
    assert core.destination_reservation_attempts == 1
    core, ret = C.retry_pending_destinations(core)
    assert ret.lifecycle_events == () and core.destination_reservation_attempts == 1
    core, eff = C.apply_command_effects(core, CancelDestination("h"))
    assert C.is_drained(core)
    assert RequestId("d") not in core.requests


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_observers_follow_a_request_through_the_queues(engine):
    """CORE-6: a submitted request is waiting(fresh) and listed once in the waiting queue; after a
    pass it is running and listed in the running queue; an unknown id has no status."""
    core = _core(engine_type=engine)
    core, _ = C.apply_command_effects(core, Submit(DirectRequest([1, 2, 3], 3, "a")))
    assert C.request_status(core, RequestId("a")) == "waiting(fresh)"
    assert C.queues(core) == ((RequestId("a"),), ())
    core, _ = C.execute_pass(core, 0.0)
    assert C.request_status(core, RequestId("a")) == "running"
    assert C.queues(core) == ((), (RequestId("a"),))
    assert C.request_status(core, RequestId("zz")) is None
