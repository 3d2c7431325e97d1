"""Timing model: polynomial pass costs, nanosecond quantisation, speed-up, handoff delay.

Normative text: ``spec/timing.md`` (rules TIME-1 .. TIME-16).  Every function
here is pure: it reads only its arguments, never a clock.

Times are carried in two forms, exactly as upstream does:

* model outputs (``prefill_ms``, ``decode_ms``, handoff delays) are ``float``
  milliseconds;
* pass durations are integer **nanoseconds** (upstream ``std::time::Duration``),
  produced by :func:`duration_from_secs` and read back with :func:`as_secs_f64`.

Only the default polynomial performance model is modelled.  The NPZ
interpolated model (``planner_profile_data``) and the AI-Configurator callback
(``aic_backend``) are out of scope; ``model.engine_args`` rejects the inputs
that would select them (rule ARGS-14).
"""

from __future__ import annotations

from typing import Optional

import attrs

from model.engine_args import EngineArgs, KvTransferTimingMode, WorkerType
from model.errors import UpstreamPanic, rust_display

#: TIME-1: the prefix of ``Duration::from_secs_f64``'s panic texts
_DURATION_PANIC = "cannot convert float seconds to Duration: "

NANOS_PER_SEC = 1_000_000_000
#: the largest u64 (and usize on 64-bit targets)
U64_MAX = 2**64 - 1

#: largest representable ``Duration`` in nanoseconds (``u64::MAX`` seconds + 999_999_999 ns)
_MAX_DURATION_NS = (2**64 - 1) * NANOS_PER_SEC + (NANOS_PER_SEC - 1)

# Polynomial coefficients (TIME-4, TIME-5).  Written as the same decimal
# literals upstream uses so that they denote the same binary64 values.
PREFILL_A = 4.209989e-07
PREFILL_B = 1.518344e-02
PREFILL_C = 1.650142e01
DECODE_A = -25.74
DECODE_B = 54.01
DECODE_C = 5.74
#: decode floor in ms (TIME-5)
DECODE_FLOOR_MS = 1.0


# ---------------------------------------------------------------------------
# Duration arithmetic (TIME-1, TIME-2)
# ---------------------------------------------------------------------------


def duration_from_secs(secs: float) -> int:
    """Rule: TIME-1. ``Duration::from_secs_f64``: exact binary value of ``secs`` to ns, ties to even.

    Returns integer nanoseconds.  Raises :class:`~model.errors.UpstreamPanic` (an ``InternalInvariantBroken``) with Rust's text where
    upstream panics (negative, NaN, infinite or too large for ``Duration``).
    """
    # Rust's texts: a negative value (-inf included) first, then NaN, +inf or too large
    if secs < 0.0:
        raise UpstreamPanic(_DURATION_PANIC + "value is negative", rule="TIME-1")
    if secs != secs or secs == float("inf"):
        raise UpstreamPanic(_DURATION_PANIC + "value is either too big or NaN", rule="TIME-1")
    num, den = secs.as_integer_ratio()  # den is a power of two, exact
    quot, rem = divmod(num * NANOS_PER_SEC, den)
    twice = 2 * rem
    if twice > den or (twice == den and quot & 1):
        quot += 1
    if quot > _MAX_DURATION_NS:
        raise UpstreamPanic(_DURATION_PANIC + "value is either too big or NaN", rule="TIME-1")
    return quot


def as_secs_f64(ns: int) -> float:
    """Rule: TIME-2. ``Duration::as_secs_f64``: ``secs as f64 + (subsec_nanos as f64) / 1e9``."""
    secs, nanos = divmod(ns, NANOS_PER_SEC)
    return float(secs) + float(nanos) / 1e9


def f64_as_u64(x: float) -> int:
    """Rust's saturating ``f64 as u64`` (and ``as usize`` on 64-bit targets): truncation toward
    zero, NaN and anything at or below 0 to 0, ``2^64`` and above to ``2^64 - 1``."""
    if x != x or x <= 0.0:
        return 0
    if x >= 18446744073709551615.0:  # this literal is the f64 2^64
        return U64_MAX
    return int(x)


