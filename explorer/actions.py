"""Firing one action of the alphabet on a core (spec/model-checking.md MC-5..MC-7).

Pure: :func:`fire` returns the successor core and an :class:`Outcome`; the
input core is a frozen value and is never changed.
"""

from __future__ import annotations

from typing import Optional, Tuple

import attrs

from model import core as C
from model.errors import InternalInvariantBroken, ModelError
from model.replay.common import made_progress
from model.protocol import (
    ActivateDestination,
    CancelDestination,
    CancelSource,
    DestinationReserved,
    ReleaseSource,
    ReserveDestination,
    SourceHeld,
    Submit,
    SubmitHandoffPrefill,
)

from .scenario import ActionSpec


@attrs.frozen
class Outcome:
    """MC-6: what firing an action produced.

    ``rejected`` names the error class of a rejected command (the core is then
    unchanged); ``internal_error`` is set when the model raised
    ``InternalInvariantBroken`` (an upstream panic or debug assertion: a
    violation, and the action has no successor).  ``progress`` follows the
    offline driver's notion of a pass that did something (MC-7); ``zero_time``
    is ``end_ms == now_ms`` for a pass and true for every command and retry.
    """

    label: str
    rejected: Optional[str] = None
    internal_error: Optional[str] = None
    progress: bool = False
    zero_time: bool = True
    now_ms: float = 0.0
    end_ms: float = 0.0
    events: Tuple[str, ...] = ()


def guard_holds(core, spec: ActionSpec) -> bool:
    """SCN-5: the action's guard on the current core."""
    g = spec.guard
    if g == "always":
        return True
    led = core.ledger
    h = spec.handoff
    from model.ids import hid

    h = hid(h)
    if g == "source_pending":
        return led.source_holds.is_registered(h)
    if g == "source_held":
        return led.source_holds.is_held(h)
    if g == "destination_pending":
        return led.pending_destinations.contains_handoff(h)
    if g == "destination_reserved":
        return led.destination_holds.contains(h)
    if g == "destination_active":
        return led.active_destinations.contains_handoff(h)
    raise ValueError(f"unknown guard {g!r}")


def reports_progress(result) -> bool:
    """MC-7: a pass counts as progress exactly when the offline driver counts it (DRV-6:
    admissions, emissions, completions, lifecycle or KV events, or a scheduled request in its
    FPM)."""
    return made_progress(result)


def _event_label(e) -> str:
    if isinstance(e, SourceHeld):
        return f"SourceHeld({e.handoff_id.value})"
    if isinstance(e, DestinationReserved):
        return f"DestinationReserved({e.handoff_id.value})"
    return type(e).__name__


def command_of(spec: ActionSpec):
    """SCN-4: the protocol command an action issues (None for ``pass`` / ``retry``)."""
    k = spec.kind
    if k == "submit":
        return Submit(spec.request)
    if k == "submit_prefill":
        return SubmitHandoffPrefill(spec.handoff, spec.request)
    if k == "reserve":
        return ReserveDestination(spec.handoff, spec.request)
    if k == "activate":
        return ActivateDestination(spec.handoff)
    if k == "release":
        return ReleaseSource(spec.handoff)
    if k == "cancel_source":
        return CancelSource(spec.handoff)
    if k == "cancel_destination":
        return CancelDestination(spec.handoff)
    return None


_COMMANDS: dict = {}


def _command_memo(spec: ActionSpec):
    """``command_of(spec)``, built once per action (commands are immutable values)."""
    hit = _COMMANDS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_COMMANDS) >= 10_000:
            _COMMANDS.clear()
        hit = _COMMANDS[id(spec)] = (spec, command_of(spec))
    return hit[1]


def fire(core, spec: ActionSpec, now_ms: float):
    """MC-5: apply one action; ``(successor or None, Outcome)``.

    ``pass`` runs ``execute_pass(core, now_ms)``; ``retry`` runs
    ``retry_pending_destinations``; every other kind issues its command with
    ``apply_command_effects``.  A rejected command returns the input core.
    """
    try:
        if spec.kind == "pass":
            new, res = C.execute_pass(core, now_ms)
            evs = tuple(_event_label(e) for e in res.lifecycle_events)
            adm = tuple(a.uuid.value for a in res.admissions)
            outs = tuple(f"{s.uuid.value}{'!' if s.rejected else ('.' if s.completed else '')}" for s in res.output_signals)
            parts = []
            if adm:
                parts.append("admit " + ",".join(adm))
            if outs:
                parts.append("emit " + ",".join(outs))
            parts.extend(evs)
            progress = reports_progress(res)
            zero = res.end_ms == now_ms
            label = "; ".join(parts) if parts else ("progress" if progress else "idle")
            if zero and progress:
                label += " [zero-time]"
            return new, Outcome(label, progress=progress, zero_time=zero, now_ms=now_ms, end_ms=res.end_ms,
                                events=evs)
        if spec.kind == "retry":
            new, eff = C.retry_pending_destinations(core)
            evs = tuple(_event_label(e) for e in eff.lifecycle_events)
            return new, Outcome("; ".join(evs) if evs else "-", now_ms=now_ms, end_ms=now_ms, events=evs)
        cmd = _command_memo(spec)
        new, eff = C.apply_command_effects(core, cmd, spec.allow_destination_admission)
        evs = tuple(_event_label(e) for e in eff.lifecycle_events)
        label = type(eff.result).__name__
        if evs:
            label += "; " + "; ".join(evs)
        return new, Outcome(label, now_ms=now_ms, end_ms=now_ms, events=evs)
    except InternalInvariantBroken as err:
        return None, Outcome(f"InternalInvariantBroken: {err}", internal_error=f"{err} ({err.rule})",
                             now_ms=now_ms, end_ms=now_ms)
    except ModelError as err:
        return core, Outcome(f"rejected: {type(err).__name__}", rejected=type(err).__name__, now_ms=now_ms,
                             end_ms=now_ms)
