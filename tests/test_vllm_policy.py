"""Ports of lib/mocker/src/scheduler/vllm/policy/tests.rs: the vLLM and TRT-LLM admission policies.

The ``vllm`` module of upstream calls ``decide_waiting_admission`` directly on a
bare KV manager; here the decision is taken by the core's transaction
(``_Txn.decide_waiting_admission``) over a core whose KV state was prepared
the same way (no running requests, so TRT-LLM's reservation sum is empty).
The ``trtllm`` module drives whole cores, as upstream does.
"""

from __future__ import annotations

from core_helpers import Collector, Core, args, request, u
from model import sequence as seqm
from model import vllm_kv as kvm
from model import vllm_core as vc
from model.ids import rid


# ---------------------------------------------------------------------------------------------
# mod vllm: direct policy decisions (policy/tests.rs:20-129)
# ---------------------------------------------------------------------------------------------


def _seq(key: int, tokens, max_out: int, prefix_caching: bool):
    return seqm.new_sequence(key, tuple(tokens), max_out, block_size=4, enable_prefix_caching=prefix_caching)


def _hold(kv, seq):
    """``take_creation_signal`` + ``process``: allocate every block of ``seq``; returns (kv, seq, count)."""
    seq, signal = seqm.take_creation_signal(seq)
    kv, res = kvm.process(kv, signal)
    return kv, seq, res.count


def _decide(capacity: int, kv, seq, engine: str = "vllm", fresh: bool = True):
    core = vc.new_vllm_core(
        args(engine_type=engine, block_size=4, num_gpu_blocks=capacity, enable_prefix_caching=seq.enable_prefix_caching)
    )
    core = vc.attrs.evolve(core, kv=kv)
    status = vc.RequestStatus.WAITING if fresh else vc.RequestStatus.PREEMPTED
    kind, _cost = vc._Txn(core).decide_waiting_admission(vc.VllmRequest(rid("candidate"), seq, status))
    return kind


def _manager(capacity: int):
    return kvm.new_kv_manager(capacity, 4)


def test_admits_when_current_sequence_fits_without_reserving_future_output():
    """policy/tests.rs:27-43.  VLLM-13: only the current sequence (2 blocks) must fit, not P+M (10)."""
    seq = _seq(1, range(0, 8), 32, False)
    assert _decide(4, _manager(4), seq) == "admit"


def test_waits_when_current_sequence_does_not_fit_available_kv():
    """policy/tests.rs:45-64.  VLLM-13: 3 of 4 blocks held; 2 needed > 1 available -> Wait."""
    kv, _holder, n = _hold(_manager(4), _seq(2, range(100, 112), 1, False))
    assert n == 3
    assert _decide(4, kv, _seq(1, range(0, 8), 32, False)) == "wait"


def test_rejects_fresh_sequence_that_exceeds_total_kv():
    """policy/tests.rs:66-81.  VLLM-13: a fresh 20-token prompt needs 5 > 4 blocks -> Reject."""
    seq = _seq(1, range(0, 20), 1, False)
    assert _decide(4, _manager(4), seq) == "reject"
    # not fresh (a preempted request): never rejected, it waits (VLLM-Q5)
    assert _decide(4, _manager(4), seq, fresh=False) == "wait"


def test_discounts_active_cached_prefix():
    """policy/tests.rs:83-101.  VLLM-13: 2 of 3 blocks actively held by a holder with the same
    prefix; the candidate needs 3 - 2 = 1 <= 1 available -> Admit."""
    kv, _holder, n = _hold(_manager(3), _seq(2, range(0, 8), 1, True))
    assert n == 2
    assert _decide(3, kv, _seq(1, range(0, 12), 1, True)) == "admit"


def test_does_not_discount_inactive_cached_prefix():
    """policy/tests.rs:103-128.  VLLM-13: the seeder's 2 blocks are inactive (cached, evictable)
    and a holder actively uses 1 of 3; inactive reuse is not discounted: 3 needed > 2 available."""
    kv, seeder, n = _hold(_manager(3), _seq(2, range(0, 8), 1, True))
    assert n == 2
    for sig in seqm.free_signal(seeder):
        kv, _ = kvm.process(kv, sig)
    kv, _holder, n = _hold(kv, _seq(3, range(100, 104), 1, True))
    assert n == 1
    assert _decide(3, kv, _seq(1, range(0, 12), 1, True)) == "wait"