def duration_from_ms(ms: float) -> int:
    """Rule: TIME-1. A millisecond model output as a Duration: ``from_secs_f64(ms / 1000.0)``."""
    return duration_from_secs(ms / 1000.0)


def advance_ms(start_ms: float, duration_ns: int) -> float:
    """Rule: TIME-9. One timeline step: ``start_ms + as_secs_f64(d) * 1000.0`` (one float add)."""
    return start_ms + as_secs_f64(duration_ns) * 1000.0


# ---------------------------------------------------------------------------
# Polynomial performance model (TIME-3 .. TIME-5)
# ---------------------------------------------------------------------------


def floor_mean(total: int, count: int) -> int:
    """Rule: TIME-3. Integer batch mean ``total // count`` (0 for an empty batch)."""
    if count == 0:
        return 0
    return total // count


def polynomial_prefill_ms(batch_size: int, mean_isl: int, mean_prefix: int) -> float:
    """Rule: TIME-4. ``PerfModel::Polynomial`` prefill time in ms for per-request means.

    ``t = batch_size * (mean_isl - mean_prefix)`` (saturating); 0.0 when the
    batch is empty or nothing is new; otherwise ``(A*(t*t) + B*t) + C``, then
    clamped below at 0.0.
    """
    new_per_req = mean_isl - mean_prefix if mean_isl > mean_prefix else 0
    if batch_size == 0 or new_per_req == 0:
        return 0.0
    tokens = float(batch_size * new_per_req)
    ms = PREFILL_A * (tokens * tokens) + PREFILL_B * tokens + PREFILL_C
    return _rust_max(ms, 0.0)


def decode_utilisation(active_kv_tokens: int, total_kv_tokens: int) -> float:
    """Rule: TIME-5. ``active / total`` as two exact f64 conversions and one division; 1.0 if total is 0."""
    if total_kv_tokens > 0:
        return float(active_kv_tokens) / float(total_kv_tokens)
    return 1.0


def polynomial_decode_ms(
    batch_size: int, active_kv_tokens: int, context_length: int, total_kv_tokens: int
) -> float:
    """Rule: TIME-5. ``PerfModel::Polynomial`` decode time in ms.

    0.0 for an empty batch; otherwise ``max((A*(u*u) + B*u) + C, 1.0)`` with
    ``u = decode_utilisation(active_kv_tokens, total_kv_tokens)``.
    ``context_length`` is accepted for signature parity; the polynomial ignores it.
    """
    del context_length
    if batch_size == 0:
        return 0.0
    u = decode_utilisation(active_kv_tokens, total_kv_tokens)
    ms = DECODE_A * (u * u) + DECODE_B * u + DECODE_C
    return _rust_max(ms, DECODE_FLOOR_MS)


def _rust_max(value: float, floor: float) -> float:
    """``f64::max``: a NaN operand yields the other operand."""
    if value != value:
        return floor
    return value if value > floor else floor


# ---------------------------------------------------------------------------
# Quantisation and speed-up (TIME-6, TIME-7)
# ---------------------------------------------------------------------------


def scale_prefill_ns(prefill_ms: float, speedup_ratio: float) -> int:
    """Rule: TIME-6. Prefill Duration: quantise, then divide by ``speedup_ratio`` if it is > 0.

    ``d0 = from_secs(ms/1000)``; if ``speedup_ratio <= 0`` or ``d0 == 0`` the
    result is ``d0`` (unscaled); otherwise ``from_secs(as_secs_f64(d0) / ratio)``.
    """
    d0 = duration_from_ms(prefill_ms)
    # Written as upstream's guard: a NaN ratio fails `<= 0.0`, divides and panics in TIME-1.
    if speedup_ratio <= 0.0 or d0 == 0:
        return d0
    return duration_from_secs(as_secs_f64(d0) / speedup_ratio)


def effective_decode_ratio(speedup_ratio: float, decode_speedup_ratio: float) -> float:
    """Rule: TIME-7. The decode divisor ``speedup_ratio * decode_speedup_ratio`` (one f64 product)."""
    return speedup_ratio * decode_speedup_ratio


