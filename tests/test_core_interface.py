"""The engine-core interface and the shared command skeleton (spec/core-commands.md)."""

from __future__ import annotations

import attrs
import pytest

from model import core as C
from model.core import MockerMetrics
from model.engine_args import engine_args_from_json
from model.errors import RequestAlreadyActive
from model.handoff_commands import MissingRequestId
from model.ids import HandoffId, RequestId
from model.protocol import (
    NOOP,
    ActivateDestination,
    Applied,
    CancelDestination,
    CancelSource,
    DestinationAccepted,
    DestinationReserved,
    DirectRequest,
    ReleaseSource,
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


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_unchanged_command_returns_input_core(engine):
    """CORE-7: a cancel or release of an unknown handoff, a retry with no head due and a pass with
    nothing to schedule return the input core object itself; a command that changes something
    returns a new core and leaves the old one as it was."""
    core = _core(engine_type=engine)
    idle, res = C.execute_pass(core, 0.0)
    assert idle is core and res.end_ms == 0.0
    core, _ = C.apply_command_effects(core, Submit(DirectRequest([1, 2, 3], 2, "a")))
    if engine == "vllm":  # TRT-LLM refuses destinations (TRT-4)
        core, _ = C.apply_command_effects(core, ReserveDestination("h", DirectRequest([1] * 6, 2, "d")))
        assert core.ledger.destination_holds.contains(HandoffId("h"))
    for command in (CancelDestination("nobody"), CancelSource("nobody"), ReleaseSource("nobody"),
                    ActivateDestination("nobody")):
        new, eff = C.apply_command_effects(core, command)
        assert eff.result == NOOP and new is core, command
    new, ret = C.retry_pending_destinations(core)
    assert ret.lifecycle_events == () and new is core
    if engine == "vllm":
        new, eff = C.apply_command_effects(core, CancelDestination("h"))
        assert eff.result == Applied() and new is not core
        assert core.ledger.destination_holds.contains(HandoffId("h"))
        assert not new.ledger.destination_holds.contains(HandoffId("h"))
    new, _ = C.apply_command_effects(core, Submit(DirectRequest([4], 1, "b")))
    assert new is not core and RequestId("b") not in core.requests


def test_ledger_helpers_return_their_input_when_nothing_changes():
    """CORE-7: the ledger helpers return their input ledger when every part they set is the one it
    already holds, and a ledger sharing every part it did not set otherwise."""
    from model import handoff_commands as hc

    led = _core().ledger
    assert hc._evolve(led, pending_destinations=led.pending_destinations, source_holds=led.source_holds) is led
    assert hc._set_source(led, led.source_holds) is led
    holds, _ = led.source_holds.register(RequestId("r"), HandoffId("h"))
    changed = hc._set_source(led, holds)
    assert changed is not led and changed.source_holds is holds
    assert changed.pending_destinations is led.pending_destinations
    assert changed.destination_holds is led.destination_holds
    assert led.source_holds is not holds and not led.source_holds.contains_handoff(HandoffId("h"))


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


# -- suspected upstream defects reproduced as rules (spec/model-checking.md §6, class (b)) --------

def _tight(engine):
    """A pool with room for exactly one 8-token destination (vLLM: 2 blocks of 4; SGLang: 8 slots)."""
    if engine == "vllm":
        return C.new_core(engine_args_from_json({"engine_type": "vllm", "num_gpu_blocks": 2, "block_size": 4}))
    return C.new_core(engine_args_from_json({"engine_type": "sglang", "num_gpu_blocks": 8, "block_size": 1}))


def _queue_two_behind_a_holder(engine):
    """hX reserved (fills the pool), then hA and hB queued behind it with admission allowed: the
    probes fail for want of space, so both stay pending (A at the head)."""
    core = _tight(engine)
    core, eff = C.apply_command_effects(core, ReserveDestination("hX", DirectRequest([9] * 8, 1, "x")), True)
    assert eff.lifecycle_events == (DestinationReserved("hX", "x", 8),)
    for h, r, tok in (("hA", "a", 1), ("hB", "b", 2)):
        core, eff = C.apply_command_effects(core, ReserveDestination(h, DirectRequest([tok] * 4, 1, r)), True)
        assert eff.lifecycle_events == ()
    assert len(core.ledger.pending_destinations) == 2
    return core


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_s2_apply_command_drops_the_retrys_destination_reserved(engine):
    """CMD-9 (upstream S2): cancelling the holder frees the pool and the retry reserves the head;
    ``apply_command_effects`` reports DestinationReserved(hA), ``apply_command`` returns only
    ``Applied`` -- yet the reservation is in the core either way."""
    core = _queue_two_behind_a_holder(engine)
    with_events, eff = C.apply_command_effects(core, CancelDestination("hX"), True)
    assert eff.result == Applied() and [e.handoff_id for e in eff.lifecycle_events] == [HandoffId("hA")]
    silent, result = C.apply_command(core, CancelDestination("hX"))
    assert result == Applied()
    assert silent.ledger.destination_holds.contains(HandoffId("hA"))
    assert silent == with_events


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_s3_cancel_retries_even_without_destination_admission(engine):
    """CMD-9 (upstream S3): ``allow_destination_admission=False`` does not stop the retry that an
    applied cancel runs: the head is reserved anyway."""
    core = _queue_two_behind_a_holder(engine)
    core, eff = C.apply_command_effects(core, CancelDestination("hX"), False)
    assert [e.handoff_id for e in eff.lifecycle_events] == [HandoffId("hA")]
    assert core.ledger.destination_holds.contains(HandoffId("hA"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_s4_one_reservation_per_retry(engine):
    """RETRY-4 (upstream S4): the freed 8 tokens would hold both 4-token destinations, but one
    retry reserves only the head; B stays pending until the next capacity change or retry call."""
    core = _queue_two_behind_a_holder(engine)
    core, eff = C.apply_command_effects(core, CancelDestination("hX"), True)
    assert len(eff.lifecycle_events) == 1
    assert core.ledger.pending_destinations.contains_handoff(HandoffId("hB"))
    assert not core.ledger.destination_holds.contains(HandoffId("hB"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_s14_cancelling_a_non_head_pending_entry_bumps_the_generation(engine):
    """CMD-8 step 1 (upstream S14): cancelling B, which is pending behind the head A, frees no KV
    but still bumps the capacity generation (and the retry it triggers probes A again)."""
    core = _queue_two_behind_a_holder(engine)
    g = core.ledger.capacity_generation
    core, eff = C.apply_command_effects(core, CancelDestination("hB"), True)
    assert eff.result == Applied()
    assert core.ledger.capacity_generation == g + 1
    assert not core.ledger.pending_destinations.contains_handoff(HandoffId("hB"))


def test_deferred_fpm_equals_the_eager_snapshot(monkeypatch):
    """CORE-3: the vLLM pass defers its FPM snapshot; reading it gives what computing it at pass
    end gives (the pass's scratch and end state are final), and results compare by value."""
    from model import vllm_core
    from model.core import Deferred

    core = _core(num_gpu_blocks=16)
    core, _ = C.apply_command_effects(core, Submit(DirectRequest([1, 2, 3, 4, 5], 3, "a")))
    core, _ = C.apply_command_effects(core, Submit(DirectRequest([6] * 40, 2, "b")))
    core, _ = C.apply_command_effects(core, Submit(DirectRequest([7] * 30, 2, "c")))
    _, res = C.execute_pass(core, 0.0)
    assert type(res._fpm) is Deferred
    # the same pass with the snapshot computed at once, inside the pass
    monkeypatch.setattr(vllm_core, "Deferred", lambda compute: compute())
    _, eager_res = C.execute_pass(core, 0.0)
    eager = eager_res._fpm
    assert type(eager) is not Deferred
    # 16 blocks of 4 tokens: "a" (2 blocks) and "b" (10) are admitted, "c" (8) no longer fits and
    # stays queued: 2 scheduled prefills of 5 + 40 tokens, 1 queued prefill of 30
    assert (res.fpm.num_prefill_requests, res.fpm.sum_prefill_tokens) == (2, 45)
    assert (res.fpm.num_queued_prefill, res.fpm.sum_queued_prefill_tokens) == (1, 30)
    assert res.fpm == eager and res == eager_res
    assert attrs.evolve(eager_res, fpm=attrs.evolve(eager, num_prefill_requests=9)) != res


def test_sglang_deferred_fpm_equals_the_eager_snapshot(monkeypatch):
    """CORE-3 on the SGLang core: the deferred snapshot equals the one computed inside the pass,
    pass after pass, with requests queued behind a small pool."""
    from model import sglang_core
    from model.core import Deferred

    core = _core(engine_type="sglang", num_gpu_blocks=12)
    for i, n in enumerate((5, 30, 20, 9)):
        core, _ = C.apply_command_effects(core, Submit(DirectRequest(list(range(i * 100, i * 100 + n)), 3, f"r{i}")))
    deferred, eager = [], []
    lazy = core
    for _ in range(6):
        lazy, res = C.execute_pass(lazy, 0.0)
        assert type(res._fpm) is Deferred
        deferred.append(res)
    monkeypatch.setattr(sglang_core, "Deferred", lambda compute: compute())
    for _ in range(6):
        core, res = C.execute_pass(core, 0.0)
        eager.append(res)
    assert [r.fpm for r in deferred] == [r._fpm for r in eager] and deferred == eager
    assert any(r.fpm.num_queued_prefill for r in eager) and any(r.fpm.num_decode_requests for r in eager)

@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_unchanged_results_equal_the_full_transaction(monkeypatch, engine):
    """CORE-7: whenever a command or retry returns its input core (a command naming nothing held
    answered before any transaction opens, ``names_nothing_held``; on SGLang also a Noop or an empty
    retry recognised after it), running the same operation through a whole transaction and freezing
    it gives an equal core and equal effects (so no shortcut hides a change). Checked on every state
    of the engine's scenarios."""
    import pathlib

    from explorer import explore, load_scenario
    from model import core as core_mod
    from model import handoff_commands as hc
    from model import sglang_core, vllm_core

    mod = sglang_core if engine == "sglang" else vllm_core
    core_type = mod.SglangCore if engine == "sglang" else mod.VllmCore
    real_cmd, real_retry = core_mod.apply_command_effects, core_mod.retry_pending_destinations
    shortcuts = []

    def cmd(core, command, allow=True):
        new, eff = real_cmd(core, command, allow)
        if new is core and isinstance(core, core_type):
            txn = mod._Txn(core)
            full = hc.apply_command_effects(txn, command, allow)
            assert txn.freeze() == core, command
            assert (full.result, full.lifecycle_events, tuple(txn.kv_events)) == (
                eff.result, eff.lifecycle_events, eff.kv_events), command
            shortcuts.append(command)
        return new, eff

    def retry(core, now_ms=None):
        new, eff = real_retry(core, now_ms)
        if new is core and isinstance(core, core_type):
            txn = mod._Txn(core)
            events = hc.retry(txn, now_ms)
            assert txn.freeze() == core
            assert (events, tuple(txn.kv_events)) == (eff.lifecycle_events, eff.kv_events)
            shortcuts.append("retry")
        return new, eff

    monkeypatch.setattr(core_mod, "apply_command_effects", cmd)
    monkeypatch.setattr(core_mod, "retry_pending_destinations", retry)
    lib = pathlib.Path(__file__).resolve().parent.parent / "spec" / "scenarios"
    if engine == "sglang":
        paths = sorted(lib.glob("sglang/*.json")) + sorted(lib.glob("known-defects/*sglang*.json"))
    else:
        paths = sorted(lib.glob("clean/vllm-*.json"))
    assert paths
    for path in paths:
        explore(load_scenario(path))
    kinds = {type(s).__name__ for s in shortcuts if s != "retry"}
    # the SGLang scenarios are decode-only: no source-side command there
    expected = {"CancelDestination"} if engine == "sglang" else {"CancelDestination", "CancelSource", "ReleaseSource"}
    assert "retry" in shortcuts and expected <= kinds, kinds
