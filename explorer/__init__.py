"""Explicit-state model checker for handoff scenarios (spec/model-checking.md, spec/scenarios.md).

Explore every reachable state of a small scenario on one engine core, check the
registered invariants and the explorer's own properties on every state and
transition, find deadlocks, livelocks and starvation on the cooperative
subgraph, and return shortest counterexamples.
"""

from .scenario import Scenario, ScenarioError, load_scenario, scenario_from_dict
from .search import Exploration, Violation, explore

__all__ = ["Scenario", "ScenarioError", "load_scenario", "scenario_from_dict", "Exploration", "Violation", "explore"]