def scale_decode_ns(decode_ms: float, speedup_ratio: float, decode_speedup_ratio: float) -> int:
    """Rule: TIME-7. Decode Duration: quantise, then divide by the effective ratio if it is > 0."""
    d0 = duration_from_ms(decode_ms)
    ratio = effective_decode_ratio(speedup_ratio, decode_speedup_ratio)
    if ratio <= 0.0 or d0 == 0:
        return d0
    return duration_from_secs(as_secs_f64(d0) / ratio)


# ---------------------------------------------------------------------------
# Engine-level pass costs (TIME-8, TIME-10, TIME-11)
# ---------------------------------------------------------------------------


def prefill_duration_ns(batch_count: int, total_isl: int, total_prefix: int, args: EngineArgs) -> int:
    """Rule: TIME-8. Prefill Duration of one pass (vLLM, TRT-LLM and SGLang alike).

    ``total_isl`` / ``total_prefix`` are the batch sums the core accumulated
    (vLLM: per-request ``prompt_before + tokens_scheduled`` / ``prompt_before``;
    SGLang: cumulative chunk end / prefix).  The means are floored (TIME-3).
    Zero for an empty batch or a Decode worker.
    """
    if batch_count == 0 or args.worker_type is WorkerType.DECODE:
        return 0
    mean_isl = floor_mean(total_isl, batch_count)
    mean_prefix = floor_mean(total_prefix, batch_count)
    ms = polynomial_prefill_ms(batch_count, mean_isl, mean_prefix)
    return scale_prefill_ns(ms, args.speedup_ratio)


def vllm_decode_duration_ns(ready_count: int, total_length: int, num_active_blocks: int, args: EngineArgs) -> int:
    """Rule: TIME-10. vLLM/TRT-LLM decode Duration for the ready batch of one pass.

    ``total_length`` = sum of ``sequence.len()`` over the ready requests,
    ``num_active_blocks`` = the KV manager's active block count when the time
    is computed (after scheduling, before any token of the pass is generated).
    Zero when nothing is ready, and on a Prefill worker (its first token rides
    on the prefill forward pass).
    """
    if ready_count == 0 or args.worker_type is WorkerType.PREFILL:
        return 0
    active_kv_tokens = num_active_blocks * args.block_size
    total_kv_tokens = args.total_kv_tokens  # the usize product, wrapped (ARGS-12)
    context_length = total_length // ready_count
    ms = polynomial_decode_ms(ready_count, active_kv_tokens, context_length, total_kv_tokens)
    return scale_decode_ns(ms, args.speedup_ratio, args.decode_speedup_ratio)


def sglang_decode_duration_ns(running_count: int, total_context: int, args: EngineArgs) -> int:
    """Rule: TIME-11. SGLang decode Duration for the running batch after retraction.

    ``total_context`` = sum of ``current_sequence_len`` (prompt + outputs so
    far, before this step's token).  Utilisation uses
    ``min(total_context, num_gpu_blocks * block_size)``.  Zero for an empty
    batch.  Unlike vLLM, a Prefill worker is still charged.
    """
    if running_count == 0:
        return 0
    total_kv_tokens = args.total_kv_tokens  # the usize product, wrapped (ARGS-12)
    avg_context = total_context // running_count
    active_kv_tokens = min(total_context, total_kv_tokens)
    ms = polynomial_decode_ms(running_count, active_kv_tokens, avg_context, total_kv_tokens)
    return scale_decode_ns(ms, args.speedup_ratio, args.decode_speedup_ratio)


@attrs.frozen
class PassTimes:
    """Rule: TIME-9. The two timestamps of a pass (ms, f64)."""

    #: ``now_ms + prefill``: token stamp on a vLLM/TRT-LLM Prefill worker
    decode_start_ms: float
    #: ``decode_start_ms + decode``: every token of the pass otherwise, and the pass end
    end_ms: float


def pass_times(now_ms: float, prefill_ns: int, decode_ns: int) -> PassTimes:
    """Rule: TIME-9. ``decode_start = now + P``, then ``end = decode_start + D``: two float additions."""
    decode_start_ms = advance_ms(now_ms, prefill_ns)
    return PassTimes(decode_start_ms=decode_start_ms, end_ms=advance_ms(decode_start_ms, decode_ns))


