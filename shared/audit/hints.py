"""What to change in a verifier that let an adversarial policy through, per primitive type."""

from __future__ import annotations

from typing import Any

# Weakest first: the primitive named for a finding is the weakest one that passed.
WEAKNESS = (
    "contains_terms",
    "tool_was_called",
    "no_tool_errors",
    "tool_call_order",
    "url_reached",
    "form_submitted",
    "final_answer_match",
    "sql_result_match",
    "state_match",
    "tests_pass",
)


def weakest(passed: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The passed primitive that most likely let a policy through (by type, then weight)."""
    if not passed:
        return None
    rank = {t: i for i, t in enumerate(WEAKNESS)}
    return min(passed, key=lambda p: (rank.get(p["type"], len(WEAKNESS)), -p.get("weight", 1)))


def hint(primitive: dict[str, Any] | None, policy: str, description: str) -> str:
    """A one-line fix for `primitive` having accepted what `policy` did."""
    if primitive is None:
        return (
            f"the verifier has no primitive that failed {description!r}: add a check of the "
            "task's outcome (state_match, sql_result_match, tests_pass, ...)"
        )
    kind, name = primitive["type"], primitive["name"]
    if kind == "contains_terms":
        what = "an echo of the instruction" if policy == "echo_instruction" else description
        return (
            f"{name} (contains_terms) alone accepts {what}: require terms the instruction does "
            "not contain, or add state_match / final_answer_match on the outcome"
        )
    if kind == "tool_was_called":
        return (
            f"{name} (tool_was_called) accepts any call of the tool ({description}): give it "
            "`args`, or add state_match on what the call must change"
        )
    if kind == "no_tool_errors":
        return f"{name} (no_tool_errors) passes an episode that did nothing wrong by doing little: pair it with a check of the outcome"
    if kind == "tool_call_order":
        return f"{name} (tool_call_order) checks the order only: pair it with state_match on the result"
    if kind == "url_reached":
        return f"{name} (url_reached) is reached by navigating straight to it: add form_submitted with the expected fields, or check the state"
    if kind == "form_submitted":
        return f"{name} (form_submitted) accepted {description}: give it the expected field values"
    if kind == "final_answer_match":
        return f"{name} (final_answer_match) accepted {description}: match the whole answer (mode exact) or normalise it first"
    if kind == "sql_result_match":
        return f"{name} (sql_result_match) accepted {description}: compare the rows themselves, in order where it matters"
    if kind == "state_match":
        return f"{name} (state_match) was satisfied by {description}: make the expected state specific to the task (ids, amounts), and check nothing else changed"
    if kind == "tests_pass":
        return f"{name} (tests_pass) accepted {description}: keep hidden tests the agent cannot see or edit"
    return f"{name} ({kind}) accepted {description}: add a check of the task's outcome"


def partial_hint(score: float, failed: list[str], passed: list[dict[str, Any]]) -> str:
    """A fix for weights that give most of the reward to an episode that failed a check."""
    kept = ", ".join(p["name"] for p in passed) or "none"
    return (
        f"scored {score:.2f} while failing {', '.join(failed)}: the checks it passed ({kept}) "
        "weigh too much; weigh the outcome checks more, so a wrong episode earns little"
    )
