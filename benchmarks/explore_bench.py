"""Explorer speed: distinct states per second on the clean scenario library, against the target.

    python benchmarks/explore_bench.py [--repeat R] [SCENARIO ...]

Explores each scenario (default: every file under spec/scenarios/clean and spec/scenarios/sglang)
exhaustively with all checks on, ``--repeat`` times in this process, keeps the fastest run, and
prints states, transitions, wall time, distinct states per second, memory per state (the
process's RSS growth over the first run, so later scenarios may reuse freed memory), and the
rate as a fraction of the 20,000 states/s target (issue [5/7 explorer]). There is no compiled
explorer to compare with, so the target is the yardstick. The first run of each scenario also
checks the exploration is complete and clean, so a fast wrong result cannot pass unnoticed.

``--breakdown`` adds one more run per scenario with timers around the explorer's parts (the model's
passes, commands and retries; canonical keys; state checks; views; liveness) and prints each
part's share of that run and its cost per call. The timers add their own overhead, so the shares
are indicative; the rest is the search loop itself.

``--model-cap`` adds one more run per scenario that records every transition the explorer fires
(each distinct core and action once, MC-23), then times those model calls again on their own (best
of three, garbage collector off) and prints the rate the explorer would reach if everything but the
model's transitions cost nothing: a ceiling no explorer tuning can pass.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explorer import ScenarioError, explore, load_scenario  # noqa: E402

TARGET = 20_000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", help="scenario files (default: the clean library)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per scenario; the fastest counts (default 3)")
    ap.add_argument("--breakdown", action="store_true", help="also time the explorer's parts (one extra run)")
    ap.add_argument("--model-cap", action="store_true",
                    help="also print the rate if only the model's transitions cost time (one extra run)")
    args = ap.parse_args()
    paths = [pathlib.Path(p) for p in args.scenarios] or sorted(
        p for d in ("clean", "sglang") for p in (ROOT / "spec" / "scenarios" / d).glob("*.json"))
    try:  # every scenario is read before any is timed: a bad file stops the run with one line
        scenarios = [load_scenario(p) for p in paths]
    except (ScenarioError, OSError) as exc:
        print(f"explore_bench: {exc}", file=sys.stderr)
        return 2
    print(f"{'scenario':40} {'states':>8} {'transitions':>11} {'time':>8} {'states/s':>9} {'B/state':>8} "
          f"{'of target':>9}")
    worst = 0
    for sc in scenarios:
        best = None
        bps = None
        for _ in range(max(args.repeat, 1)):
            exp = explore(sc)
            if best is None:
                if not (exp.complete and exp.clean):
                    print(f"{sc.name}: exploration incomplete or not clean; not a benchmark", file=sys.stderr)
                    worst = 1
                    break
                # the process's RSS growth over the first run (later runs reuse the freed memory)
                bps = exp.bytes_per_state
            if best is None or exp.elapsed_s < best.elapsed_s:
                best = exp
        else:
            rate = best.states_per_s
            mem = f"{bps:,.0f}" if bps else "-"
            print(f"{sc.name:40} {best.num_states:>8,} {best.num_transitions:>11,} {best.elapsed_s:>7.2f}s "
                  f"{rate:>9,.0f} {mem:>8} {rate / TARGET:>8.1%}")
            if args.breakdown:
                breakdown(sc)
            if args.model_cap:
                model_cap(sc, best.num_states)
    return worst


#: (label, module attribute path) of every timed part; ``fire`` is split by action kind
PARTS = (
    ("canonical keys", "search.canonical_key"),
    ("state checks", "search.P.registered_invariants"),
    ("state checks", "search.P.fifo_acceptance_order"),
    ("state checks", "search.P.drained_pool_free"),
    ("views", "search._Viewer.core_part"),
    ("guards", "search.guard_holds"),
    ("liveness", "search._liveness"),
)


def breakdown(sc) -> None:
    """One more exploration of ``sc`` with timers around its parts; prints shares and costs."""
    import time
    from explorer import search

    spent: dict = {}
    calls: dict = {}

    def timed(label, fn, key=None):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                name = label if key is None else key(*a)
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
                calls[name] = calls.get(name, 0) + 1
        return wrapper

    with contextlib.ExitStack() as patches:
        for label, path in PARTS:
            *owner_path, attr = path.split(".")[1:]
            owner = search
            for name in owner_path:
                owner = getattr(owner, name)
            patches.enter_context(_patched(owner, attr, timed(label, getattr(owner, attr))))
        patches.enter_context(_patched(search, "fire", timed("model", search.fire,
                                                             key=lambda core, spec, now: f"model: {spec.kind}")))
        exp = search.explore(sc)
    total = exp.elapsed_s
    for name in sorted(spent, key=spent.get, reverse=True):
        print(f"    {name:36} {spent[name] / total:>6.1%}  {calls[name]:>7,} calls  "
              f"{spent[name] / calls[name] * 1e6:>7.1f} us/call")
    print(f"    {'search loop and the rest':36} {max(total - sum(spent.values()), 0.0) / total:>6.1%}")


@contextlib.contextmanager
def _patched(owner, attr: str, replacement):
    """``owner.attr`` is ``replacement`` inside the block and restored after it."""
    saved = getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, saved)


def model_cap(sc, num_states: int) -> None:
    """The states/s ceiling set by the model's transitions alone on ``sc`` (see ``--model-cap``)."""
    import gc
    import time
    from explorer import search

    fired = []
    fire = search.fire

    def recording(core, spec, now):
        fired.append((core, spec, now))
        return fire(core, spec, now)

    with _patched(search, "fire", recording):
        search.explore(sc)
    best = float("inf")
    gc.disable()
    try:
        for _ in range(3):
            t = time.perf_counter()
            for core, spec, now in fired:
                fire(core, spec, now)
            best = min(best, time.perf_counter() - t)
    finally:
        gc.enable()
    cap = num_states / best if best > 0 else float("inf")
    print(f"    model transitions alone: {len(fired):,} calls in {best:.2f}s, "
          f"{best / max(len(fired), 1) * 1e6:.1f} us/call: at most {cap:,.0f} states/s ({cap / TARGET:.0%} of target)")


if __name__ == "__main__":
    sys.exit(main())