# ---------------------------------------------------------------------------------------------
# mod trtllm: GUARANTEED_NO_EVICT on whole cores (policy/tests.rs:131-599)
# ---------------------------------------------------------------------------------------------


def engine_args(engine: str):
    """policy/tests.rs:135-150: bs 4, 6 blocks, budget 16, 4 slots, no prefix caching."""
    return args(
        engine_type=engine,
        block_size=4,
        num_gpu_blocks=6,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        speedup_ratio=0.0,
    )


def receive(core: Core, uuid: str, tokens, max_output: int) -> None:
    core.receive(request(uuid, tokens, max_output))


def drive(core: Core, passes: int, on_pass=None):
    """Upstream's loop: ``now = max(end_ms, now + 1)`` while requests remain; returns
    (completed signals, max cumulative preemptions)."""
    now = 0.0
    completed = 0
    max_preemptions = 0
    for _ in range(passes):
        if not core.requests:
            break
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        completed += sum(1 for s in p.output_signals if s.completed)
        max_preemptions = max(max_preemptions, p.metrics.vllm_preemptions_total)
        if on_pass is not None:
            on_pass(p)
    return completed, max_preemptions


def test_admits_only_what_fits_to_completion():
    """policy/tests.rs:165-192.  TRT-2, TRT-3: each request reserves ceil((8+8)/4) = 4 blocks;
    after r1, 6 - 2 (held) - 2 (r1's remainder) = 2 < 4, so r2 waits at the head."""
    core = Core(engine_args("trtllm"))
    r1, r2 = u(1), u(2)
    receive(core, r1, range(0, 8), 8)
    receive(core, r2, range(100, 108), 8)
    p = core.execute(0.0, Collector())
    assert core.running == [r1]
    assert r2 in core.waiting
    assert core.req(r2).status is vc.RequestStatus.WAITING
    assert p.metrics.vllm_preemptions_total == 0


def test_vllm_admits_optimistically_unlike_trtllm():
    """policy/tests.rs:197-213.  VLLM-13: vLLM gates on the current sequence only, so both run."""
    core = Core(engine_args("vllm"))
    r1, r2 = u(1), u(2)
    receive(core, r1, range(0, 8), 8)
    receive(core, r2, range(100, 108), 8)
    core.execute(0.0)
    running = core.running
    assert r1 in running and r2 in running


def test_preemption_inducing_workload_never_preempts():
    """policy/tests.rs:218-265.  TRT-2, TRT-3.

    Upstream runs this with MTP (``aic_nextn 2``, accept rates ``1,1``); the
    model has no MTP path (out of scope), so the port runs the same workload
    with ordinary one-token decode.  The property is the gate's: each request
    reserves all 4 blocks to completion, so they run one after the other and
    nothing is ever preempted.
    """
    core = Core(
        args(
            engine_type="trtllm",
            block_size=4,
            num_gpu_blocks=4,
            max_num_batched_tokens=8,
            max_num_seqs=4,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            speedup_ratio=0.0,
        )
    )
    receive(core, u(1), range(0, 4), 12)
    receive(core, u(2), range(100, 104), 12)
    seen_running = []
    completed, max_preemptions = drive(core, 300, lambda p: seen_running.append(p.metrics.running_requests))
    assert not core.requests
    assert completed == 2
    assert max_preemptions == 0
    assert max(seen_running) == 1


def test_no_evict_admission_cap_matches_hardware():
    """policy/tests.rs:274-313.  TRT-2: ISL 1096 + OSL 7000 at bs 32 reserves 253 blocks each;
    floor(7319 / 253) = 28 run, the other 36 stay queued, no preemption."""
    core = Core(
        args(
            engine_type="trtllm",
            block_size=32,
            num_gpu_blocks=7319,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            speedup_ratio=0.0,
        )
    )
    for i in range(64):
        base = (i + 1) * 100_000
        receive(core, u(i + 1), range(base, base + 1096), 7000)
    now = 0.0
    max_preemptions = 0
    for _ in range(40):
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        max_preemptions = max(max_preemptions, p.metrics.vllm_preemptions_total)
    running, waiting = len(core.running), len(core.waiting)
    assert max_preemptions == 0
    assert running == 28
    assert running + waiting == 64


def capacity_args():
    """policy/tests.rs:334-347: a 16-token pool (4 blocks of 4)."""
    return args(
        engine_type="trtllm",
        block_size=4,
        num_gpu_blocks=4,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        speedup_ratio=0.0,
    )


