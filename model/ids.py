"""Request and handoff identifiers (spec/handoff-lifecycle.md §1, rule ID-1).

Upstream uses UUIDs for both.  The model treats ids as opaque, hashable,
totally ordered values: replay uses UUID strings, scenarios use short names
such as ``"X"``.  Ordering exists only so that canonical states and reports are
deterministic; no rule of the scheduler depends on it.
"""

from __future__ import annotations

import attrs


def _as_str(value: object) -> str:
    if isinstance(value, (RequestId, HandoffId)):
        return value.value
    if not isinstance(value, str) or not value:
        raise TypeError(f"an id must be a non-empty string, got {value!r}")
    return value


@attrs.frozen(order=True, repr=False, cache_hash=True)
class RequestId:
    """ID-1: an opaque request id (upstream: the request UUID)."""

    value: str = attrs.field(converter=_as_str)

    def __repr__(self) -> str:
        return f"r:{self.value}"

    __str__ = __repr__


@attrs.frozen(order=True, repr=False, cache_hash=True)
class HandoffId:
    """ID-1: an opaque handoff id (upstream: ``HandoffId``, a wrapped UUID).

    The source and destination namespaces are independent: the same handoff id
    may name a source hold and a destination on one core (LEDGER-3).
    """

    value: str = attrs.field(converter=_as_str)

    def __repr__(self) -> str:
        return f"h:{self.value}"

    __str__ = __repr__


def rid(value: "str | RequestId") -> RequestId:
    """Coerce a string (or id) to a :class:`RequestId`."""
    return value if isinstance(value, RequestId) else RequestId(value)


def hid(value: "str | HandoffId") -> HandoffId:
    """Coerce a string (or id) to a :class:`HandoffId`."""
    return value if isinstance(value, HandoffId) else HandoffId(value)
