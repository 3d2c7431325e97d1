"""One error hierarchy for every rejection the model can raise.

Each concrete error names the spec rule that rejects the input (``rule``) and
carries a message with the same meaning as the upstream ``bail!`` text it
mirrors.  Raising never leaves a half-changed state: transitions build the new
value only after every guard passed.
"""

from __future__ import annotations

import decimal
import math


def rust_display(x: float) -> str:
    """How Rust's ``{}`` prints an f64 inside upstream's messages: the shortest round-trip digits
    in plain decimal (never an exponent), no trailing ``.0`` (``-3``, ``0.25``,
    ``1000000000000000000000``); ``NaN``, ``inf``, ``-inf``.  Messages that quote a float use it so
    that they read as upstream's (spec/replay.md WL-20, spec/timing.md TIME-14)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = format(decimal.Decimal(repr(float(x))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


class ModelError(Exception):
    """Base class of every error raised by the model."""

    #: spec rule id that defines the rejection (e.g. ``"SRC-2"``)
    rule: str = ""

    def __init__(self, message: str, *, rule: str | None = None) -> None:
        super().__init__(message)
        if rule is not None:
            self.rule = rule

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class CommandRejected(ModelError):
    """A scheduler command (or bookkeeping operation) was rejected."""


class InvalidInput(ModelError):
    """Malformed input to the model: engine args, trace rows, scenario files.

    ``field`` and ``value`` name the offending input so that the CLI can print a
    one-line error.
    """

    def __init__(self, field: str, value: object, reason: str, *, rule: str | None = None,
                 detail: str | None = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason  # upstream's text where upstream refuses the same input
        self.detail = detail  # what exactly is wrong, where upstream's text does not say
        super().__init__(f"{field}={value!r}: {reason}" + (f" ({detail})" if detail else ""), rule=rule)


def check_reservation(field: str, value: int, count: int, element_bytes: int, rule: str) -> None:
    """Refuse ``value`` as upstream's Rust ``Vec`` does a reservation of ``count`` elements of
    ``element_bytes`` each that passes ``isize::MAX`` bytes: it panics with "capacity overflow"
    (REP-1, KV-1, WL-10, WL-16). Smaller reservations that exceed the machine's memory abort
    upstream; the model does not model that (spec/fidelity.md)."""
    if count > (2**63 - 1) // element_bytes:
        raise InvalidInput(field, value, "capacity overflow", rule=rule)


class InternalInvariantBroken(ModelError):
    """An upstream ``expect``/``debug_assert`` would have fired.

    The model raises this where upstream would panic; it signals a bug in a
    caller (or in the model), never a rejected user input.
    """


class UpstreamPanic(InternalInvariantBroken):
    """Upstream panics here, in release builds too, on inputs a user can give (a speed-up so small
    that a duration overflows, TIME-1); the message is upstream's panic text, word for word, so a
    comparison with the compiled build can match it."""


# --- kernel rejections (spec/handoff-lifecycle.md) ------------------------------------------


class RequestAlreadyActive(CommandRejected):
    """CMD-1: the request id is already owned by the core in some role."""

    rule = "CMD-1"


class SourceRequestActive(CommandRejected):
    """SRC-1: a source hold (pending or held) already exists for the request."""

    rule = "SRC-1"


class SourceHandoffActive(CommandRejected):
    """SRC-1: a source hold (pending or held) already uses the handoff id."""

    rule = "SRC-1"


class DestinationRequestPending(CommandRejected):
    """PEND-1: the request is already a pending destination."""

    rule = "PEND-1"


class DestinationHandoffPending(CommandRejected):
    """PEND-1: the handoff id is already a pending destination."""

    rule = "PEND-1"


class DestinationReservationExists(CommandRejected):
    """DST-1: a destination reservation already exists for the request."""

    rule = "DST-1"


class DestinationHandoffActive(CommandRejected):
    """DST-1 / LEDGER-2: the handoff id is already reserved or activated as a destination."""

    rule = "DST-1"


class DestinationPromptTooLarge(CommandRejected):
    """The destination prompt can never fit the KV pool (core rule, see the core specs)."""


class DestinationUnsupported(CommandRejected):
    """TRT-LLM cores reject every destination reservation (core rule)."""
