"""The example environments in examples/: valid, split into train/test, solvable by a script."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.shared.envs import load_environments, run_tool_script, score, validate_environment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    (env,) = load_environments(EXAMPLES / name)
    return env


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    for env in load_environments(path):
        assert validate_environment(env) == []
        if path.name != "refund_agent.py":  # the README env, kept verbatim
            # Generated tasks, enough of each split for a model to learn on one and show it
            # on the other (and a validation split where recipes are tuned on the env).
            assert {t.split for t in env.tasks} - {"validation"} == {"train", "test"}
            assert len(env.tasks) >= 24
            assert sum(t.split == "test" for t in env.tasks) >= 6


async def test_workflow_example_solved() -> None:
    env = load("workflow_support.py")
    task = env.tasks[7]
    order_id = task.id
    amount = task.hidden_ground_truth["refunds"][0]["amount"]
    t = await run_tool_script(
        env,
        7,
        [("get_order", {"id": order_id}), ("refund", {"order_id": order_id, "amount": amount})],
    )
    assert (await score(env, 7, t)).passed


async def test_custom_example_solved() -> None:
    env = load("custom_tickets.py")
    mine, other = env.tasks[2].id, env.tasks[3].id
    note = env.tasks[2].hidden_ground_truth["closed.0.note"]
    assert f'"{note}"' in env.tasks[2].instruction  # the note to write is in the task
    t = await run_tool_script(env, 2, [("close_ticket", {"ticket_id": mine, "note": note})])
    assert (await score(env, 2, t)).passed
    junk = await run_tool_script(env, 2, [("close_ticket", {"ticket_id": mine, "note": "fixed"})])
    assert not (await score(env, 2, junk)).passed
    wrong = await run_tool_script(env, 2, [("close_ticket", {"ticket_id": other, "note": "x"})])
    assert not (await score(env, 2, wrong)).passed


async def test_sql_example_solved() -> None:
    env = load("sql_sales.py")
    for i, task in enumerate(env.tasks):
        query = task.hidden_ground_truth["query"]
        t = await run_tool_script(env, i, [("submit_answer", {"query": query})])
        assert (await score(env, i, t)).passed, query


async def test_no_guessed_number_answers_the_sql_examples_counting_questions() -> None:
    """Each country's customers and each month's orders differ in number: a constant guess
    submitted without reading the data answers at most one question of each kind."""
    env = load("sql_sales.py")
    counting = [i for i, t in enumerate(env.tasks) if "COUNT(*)" in t.hidden_ground_truth["query"]]
    assert len(counting) >= 10
    for guess in range(13):
        passed = 0
        for i in counting:
            t = await run_tool_script(env, i, [("submit_answer", {"answer": guess})])
            passed += (await score(env, i, t)).passed
        assert passed <= 2, f"{guess} answers {passed} counting questions"


async def test_browser_example_solved() -> None:
    env = load("browser_signup.py")
    fields = env.tasks[1].hidden_ground_truth["fields"]
    t = await run_tool_script(
        env,
        1,
        [
            ("click", {"element_id": "nav-signup"}),
            ("type", {"element_id": "email", "text": fields["email"]}),
            ("type", {"element_id": "plan", "text": fields["plan"]}),
            ("click", {"element_id": "go"}),
        ],
    )
    result = await score(env, 1, t)
    assert result.passed, result


async def test_code_editing_example_solved() -> None:
    env = load("code_editing_fix.py")
    task = env.tasks[1]
    (path, buggy), *_ = task.input["files"].items()
    unchanged = await run_tool_script(env, 1, [])
    assert not (await score(env, 1, unchanged)).passed  # the shipped code is buggy
    fixed = task.hidden_ground_truth["solution"][path]
    assert fixed != buggy
    t = await run_tool_script(env, 1, [("write_file", {"path": path, "content": fixed})])
    assert (await score(env, 1, t)).passed


async def test_code_editing_example_is_not_fooled_by_a_result_equal_to_everything() -> None:
    env = load("code_editing_fix.py")
    task = env.tasks[0]
    (path, buggy), *_ = task.input["files"].items()
    header = buggy.splitlines()[0]  # `def add(a, b):`
    # An int whose == always says True, even when the expected value is on the left.
    forged = (
        "class _Any(int):\n    def __eq__(self, other):\n        return True\n"
        f"    __hash__ = int.__hash__\n\n\n{header}\n    return _Any(0)\n"
    )
    t = await run_tool_script(env, 0, [("write_file", {"path": path, "content": forged})])
    result = await score(env, 0, t)
    assert not result.passed and result.score == 0.0, result


async def test_plugin_example_solved() -> None:
    env = load("plugin_counter.py")
    t = await run_tool_script(env, 0, [("increment", {})] * 3)  # task 0's target is 3
    assert (await score(env, 0, t)).passed
    # One increment past the target is refused by the plugin and fails the verifier.
    over = await run_tool_script(env, 0, [("increment", {})] * 4)
    assert not (await score(env, 0, over)).passed
