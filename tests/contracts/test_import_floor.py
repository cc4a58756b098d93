"""The import floor: sdk and services over shared, no service over another, no import circle.

Read from the source (tests/contracts/import_graph.py), imports inside functions included, so a
circle cannot hide behind a deferred import.
"""

from __future__ import annotations

import import_graph
import pytest
from import_graph import Edge, Graph, circles, deferred_for_nothing, floor_violations

# Imports inside functions that defer a project module loading nothing from HEAVY, each with
# its reason. Everything else is imported at the top of its module.
# (`import rollout` loads its public names on first use, through importlib: no entry here.)
JUSTIFIED_DEFERRALS: dict[tuple[str, str], str] = {}


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


def test_no_circle_at_all(graph: Graph) -> None:
    # Imports inside functions count: a deferred import does not make a circle go away.
    assert circles(graph) == []


def test_circles_are_found_through_deferred_imports() -> None:
    fake = Graph(
        modules={},
        edges=[
            Edge("rollout.shared.a", "rollout.shared.b", 1, False, False),
            Edge("rollout.shared.b", "rollout.shared.a", 9, True, False),
            Edge("rollout.shared.b", "rollout.shared.c", 2, False, False),
        ],
        external={},
    )
    assert circles(fake) == [["rollout.shared.a", "rollout.shared.b"]]
    assert circles(fake, module_level_only=True) == []


def test_imports_inside_functions_defer_something_heavy(graph: Graph) -> None:
    lazy = [e for e in deferred_for_nothing(graph) if (e.src, e.dst) not in JUSTIFIED_DEFERRALS]
    assert lazy == [], "\n".join(str(e) for e in lazy)
