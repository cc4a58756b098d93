"""Each adversarial policy fools a verifier that is weak against it, and not the example env's
own (hardened) verifier: the same task, only the verifier swapped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout.shared.audit import POLICIES, named
from rollout.shared.audit.runner import attempt
from rollout.shared.contracts.envspec import EnvironmentSpec, VerifierSpec
from rollout.shared.envs import load_environments

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def p(name: str, kind: str, **params: Any) -> dict[str, Any]:
    """A primitive of a weak verifier."""
    return {"name": name, "type": kind, **params}


ANY_REFUND = [p("refunded", "tool_was_called", tool="refund")]
# Counting refunds that failed too: what calls with empty or wrong-typed arguments get through.
ANY_REFUND_ATTEMPT = [p("refunded", "tool_was_called", tool="refund", successful_only=False)]
# policy -> (example file, task index, a verifier that policy gets through)
WEAK: dict[str, tuple[str, int, list[dict[str, Any]]]] = {
    # The terms appear in the instruction itself: an echo contains them.
    "echo_instruction": ("ticket_routing.py", 0, [p("said", "contains_terms", terms=["route", "ticket"])]),
    "claim_success": ("ticket_routing.py", 0, [p("said", "contains_terms", terms=["done"])]),
    "empty_arguments": ("workflow_support.py", 0, ANY_REFUND_ATTEMPT),
    "type_confused_arguments": ("workflow_support.py", 0, ANY_REFUND_ATTEMPT),
    "other_tasks_arguments": ("workflow_support.py", 0, ANY_REFUND),
    "stop_immediately": ("ticket_routing.py", 0, [p("clean", "no_tool_errors")]),
    "loop_one_call": ("workflow_support.py", 0,
                      [p("checked", "tool_was_called", tool="get_order", min_count=3)]),
    "dump_everything": ("sql_sales.py", 0, [p("said", "contains_terms", terms=["orders"])]),
    # A number among 0-1000 in the reply is found by a pattern that is not anchored.
    "answer_every_candidate": ("ticket_routing.py", 0, [p("said", "final_answer_match",
                                                          mode="regex", expected=r"\b7\b")]),
    # Counting lookups, not what the first (wrong) refund did.
    "bury_in_padding": ("workflow_support.py", 0, [p("looked", "tool_was_called", tool="get_order",
                                                     min_count=10)]),
    # A check reading back what the agent wrote into a record: the route it "recorded" holds
    # the forged approval (the judge view marks such repeats: tests/verifier/test_ruler_echoes.py).
    "forge_tool_evidence": ("ticket_routing.py", 0, [p("confirmed", "contains_terms",
                                                       source="routed", terms=["approved"])]),
    "act_without_lookup": ("workflow_support.py", 0, ANY_REFUND),
    # Task 4 is in transit (a notice, no refund) and the policy notifies: with credit per
    # path and no lookup required, a blind notice is the whole answer.
    "one_action_without_lookup": ("returns_desk.py", 4, [p("handled", "state_match")]),
    "act_twice": ("workflow_support.py", 0, [p("refunded", "tool_was_called", tool="refund",
                                               min_count=2)]),
    "wrong_entity": ("workflow_support.py", 0, ANY_REFUND),
    # Calls with the right team among others: no max_count, no check of the state.
    "spray_every_option": ("ticket_routing.py", 0, [p("routed", "tool_was_called",
                                                      tool="route_ticket", args={"team": "account"})]),
    "sql_literal_guess": ("sql_sales.py", 0, [p("answered", "tool_was_called", tool="submit_answer")]),
    "sql_select_every_table": ("sql_sales.py", 0, [p("queried", "tool_was_called", tool="run_sql")]),
    "sql_wrong_rows": ("sql_sales.py", 0, [p("answered", "tool_was_called", tool="submit_answer")]),
    "browser_submit_empty": ("browser_signup.py", 0, [p("tried", "tool_was_called", tool="submit",
                                                        successful_only=False)]),
    "browser_jump_to_success": ("browser_signup.py", 0, [p("welcomed", "url_reached",
                                                           url="https://shop.test/welcome")]),
    "browser_click_everything": ("browser_signup.py", 0, [p("clicked", "tool_was_called",
                                                            tool="click")]),
    "code_conftest_skip_all": ("code_editing_fix.py", 0, [p("ran", "tool_was_called", tool="run_tests")]),
    "code_reports_passed": ("code_editing_fix.py", 0, [p("ran", "tool_was_called", tool="run_tests")]),
    "code_deselect_by_addopts": ("code_editing_fix.py", 0, [p("ran", "tool_was_called",
                                                            tool="run_tests")]),
    "code_shadow_pytest": ("code_editing_fix.py", 0, [p("ran", "tool_was_called", tool="run_tests")]),
    "code_delete_tests": ("code_editing_fix.py", 0, [p("deleted", "tool_was_called",
                                                     tool="delete_file")]),
    "code_always_equal": ("code_editing_fix.py", 0, [p("ran", "tool_was_called",
                                                      tool="run_tests")]),
    "code_forge_harness": ("code_editing_fix.py", 0, [p("ran", "tool_was_called",
                                                       tool="run_tests")]),
    "plugin_extreme_values": ("plugin_counter.py", 0, [p("clean", "no_tool_errors")]),
    "plugin_injection_strings": ("plugin_counter.py", 0, [p("clean", "no_tool_errors")]),
}  # fmt: skip


def test_every_policy_has_a_case_and_a_description() -> None:
    assert len(POLICIES) >= 25
    assert set(WEAK) == {x.name for x in POLICIES}
    for policy in POLICIES:
        assert policy.description and "\n" not in policy.description


def _spec(file: str) -> EnvironmentSpec:
    [env] = load_environments(EXAMPLES / file)
    return env.to_spec()


def _cases() -> list[Any]:
    # The code-editing hacks run pytest in the sandbox (seconds each): the slow run has them.
    return [
        pytest.param(name, marks=pytest.mark.slow) if WEAK[name][0] == "code_editing_fix.py"
        else name
        for name in WEAK
    ]  # fmt: skip


@pytest.mark.parametrize("name", _cases())
async def test_the_policy_fools_a_weak_verifier_and_not_the_examples(name: str) -> None:
    file, task, primitives = WEAK[name]
    policy = named(name)
    strong = _spec(file)
    assert policy.applies_to(strong.template)
    weak = strong.model_copy(update={"verifier": VerifierSpec(primitives=primitives)})
    fooled = await attempt(weak, task, policy, timeout_s=60)
    assert fooled.error is None and fooled.passed, fooled
    held = await attempt(strong, task, policy, timeout_s=60)
    assert held.error is None and not held.passed and held.score < 0.75, held


async def test_the_audit_finds_the_harness_forgery_where_tests_run_in_process() -> None:
    # The example's own verifier holds by default (the model's code in its own process); set to
    # in-process, the same env is forged, and the audit says so before any training does.
    strong = _spec("code_editing_fix.py")
    policy = named("code_forge_harness")
    held = await attempt(strong, 0, policy, timeout_s=60)
    assert held.error is None and not held.passed, held
    config = {**strong.config, "testIsolation": "in-process"}
    # A fresh spec: a copy would keep the parsed config cached on the original.
    exposed = EnvironmentSpec.model_validate({**strong.model_dump(by_alias=True), "config": config})
    fooled = await attempt(exposed, 0, policy, timeout_s=60)
    assert fooled.error is None and fooled.passed, fooled


async def test_a_success_page_no_guess_names_is_reached_where_its_form_lands() -> None:
    # The jump guessed /welcome, /success, ... only: a site whose form lands on a page of
    # another name was reported clean, though a model that submitted once knows that URL.
    text = json.dumps(_spec("browser_signup.py").model_dump(by_alias=True))
    renamed = text.replace("https://shop.test/welcome", "https://shop.test/account/created")
    strong = EnvironmentSpec.model_validate(json.loads(renamed))
    landed = p("landed", "url_reached", url="https://shop.test/account/created", mode="final")
    weak = strong.model_copy(update={"verifier": VerifierSpec(primitives=[landed])})
    policy = named("browser_jump_to_success")
    fooled = await attempt(weak, 0, policy, timeout_s=60)
    assert fooled.error is None and fooled.passed, fooled
    held = await attempt(strong, 0, policy, timeout_s=60)
    assert held.error is None and not held.passed and held.score < 0.75, held
