"""Explicit-state model checker for handoff scenarios (spec/model-checking.md, spec/scenarios.md).

Explore every reachable state of a small scenario on one engine core, check the
registered invariants and the explorer's own properties on every state and
transition, find deadlocks, livelocks and starvation on the cooperative
subgraph, and return shortest counterexamples.
"""

import importlib

#: the package's names and the module that defines each, imported on first use, so that a light
#: submodule (``explorer.files``, used by the replay's report writer) does not load the search
_EXPORTS = {"Scenario": "scenario", "ScenarioError": "scenario", "load_scenario": "scenario",
            "scenario_from_dict": "scenario", "Exploration": "search", "Violation": "search", "explore": "search"}

__all__ = list(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
