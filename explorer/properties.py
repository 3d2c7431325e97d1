"""State properties and state views for the explorer (spec/model-checking.md MC-10..MC-12, MC-40).

Pure functions of a core (and the driver's fired set for the phase views).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from model import core as C
from model.ids import hid, rid

# ---------------------------------------------------------------------------------------------
# State properties
# ---------------------------------------------------------------------------------------------


_INV_CACHE: Dict[int, tuple] = {}
_INV_CACHE_MAX = 100_000


def _violations_of(obj, invariants) -> List[Tuple[str, str, str]]:
    """``(name, relative path, text)`` of every violated invariant of ``obj`` and its nested attrs
    values -- ``invariants.violations`` memoised on object identity (frozen values are immutable,
    so an object shared by two states is checked once)."""
    hit = _INV_CACHE.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    applicable, fields, _ = _shape(type(obj), invariants)
    out: List[Tuple[str, str, str]] = []
    for inv in applicable:
        msg = inv.check(obj)
        if msg is not None:
            out.append((inv.name, inv.rule, msg))
    for name in fields:
        value = getattr(obj, name)
        if _shape(type(value), invariants)[2]:
            for iname, rule, msg in _violations_of(value, invariants):
                out.append((iname, rule, f"{name}: {msg}"))
    if len(_INV_CACHE) >= _INV_CACHE_MAX:
        _INV_CACHE.clear()
    _INV_CACHE[id(obj)] = (obj, out)
    return out


_SHAPES: Dict[type, tuple] = {}


def _shape(cls: type, invariants) -> tuple:
    """Per type: the invariants that apply to it, its attrs field names, whether it is an attrs
    class (the walk of ``invariants.violations``, looked up once per type)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        import attrs

        is_attrs = attrs.has(cls)
        names = tuple(f.name for f in attrs.fields(cls)) if is_attrs else ()
        shape = _SHAPES[cls] = (invariants.applicable_to_type(cls), names, is_attrs)
    return shape


def registered_invariants(core) -> List[Tuple[str, str]]:
    """MC-10: every predicate of ``invariants/`` on the core and its nested machine states
    (the same walk as ``invariants.violations``)."""
    import invariants

    return [(name, f"{name} ({rule}): {msg}") for name, rule, msg in _violations_of(core, invariants)]


def fifo_acceptance_order(core) -> Optional[str]:
    """MC-11 (upstream I13, defect S1): live pending destinations are served in the order their
    current registrations were accepted.  The service order is the FIFO order of each live id's
    first slot; the acceptance order is that of its last slot (its latest insertion)."""
    pend = core.ledger.pending_destinations
    live = pend.by_handoff
    if len(live) < 2:
        return None
    first: Dict[object, int] = {}
    last: Dict[object, int] = {}
    for i, h in enumerate(pend.fifo):
        if h in live:
            first.setdefault(h, i)
            last[h] = i
    service = sorted(first, key=first.get)
    accepted = sorted(last, key=last.get)
    if service != accepted:
        return ("pending destinations would be served as [" + ", ".join(h.value for h in service)
                + "] but were accepted as [" + ", ".join(h.value for h in accepted) + "]")
    return None


def leaked_kv(core) -> int:
    """MC-12: KV still in use by nobody.  vLLM: active blocks; SGLang: token slots neither free nor
    evictable cache (a finished request's tokens stay in the radix tree as evictable cache, which is
    free capacity); other cores: the metrics' active count."""
    name = type(core).__name__
    if name == "VllmCore":
        from model import vllm_kv as kvm

        return kvm.num_active_blocks(core.kv)
    if name == "SglangCore":
        kv = core.kv
        return max(kv.total_tokens - kv.available_tokens - kv.evictable_size, 0)
    return C.metrics(core).active_decode_blocks


def drained_pool_free(core) -> Optional[str]:
    """MC-12 (defect S10): a drained core holds no KV (everything is free or evictable cache)."""
    if not C.is_drained(core):
        return None
    n = leaked_kv(core)
    if n:
        return f"drained core still holds {n} KV unit(s) in use"
    return None


# ---------------------------------------------------------------------------------------------
# Views (MC-40): what DOT labels, ITF states and quotient graphs show
# ---------------------------------------------------------------------------------------------


def source_phase(core, handoff: str, request_id: str, issued: bool) -> str:
    """MC-41: the source-side lifecycle phase of one handoff (spec/handoff-lifecycle.md §2, SRC)."""
    if not issued:
        return "S_unissued"
    src = core.ledger.source_holds
    h = hid(handoff)
    if src.is_held(h):
        return "S_held"
    if src.is_registered(h):
        return "S_pending"
    if C.num_requests(core) and _owned(core, request_id):
        return "S_detached"
    return "S_absent"


def destination_phase(core, handoff: str, request_id: str, issued: bool) -> str:
    """MC-41: the destination-side lifecycle phase of one handoff (spec/handoff-lifecycle.md §3-§5:
    DST, ACT, PEND), with the vLLM sub-state of an active destination (waiting / running /
    preempted)."""
    if not issued:
        return "D_unissued"
    led = core.ledger
    h = hid(handoff)
    if led.pending_destinations.contains_handoff(h):
        e = led.pending_destinations.entry(h)
        tried = e.last_attempt_generation == led.capacity_generation
        return "D_pending(tried)" if tried else "D_pending"
    if led.destination_holds.contains(h):
        return "D_reserved"
    if led.active_destinations.contains_handoff(h):
        sub = _status(core, led.active_destinations.by_handoff[h])
        return f"D_active({sub})" if sub else "D_active"
    return "D_absent"


def _owned(core, request_id: str) -> bool:
    return C.request_status(core, rid(request_id)) is not None


def _status(core, request_id) -> Optional[str]:
    return C.request_status(core, request_id)


def request_phase(core, request_id: str, issued: bool) -> str:
    """MC-41: a plain request's phase: unissued / waiting / running / preempted / done."""
    if not issued:
        return "unissued"
    st = _status(core, rid(request_id))
    return st if st is not None else "done"


def free_units(core) -> Optional[int]:
    try:
        m = C.metrics(core)
    except Exception:  # pragma: no cover - foreign cores
        return None
    return m.total_blocks - m.active_decode_blocks


def queue_view(core) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Live waiting and running ids, in queue order (CORE-6)."""
    waiting, running = C.queues(core)
    return tuple(u.value for u in waiting), tuple(u.value for u in running)