def test_enqueue_clamps_excess_output_to_capacity():
    """policy/tests.rs:353-367.  TRT-1: 4 + 40 tokens is clamped to 4 + 12 = 16 (the whole pool),
    so r1 is kept, admitted and runs to completion."""
    core = Core(capacity_args())
    r1 = u(1)
    receive(core, r1, range(0, 4), 40)
    assert rid(r1) in core.requests
    assert core.req(r1).sequence.max_output_tokens == 12
    completed, _ = drive(core, 100)
    assert completed == 1
    assert not core.requests


def test_inactive_cached_prefix_not_discounted_keeps_request_waiting():
    """policy/tests.rs:374-448.  TRT-2, VLLM-13: a reuser of the seeder's INACTIVE prefix is not
    discounted: it needs ceil((8+12)/4) = 5 > 8 - 4 (holder's reservation) = 4, so it waits while
    the holder runs and is admitted once the holder completes."""
    core = Core(
        args(
            engine_type="trtllm",
            block_size=4,
            num_gpu_blocks=8,
            max_num_batched_tokens=64,
            max_num_seqs=8,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            speedup_ratio=0.0,
        )
    )
    holder, seeder, reuser = u(1), u(2), u(3)
    receive(core, holder, range(0, 4), 12)
    receive(core, seeder, range(100, 108), 4)
    receive(core, reuser, range(100, 108), 12)
    now = 0.0
    max_preemptions = 0
    checked = False
    for _ in range(400):
        if not core.requests:
            break
        if not checked and rid(seeder) not in core.requests and rid(holder) in core.requests:
            assert reuser not in core.running
            assert core.req(reuser).status is vc.RequestStatus.WAITING
            checked = True
        p = core.execute(now)
        now = max(p.end_ms, now + 1.0)
        max_preemptions = max(max_preemptions, p.metrics.vllm_preemptions_total)
    assert checked
    assert not core.requests
    assert max_preemptions == 0


def test_oversized_request_is_rejected_so_followers_run():
    """policy/tests.rs:456-501.  TRT-2, VLLM-12, VLLM-17: a 20-token prompt can never fit the
    16-token pool (the clamp leaves it unchanged, TRT-1); it is rejected at the head and the
    follower runs to completion."""
    core = Core(capacity_args())
    oversized, valid = u(1), u(2)
    receive(core, oversized, range(0, 20), 8)
    receive(core, valid, range(100, 104), 4)
    assert core.req(oversized).sequence.max_output_tokens == 8
    valid_completed = []

    def check(p):
        assert p.metrics.vllm_preemptions_total == 0
        valid_completed.extend(s for s in p.output_signals if s.uuid.value == valid and s.completed)

    drive(core, 100, check)
    assert rid(oversized) not in core.requests
    assert valid_completed
    assert not core.requests


def test_rejection_emits_explicit_terminal_signal():
    """policy/tests.rs:507-541.  VLLM-18: the rejected request gets ``completed and rejected``;
    the valid one an ordinary completion."""
    core = Core(capacity_args())
    oversized, valid = u(1), u(2)
    receive(core, oversized, range(0, 20), 8)
    receive(core, valid, range(100, 104), 4)
    flags = {"rejected": False, "clean": False}

    def check(p):
        for s in p.output_signals:
            if s.uuid.value == oversized and s.completed and s.rejected:
                flags["rejected"] = True
            if s.uuid.value == valid and s.completed and not s.rejected:
                flags["clean"] = True

    drive(core, 100, check)
    assert flags == {"rejected": True, "clean": True}


def test_active_prefix_reuse_oversized_request_rejected_on_full_footprint():
    """policy/tests.rs:549-598.  TRT-2: rejection uses the undiscounted footprint
    ceil((32+8)/4) = 10 > 8, although the active-prefix discount would make ``needed`` 8."""
    core = Core(
        args(
            engine_type="trtllm",
            block_size=4,
            num_gpu_blocks=8,
            max_num_batched_tokens=64,
            max_num_seqs=8,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            speedup_ratio=0.0,
        )
    )
    holder, reuser = u(1), u(2)
    receive(core, holder, range(0, 8), 8)
    receive(core, reuser, range(0, 32), 8)
    p = core.execute(0.0)
    assert holder in core.running
    assert any(s.uuid.value == reuser and s.completed and s.rejected for s in p.output_signals)
    assert rid(reuser) not in core.requests
    assert p.metrics.vllm_preemptions_total == 0