def token_stamp_ms(times: PassTimes, args: EngineArgs) -> float:
    """Rule: TIME-9. Timestamp of tokens emitted by a vLLM/TRT-LLM pass.

    A Prefill worker stamps ``decode_start_ms`` (its decode time is zero, so the
    value equals ``end_ms`` anyway); SGLang always stamps ``end_ms``.
    """
    if args.worker_type is WorkerType.PREFILL:
        return times.decode_start_ms
    return times.end_ms


# ---------------------------------------------------------------------------
# Disaggregated handoff timing (TIME-12 .. TIME-16)
# ---------------------------------------------------------------------------


@attrs.frozen
class HandoffTransferTiming:
    """Rule: TIME-12. Transfer-timing facts a held prefill source carries to its coordinator."""

    mode: KvTransferTimingMode
    full_prompt_tokens: int
    kv_bytes_per_token: Optional[int]
    bandwidth_gb_s: Optional[float]

    def delay_ms(self, destination_missing_tokens: int) -> Optional[float]:
        """Rule: TIME-12. ``tokens * bytes / (bw * 1e9) * 1000`` or None (missing input, or bw <= 0)."""
        if self.mode is KvTransferTimingMode.FULL_PROMPT:
            tokens = self.full_prompt_tokens
        else:
            tokens = destination_missing_tokens
        if self.kv_bytes_per_token is None or self.bandwidth_gb_s is None:
            return None
        if self.bandwidth_gb_s <= 0.0:
            return None
        return float(tokens) * float(self.kv_bytes_per_token) / (self.bandwidth_gb_s * 1e9) * 1000.0

    def full_prompt_delay_ms(self) -> Optional[float]:
        """Rule: TIME-12. :meth:`delay_ms` with the mode forced to FullPrompt."""
        return attrs.evolve(self, mode=KvTransferTimingMode.FULL_PROMPT).delay_ms(0)

    def invalid_reason(self) -> Optional[str]:
        """Rule: TIME-14. Why the coordinator refuses this timing on ``SourceHeld``, or None."""
        bw = self.bandwidth_gb_s
        if bw is not None and (bw != bw or bw in (float("inf"), float("-inf")) or bw <= 0.0):
            return f"invalid handoff transfer bandwidth {rust_display(bw)}"
        delay = self.full_prompt_delay_ms()
        if delay is not None and (delay != delay or delay in (float("inf"), float("-inf")) or delay < 0.0):
            return f"invalid handoff transfer delay {rust_display(delay)}"
        return None


def prefill_transfer_timing(num_input_tokens: int, args: EngineArgs) -> HandoffTransferTiming:
    """Rule: TIME-12. The timing a prefill core attaches to ``SourceHeld`` (its own args)."""
    return HandoffTransferTiming(
        mode=args.kv_transfer_timing_mode,
        full_prompt_tokens=num_input_tokens,
        kv_bytes_per_token=args.kv_bytes_per_token,
        bandwidth_gb_s=args.kv_transfer_bandwidth,
    )


def transfer_action_delay_ms(timing: HandoffTransferTiming, transferable_prompt_tokens: int) -> float:
    """Rule: TIME-13. ``StartTransfer`` delay: ``delay_ms(transferable)`` with None read as 0.0."""
    delay = timing.delay_ms(transferable_prompt_tokens)
    return 0.0 if delay is None else delay


def transfer_complete_ms(now_ms: float, delay_ms: float) -> Optional[float]:
    """Rule: TIME-15. When a started transfer completes: ``now + delay`` if delay > 0, else None (immediately)."""
    if delay_ms > 0.0:
        return now_ms + delay_ms
    return None


def prefill_handoff_delay_ms(
    worker_type: WorkerType,
    completed: bool,
    num_input_tokens: int,
    kv_transfer_bandwidth: Optional[float],
    kv_bytes_per_token: Optional[int],
) -> Optional[float]:
    """Rule: TIME-16. ``OutputSignal.handoff_delay_ms``: FullPrompt delay on a Prefill worker's completing token."""
    if worker_type is not WorkerType.PREFILL or not completed:
        return None
    timing = HandoffTransferTiming(
        mode=KvTransferTimingMode.FULL_PROMPT,
        full_prompt_tokens=num_input_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        bandwidth_gb_s=kv_transfer_bandwidth,
    )
    return timing.full_prompt_delay_ms()
