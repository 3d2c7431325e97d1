"""Forward-pass metrics: Welford accumulator, FPM snapshot, accept-length sample (spec §FPM).

Upstream: lib/mocker/src/scheduler/mod.rs:37-156 and ``ForwardPassSnapshot``
(lib/mocker/src/common/protocols.rs:126-152).
"""

from __future__ import annotations

from typing import Iterable, Tuple

import attrs

from .protocol import OutputSignal
from .timing import f64_as_u64


@attrs.frozen
class WelfordAcc:
    """FPM-1: count / sum / population variance by Welford's online update.

    ``add`` returns a new accumulator.  The float operations are the same, in
    the same order, as upstream, so the results are bit-identical.
    """

    count: int = 0
    sum: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, v: float) -> "WelfordAcc":
        count = self.count + 1
        total = self.sum + v
        delta = v - self.mean
        mean = self.mean + delta / float(count)
        delta2 = v - mean
        return WelfordAcc(count, total, mean, self.m2 + delta * delta2)

    def variance(self) -> float:
        """FPM-1: population variance ``m2 / count`` (0 when empty)."""
        if self.count == 0:
            return 0.0
        return self.m2 / float(self.count)


def welford(values: Iterable[float]) -> WelfordAcc:
    """FPM-1 over a sequence: the same float operations, in the same order, as repeated ``add``
    (written out with locals because it runs over every queued request of every pass)."""
    # ``delta / count`` divides by the int count, which converts exactly (count < 2**53): the
    # same quotient as ``delta / float(count)``
    count = 0
    total = 0.0
    mean = 0.0
    m2 = 0.0
    for count, v in enumerate(map(float, values), 1):
        total += v
        delta = v - mean
        mean += delta / count
        m2 += delta * (v - mean)
    return WelfordAcc(count, total, mean, m2)


@attrs.frozen
class ForwardPassSnapshot:
    """FPM-2: the per-pass metrics snapshot (identity fields left at their defaults)."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0
    num_queued_prefill: int = 0
    sum_queued_prefill_tokens: int = 0
    var_queued_prefill_length: float = 0.0
    num_queued_decode: int = 0
    sum_queued_decode_kv_tokens: int = 0
    var_queued_decode_kv_tokens: float = 0.0
    wall_time_secs: float = 0.0
    version: int = 0
    worker_id: str = ""
    dp_rank: int = 0
    counter_id: int = 0

    def has_scheduled_work(self) -> bool:
        """FPM-4: the pass scheduled at least one prefill or decode."""
        return self.num_prefill_requests > 0 or self.num_decode_requests > 0


def build_fpm_snapshot(
    scheduled_prefills: Iterable[Tuple[int, int, int]],
    scheduled_decodes: Iterable[int],
    queued_prefills: Iterable[int],
    queued_decodes: Iterable[int],
    wall_time_secs: float,
) -> ForwardPassSnapshot:
    """FPM-2: build a snapshot from ``(prompt_len, prefix_tokens, tokens_computed)`` per scheduled
    prefill, ``sequence_len`` per scheduled decode, ``prompt_len`` per queued prefill and
    ``kv_tokens`` per queued decode.

    Sums of prefill tokens are integer sums; the decode and queued sums are the
    Welford float sums cast back to integers, as upstream does (``as u64``).
    """
    sum_prefill_tokens = 0
    sum_prefill_kv_tokens = 0
    prompt_lens = []
    for prompt_len, prefix_tokens, tokens_computed in scheduled_prefills:
        sum_prefill_tokens += tokens_computed
        sum_prefill_kv_tokens += prefix_tokens
        prompt_lens.append(prompt_len)
    prefill = welford(prompt_lens)
    decode = welford(scheduled_decodes)
    queued_prefill = welford(queued_prefills)
    queued_decode = welford(queued_decodes)
    return ForwardPassSnapshot(
        num_prefill_requests=prefill.count,
        sum_prefill_tokens=sum_prefill_tokens,
        var_prefill_length=prefill.variance(),
        sum_prefill_kv_tokens=sum_prefill_kv_tokens,
        num_decode_requests=decode.count,
        sum_decode_kv_tokens=f64_as_u64(decode.sum),
        var_decode_kv_tokens=decode.variance(),
        num_queued_prefill=queued_prefill.count,
        sum_queued_prefill_tokens=f64_as_u64(queued_prefill.sum),
        var_queued_prefill_length=queued_prefill.variance(),
        num_queued_decode=queued_decode.count,
        sum_queued_decode_kv_tokens=f64_as_u64(queued_decode.sum),
        var_queued_decode_kv_tokens=queued_decode.variance(),
        wall_time_secs=wall_time_secs,
    )


def accept_length_sample(output_signals: Iterable[OutputSignal]) -> Tuple[int, int]:
    """FPM-3: ``(visible tokens, request forwards)``: non-rejected signals, and their distinct uuids.

    ``(0, 0)`` when no visible token was emitted.
    """
    visible = [s.uuid for s in output_signals if not s.rejected]
    if not visible:
        return (0, 0)
    return (len(visible), len(set(visible)))
