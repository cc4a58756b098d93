"""The import floor: sdk and services over shared, no service over another, no import circle.

Read from the source (tests/contracts/import_graph.py), imports inside functions included, so a
circle cannot hide behind a deferred import.
"""

from __future__ import annotations

import import_graph
import pytest
from import_graph import Edge, Graph, circles, deferred_for_nothing, floor_violations

# What is left of the tangle this floor plan found (issue 21): the env engine, its templates and
# verifier primitives, the model registry and the learning helpers reach each other through
# imports inside functions. These may only shrink; a module that joins a circle fails.
KNOWN_CIRCLE_MODULES: frozenset[str] = frozenset()
# Imports inside functions that load nothing heavy (they only dodge a circle): may only shrink.
MAX_DEFERRED_FOR_NOTHING = 0


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph.build()


def test_the_graph_reads_every_folder(graph: Graph) -> None:
    floors = {import_graph.floor(m) for m in graph.modules}
    assert {"sdk", "cli", "shared", "catalog"} <= floors
    assert {f for f in floors if f.startswith("service:")} == {
        "service:actor",
        "service:buffer",
        "service:env_registry",
        "service:inference",
        "service:learner",
        "service:tracker",
        "service:ui",
        "service:verifier",
    }
    # Imports in functions are seen: the model registry loads the hf backend only when asked.
    assert any(e.in_function for e in graph.edges)


def test_no_import_goes_up_a_floor_or_across_services(graph: Graph) -> None:
    violations = [str(e) for e in floor_violations(graph)]
    assert violations == [], "\n".join(violations)


def test_the_rules_catch_an_upward_import() -> None:
    fake = Graph(
        modules={},
        edges=[
            Edge("rollout.shared.envs.loader", "rollout.environment", 3, True, False),
            Edge("rollout.services.inference.main", "rollout.services.ui.main", 9, False, False),
            Edge("rollout.snapshots", "rollout.services.buffer.queries", 4, False, False),
            Edge("rollout.services.catalog", "rollout.services.actor.main", 1, False, False),
            Edge("rollout.cli.ui", "rollout.services.ui.main", 2, False, False),
        ],
        external={},
    )
    assert [e.src for e in floor_violations(fake)] == [
        "rollout.shared.envs.loader",
        "rollout.services.inference.main",
        "rollout.snapshots",
    ]


def test_no_circle_among_module_level_imports(graph: Graph) -> None:
    assert circles(graph, module_level_only=True) == []


def test_no_new_circle_through_deferred_imports(graph: Graph) -> None:
    found = {m for circle in circles(graph) for m in circle}
    joined = sorted(found - KNOWN_CIRCLE_MODULES)
    assert joined == [], f"new import circle through {joined}"
    left = sorted(KNOWN_CIRCLE_MODULES - found)
    assert left == [], f"these left the circle: remove them from KNOWN_CIRCLE_MODULES: {left}"


def test_imports_inside_functions_defer_something_heavy(graph: Graph) -> None:
    lazy = deferred_for_nothing(graph)
    assert len(lazy) <= MAX_DEFERRED_FOR_NOTHING, "\n".join(str(e) for e in lazy)
