"""Protocol values exchanged with an engine core (spec/handoff-lifecycle.md §1, rules PROTO-n).

Commands go in, results and effects come out.  Every class is a frozen attrs
value, so effects can be compared, hashed and stored in explored states.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import attrs

from .engine_args import KvTransferTimingMode as _KvTransferTimingMode
from .ids import HandoffId, RequestId, hid, rid
from .timing import HandoffTransferTiming as _HandoffTransferTiming


def _tokens(value) -> Tuple[int, ...]:
    return tuple(map(int, value))


def _opt_rid(value):
    return None if value is None else rid(value)


@attrs.frozen
class DirectRequest:
    """PROTO-1: a request as submitted to a core.

    ``uuid`` may be ``None``: upstream then draws a random v4 UUID.  The model
    has no randomness, so a core rejects a ``None`` uuid (callers assign ids);
    see CMD-1.
    """

    tokens: Tuple[int, ...] = attrs.field(converter=_tokens)
    max_output_tokens: int
    uuid: Optional[RequestId] = attrs.field(default=None, converter=_opt_rid)
    dp_rank: int = 0
    arrival_timestamp_ms: Optional[float] = None

    @property
    def prompt_len(self) -> int:
        return len(self.tokens)


# PROTO-2: the transfer-timing inputs carried by ``SourceHeld``.  The event carries
# no delay (upstream S19); the delay formula is TIME-12 in :mod:`model.timing`.
KvTransferTimingMode = _KvTransferTimingMode
HandoffTransferTiming = _HandoffTransferTiming


# --- commands (PROTO-3) -------------------------------------------------------------------


@attrs.frozen
class Submit:
    """Submit an ordinary request (CMD-SUBMIT)."""

    request: DirectRequest


@attrs.frozen
class SubmitHandoffPrefill:
    """Submit a prefill request whose KV is held for handoff ``handoff_id`` on completion (CMD-SUBMIT-PREFILL)."""

    handoff_id: HandoffId = attrs.field(converter=hid)
    request: DirectRequest


@attrs.frozen
class ReleaseSource:
    """Release the source hold of ``handoff_id`` (CMD-RELEASE)."""

    handoff_id: HandoffId = attrs.field(converter=hid)


@attrs.frozen
class CancelSource:
    """Cancel the source side of ``handoff_id`` (CMD-CANCEL-SOURCE)."""

    handoff_id: HandoffId = attrs.field(converter=hid)


@attrs.frozen
class ReserveDestination:
    """Accept ``request`` as the destination of ``handoff_id`` (CMD-RESERVE)."""

    handoff_id: HandoffId = attrs.field(converter=hid)
    request: DirectRequest


@attrs.frozen
class ActivateDestination:
    """Turn the reservation of ``handoff_id`` into a scheduled request (CMD-ACTIVATE)."""

    handoff_id: HandoffId = attrs.field(converter=hid)


@attrs.frozen
class CancelDestination:
    """Cancel the destination side of ``handoff_id`` in whatever stage it is (CMD-CANCEL-DEST)."""

    handoff_id: HandoffId = attrs.field(converter=hid)


Command = Union[
    Submit,
    SubmitHandoffPrefill,
    ReleaseSource,
    CancelSource,
    ReserveDestination,
    ActivateDestination,
    CancelDestination,
]

#: the seven command kinds, in upstream's declaration order
COMMAND_TYPES = (
    Submit,
    SubmitHandoffPrefill,
    ReleaseSource,
    CancelSource,
    ReserveDestination,
    ActivateDestination,
    CancelDestination,
)


# --- results (PROTO-4) --------------------------------------------------------------------


@attrs.frozen
class Submitted:
    request_id: RequestId = attrs.field(converter=rid)


@attrs.frozen
class DestinationAccepted:
    request_id: RequestId = attrs.field(converter=rid)


@attrs.frozen
class Applied:
    pass


@attrs.frozen
class Noop:
    pass


APPLIED = Applied()
NOOP = Noop()

CommandResult = Union[Submitted, DestinationAccepted, Applied, Noop]


# --- lifecycle events (PROTO-5) -----------------------------------------------------------


@attrs.frozen
class SourceHeld:
    """A registered prefill completed; its KV is held for ``handoff_id``."""

    handoff_id: HandoffId = attrs.field(converter=hid)
    request_id: RequestId = attrs.field(converter=rid)
    transfer_timing: HandoffTransferTiming


@attrs.frozen
class DestinationReserved:
    """The pending destination ``handoff_id`` obtained its KV reservation."""

    handoff_id: HandoffId = attrs.field(converter=hid)
    request_id: RequestId = attrs.field(converter=rid)
    transferable_prompt_tokens: int


LifecycleEvent = Union[SourceHeld, DestinationReserved]


@attrs.frozen
class CommandEffects:
    """PROTO-6: what one command produced.

    ``kv_events`` is empty when the core itself builds the effects; drivers that
    capture router events fill it (upstream ``SchedulerCommandEffects``).
    """

    result: CommandResult
    lifecycle_events: Tuple[LifecycleEvent, ...] = attrs.field(default=(), converter=tuple)
    kv_events: Tuple[object, ...] = attrs.field(default=(), converter=tuple)


# --- pass outputs shared by both cores ----------------------------------------------------


@attrs.frozen
class OutputSignal:
    """PROTO-7: one emitted token (or a terminal rejection) of a request."""

    uuid: RequestId = attrs.field(converter=rid)
    completed: bool
    rejected: bool = False
    handoff_delay_ms: Optional[float] = None


@attrs.frozen
class AdmissionEvent:
    """PROTO-8: a request entered the running set; ``reused_input_tokens`` were cached."""

    uuid: RequestId = attrs.field(converter=rid)
    reused_input_tokens: int


def effective_handoff_capacity(max_num_seqs: Optional[int], num_gpu_blocks: int) -> int:
    """CHAN-1: ``max(max_num_seqs or num_gpu_blocks, 1)``.

    Upstream ``MockEngineArgs::effective_handoff_capacity``
    (lib/mocker/src/common/protocols.rs:1259-1261).
    """
    return max(num_gpu_blocks if max_num_seqs is None else max_num_seqs, 1)


def handoff_channel_capacity(max_num_seqs: Optional[int], num_gpu_blocks: int) -> int:
    """CHAN-2: twice the effective handoff capacity (live command/lifecycle channel size).

    Upstream ``handoff_channel_capacity`` (lib/mocker/src/scheduler/mod.rs:448-452).
    """
    return effective_handoff_capacity(max_num_seqs, num_gpu_blocks) * 2
