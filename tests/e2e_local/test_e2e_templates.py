"""Every template and every verifier primitive end to end: `rollout test` on an env file, a
scripted model served over real HTTP by the fake OpenAI server, real runtimes and verifier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.openai_server import by_conversation, text_reply, tool_reply

from rollout.shared.envs import known_types

README_REFUND = """
    from rollout import Environment, Task

    env = Environment(
        slug="refund-agent",
        name="Refund Agent",
        template="workflow",
        description="Customer-support refund workflow",
        config={
            "tools": [
                {"name": "lookup_order", "kind": "lookup", "fixturePath": "orders.${args.order_id}"},
                {
                    "name": "refund",
                    "kind": "action",
                    "appendTo": "refunds",
                    "value": {"order_id": "${args.order_id}", "amount": "${args.amount}"},
                },
            ],
            "fixtures": {"orders": {"O-1": {"customer": "Alice", "amount": 100, "status": "shipped"}}},
            "initialMutableState": {"refunds": []},
        },
        tasks=[
            Task(
                instruction="Refund order O-1 for $100 for Alice",
                hidden_ground_truth={"refunds": [{"order_id": "O-1", "amount": 100.0}]},
            ),
        ],
    )
"""

HELPERS_REFUND = """
    from rollout import (
        Environment, Task, lookup_tool, action_tool, mock_tool, workflow_config,
        primitive, verifier_config,
    )

    env = Environment(
        slug="refund-helpers",
        name="Refund Agent",
        template="workflow",
        config=workflow_config(
            tools=[
                lookup_tool("get_order", from_array="orders", match_field="id",
                            description="Read an order.", params_schema={"id": "string"}),
                action_tool("refund", state_array="refunds", description="Issue a refund.",
                            params_schema={"order_id": "string", "amount": "number"}),
                mock_tool("notify", response={"sent": True, "to": "${args.customer}"},
                          params_schema={"customer": "string"}),
            ],
            fixtures={"orders": [{"id": "O-1", "customer": "Alice", "amount": 100}]},
            initial_mutable_state={"refunds": []},
        ),
        tasks=[
            Task(instruction="Refund order O-1 for $100",
                 hidden_ground_truth={"refunds": [{"order_id": "O-1", "amount": 100}]}),
        ],
    )

    env.verifier = verifier_config(
        primitive("called_lookup", "tool_was_called", tool="get_order", weight=1),
        primitive("refund_args", "tool_was_called", tool="refund",
                  args={"order_id": "O-1"}, max_count=1, weight=1),
        primitive("refunds_count", "state_match", expected={"refunds.length": 1}, weight=2),
        primitive("lookup_first", "tool_call_order", tools=["get_order", "refund"], weight=1),
        primitive("no_errors", "no_tool_errors", weight=1),
        primitive("told_user", "contains_terms", terms=["refund", "O-1"], weight=1),
    )
"""


def verdicts(task: dict) -> dict[str, tuple[bool, str]]:
    return {p["name"]: (p["passed"], p["reason"]) for p in task["verifier"]}


def test_readme_refund_passes_with_typed_placeholders(rollout_test) -> None:
    run = rollout_test(
        README_REFUND,
        [
            tool_reply(("lookup_order", {"order_id": "O-1"})),
            tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
            text_reply("Refunded $100 to Alice."),
        ],
    )
    assert run.code == 0, run.stdout + run.stderr
    task = run.task()
    assert task["status"] == "PASS" and task["score"] == 1.0
    # "${args.amount}" kept the number, so 100 matches the ground truth's 100.0.
    assert task["finalState"]["refunds"] == [{"order_id": "O-1", "amount": 100}]
    assert [c["name"] for c in task["toolCalls"]] == ["lookup_order", "refund"]
    assert task["toolCalls"][0]["result"]["customer"] == "Alice"
    assert run.report["summary"] == {
        "tasks": 1,
        "passed": 1,
        "failed": 0,
        "errors": 0,
        "passRate": 1.0,
        "meanScore": 1.0,
        "seconds": run.report["summary"]["seconds"],
    }
    # The model was offered the env's tools over the wire.
    offered = [t["function"]["name"] for t in run.server.chat_bodies[0]["tools"]]
    assert offered == ["lookup_order", "refund"]


def test_wrong_refund_fails_with_a_reason_and_exit_0(rollout_test) -> None:
    run = rollout_test(
        README_REFUND,
        [tool_reply(("refund", {"order_id": "O-1", "amount": 50})), text_reply("Done.")],
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "FAIL" and task["passed"] is False and task["score"] == 0.0
    [(passed, reason)] = verdicts(task).values()
    assert not passed and reason


def test_helpers_workflow_with_every_generic_primitive(rollout_test) -> None:
    run = rollout_test(
        HELPERS_REFUND,
        [
            tool_reply(("get_order", {"id": "O-1"})),
            tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
            tool_reply(("notify", {"customer": "Alice"})),
            text_reply("Your refund for O-1 is on its way."),
        ],
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "PASS", verdicts(task)
    assert {p["type"] for p in task["verifier"]} == {
        "tool_was_called",
        "state_match",
        "tool_call_order",
        "no_tool_errors",
        "contains_terms",
    }
    assert task["toolCalls"][2]["result"] == {"sent": True, "to": "Alice"}


def test_helpers_workflow_failures_are_explained(rollout_test) -> None:
    run = rollout_test(
        HELPERS_REFUND,
        [
            # Refund before looking up, twice, then a lookup of a missing order.
            tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
            tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
            tool_reply(("get_order", {"id": "O-9"})),
            text_reply("All done."),
        ],
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "FAIL"
    v = verdicts(task)
    # The lookup of a missing order failed: it is no lookup.
    assert (
        v["called_lookup"][0] is False and "1 failed call(s) not counted" in v["called_lookup"][1]
    )
    assert v["refund_args"] == (False, v["refund_args"][1]) and "2 time(s)" in v["refund_args"][1]
    assert v["refunds_count"][0] is False
    assert v["no_errors"][0] is False and "get_order" in v["no_errors"][1]
    assert v["told_user"][0] is False
    # Calls were refund, refund, get_order: no refund after a get_order.
    assert v["lookup_first"][0] is False
    assert task["score"] == 0.0  # every check failed, the lookup included


def test_custom_template_mutations_and_output_terms(rollout_test) -> None:
    source = """
        from rollout import Environment, Task, custom_config, custom_tool, primitive, verifier_config

        env = Environment(
            slug="tickets",
            template="custom",
            config=custom_config(
                tools=[
                    custom_tool("list_tickets", description="List tickets.",
                                response="${state.tickets}"),
                    custom_tool(
                        "close_ticket",
                        params_schema={"ticket_id": "string", "note": "string"},
                        mutates=[
                            {"path": "tickets.${args.ticket_id}.status", "value": "closed"},
                            {"path": "closed[]",
                             "value": {"id": "${args.ticket_id}", "note": "${args.note}"}},
                        ],
                        response={"closed": "${args.ticket_id}"},
                    ),
                ],
                initial_state={"tickets": {"T-1": {"status": "open"}, "T-2": {"status": "open"}},
                               "closed": []},
            ),
            tasks=[Task(instruction="Close ticket T-2; the printer was fixed.",
                        hidden_ground_truth={"tickets.T-2.status": "closed", "closed.length": 1,
                                             "closed[0].note": "printer fixed"})],
            verifier=verifier_config(
                primitive("state", "state_match"),
                primitive("says_closed", "contains_terms", terms=["closed", "T-2"]),
            ),
        )
    """
    run = rollout_test(
        source,
        [
            tool_reply(("list_tickets", {})),
            tool_reply(("close_ticket", {"ticket_id": "T-2", "note": "printer fixed"})),
            text_reply("Ticket T-2 is closed."),
        ],
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "PASS", verdicts(task)
    assert task["toolCalls"][0]["result"]["T-1"] == {"status": "open"}
    assert task["toolCalls"][1]["result"] == {"closed": "T-2"}
    assert task["finalState"]["tickets"]["T-2"]["status"] == "closed"


SQL_ENV = """
    from rollout import Environment, Task, primitive, verifier_config

    env = Environment(
        slug="sales",
        template="sql",
        schema="CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, country TEXT);",
        seed=("INSERT INTO customers VALUES (1, 'ana', 'JP'), (2, 'ben', 'DE'), "
              "(3, 'cai', 'JP'), (4, 'dev', 'JP');"),
        tasks=[
            Task(instruction="Which customers are from Japan? Submit the query.",
                 hidden_ground_truth={"query": "SELECT name FROM customers WHERE country = 'JP'",
                                      "answer": 3}),
        ],
        verifier=verifier_config(
            primitive("rows", "sql_result_match", weight=2),
            primitive("count", "final_answer_match", mode="numeric", weight=1),
            primitive("names", "final_answer_match", expected="ana.*cai.*dev", mode="regex"),
        ),
    )
"""


def test_sql_template_result_and_answer_primitives(rollout_test) -> None:
    run = rollout_test(
        SQL_ENV,
        [
            tool_reply(("describe_schema", {})),
            tool_reply(("run_sql", {"query": "SELECT name FROM customers WHERE country='JP'"})),
            # Different order and spelling, same multiset of rows.
            tool_reply(
                (
                    "submit_answer",
                    {"query": "SELECT name FROM customers WHERE country = 'JP' ORDER BY name DESC"},
                )
            ),
            text_reply("3 customers: ana, cai and dev."),
        ],
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "PASS", verdicts(task)
    schema = task["toolCalls"][0]["result"]["tables"][0]
    assert schema["name"] == "customers"
    assert task["toolCalls"][1]["result"]["rowCount"] == 3


def test_sql_template_wrong_rows_fail(rollout_test) -> None:
    run = rollout_test(
        SQL_ENV,
        [
            tool_reply(("submit_answer", {"query": "SELECT name FROM customers"})),
            tool_reply(("run_sql", {"query": "SELEC nonsense"})),
            text_reply("There are 4."),
        ],
    )
    assert run.code == 0
    task = run.task()
    v = verdicts(task)
    assert task["status"] == "FAIL"
    assert v["rows"][0] is False and v["count"][0] is False and v["names"][0] is False
    # The bad SQL came back to the model as a tool error, not a crash.
    assert task["toolCalls"][1]["error"]


def test_code_editing_fix_runs_tests_in_the_sandbox(rollout_test) -> None:
    source = """
        from rollout import Environment, Task, code_editing_config, primitive, verifier_config

        env = Environment(
            slug="fix-add",
            template="code-editing",
            config=code_editing_config(
                {"calc.py": "def add(a, b):\\n    return a - b\\n",
                 "check.py": "from calc import add\\nassert add(2, 3) == 5\\nprint('ok')\\n"},
                test_command=["python3", "check.py"],
                test_timeout_seconds=30,
            ),
            tasks=[Task(
                instruction="add() in calc.py is wrong; fix it.",
                hidden_ground_truth={
                    "tests": {"hidden.py": "from calc import add\\nassert add(-1, 1) == 0\\n"},
                },
            )],
            verifier=verifier_config(
                primitive("hidden_tests", "tests_pass", command=["python3", "hidden.py"],
                          weight=3),
                primitive("fixed_file", "state_match",
                          expected={'files["calc.py"]': "def add(a, b):\\n    return a + b\\n"}),
                primitive("ran_tests", "tool_was_called", tool="run_tests"),
            ),
        )
    """
    fixed = "def add(a, b):\n    return a + b\n"
    run = rollout_test(
        source,
        [
            tool_reply(("list_files", {})),
            tool_reply(("read_file", {"path": "calc.py"})),
            tool_reply(("write_file", {"path": "calc.py", "content": fixed})),
            tool_reply(("run_tests", {})),
            text_reply("Fixed: add now adds."),
        ],
    )
    assert run.code == 0, run.stdout + run.stderr
    task = run.task()
    calls = {c["name"]: c for c in task["toolCalls"]}
    assert calls["list_files"]["result"] == ["calc.py", "check.py"]
    assert calls["read_file"]["result"]["content"] == "def add(a, b):\n    return a - b\n"
    assert calls["run_tests"]["result"]["passed"] is True, calls["run_tests"]
    assert task["status"] == "PASS", verdicts(task)


def test_code_editing_unfixed_code_fails_hidden_tests(rollout_test) -> None:
    source = """
        from rollout import Environment, Task, code_editing_config

        env = Environment(
            slug="fix-add",
            template="code-editing",
            config=code_editing_config({"calc.py": "def add(a, b):\\n    return a - b\\n"},
                                       test_command=["python3", "hidden.py"]),
            tasks=[Task(instruction="Fix add().",
                        hidden_ground_truth={"tests": {
                            "hidden.py": "from calc import add\\nassert add(2, 3) == 5\\n"}})],
        )
    """
    run = rollout_test(source, [text_reply("Looks fine to me.")])
    assert run.code == 0
    task = run.task()
    assert task["status"] == "FAIL"
    [tests] = task["verifier"]
    assert tests["type"] == "tests_pass" and not tests["passed"]


BROWSER_ENV = """
    from rollout import Environment, Task, browser_config, browser_page, primitive, verifier_config

    env = Environment(
        slug="signup",
        template="browser",
        config=browser_config(
            [
                browser_page("https://shop.test/", title="Shop", elements=[
                    {"id": "to-signup", "type": "link", "text": "Sign up",
                     "href": "https://shop.test/signup"}]),
                browser_page("https://shop.test/signup", title="Sign up", elements=[
                    {"id": "f", "type": "form", "action": "https://shop.test/welcome"},
                    {"id": "email", "type": "input", "name": "email", "form": "f",
                     "required": True},
                    {"id": "go", "type": "button", "text": "Create", "form": "f"}]),
                browser_page("https://shop.test/welcome", title="Welcome", text="Hi!"),
            ],
            initial_url="https://shop.test/",
        ),
        tasks=[Task(instruction="Sign up ana@example.com.",
                    hidden_ground_truth={"form": "f", "fields": {"email": "ana@example.com"},
                                         "url": "https://shop.test/welcome"})],
        verifier=verifier_config(
            primitive("submitted", "form_submitted", weight=2),
            primitive("welcomed", "url_reached", mode="final"),
            primitive("visited_signup", "url_reached", url="https://shop.test/sign",
                      match="prefix"),
        ),
    )
"""


def test_browser_navigation_and_form_submission(rollout_test) -> None:
    run = rollout_test(
        BROWSER_ENV,
        [
            tool_reply(("read_page", {})),
            tool_reply(("click", {"element_id": "to-signup"})),
            tool_reply(("type", {"element_id": "email", "text": "ana@example.com"})),
            tool_reply(("click", {"element_id": "go"})),
            text_reply("Signed up."),
        ],
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "PASS", verdicts(task)
    assert task["finalState"]["url"] == "https://shop.test/welcome"
    assert task["finalState"]["submissions"][0]["values"] == {"email": "ana@example.com"}


def test_browser_missing_required_field_is_a_tool_error_and_fails(rollout_test) -> None:
    run = rollout_test(
        BROWSER_ENV,
        [
            tool_reply(("navigate", {"url": "https://shop.test/signup"})),
            tool_reply(("submit", {"form_id": "f"})),
            text_reply("Could not."),
        ],
    )
    task = run.task()
    assert run.code == 0 and task["status"] == "FAIL"
    assert "required" in task["toolCalls"][1]["error"]
    v = verdicts(task)
    assert v["submitted"][0] is False and v["welcomed"][0] is False
    assert v["visited_signup"][0] is True


def test_plugin_environment(rollout_test) -> None:
    source = """
        from rollout import Environment, Task, plugin_config

        env = Environment(
            slug="counter",
            template="plugin",
            config=plugin_config("e2e_counter_plugin.counter:make_env", {"step": 1}),
            tasks=[Task(instruction="Count to 2.", input={"target": 2},
                        hidden_ground_truth={"value": 2})],
        )
    """
    plugin = """
        class Counter:
            def __init__(self, options):
                self.step_size = options.get("step", 1)
                self.value = 0

            def tools(self):
                return [{"name": "increment", "description": "Add one.",
                         "parameters": {"type": "object", "properties": {}}}]

            def reset(self, task):
                self.value = 0
                self.target = task["input"]["target"]

            def step(self, name, arguments):
                if self.value >= self.target:
                    raise ValueError("already at the target")
                self.value += self.step_size
                return {"value": self.value}

            def state(self):
                return {"value": self.value}


        def make_env(options):
            return Counter(options)
    """
    run = rollout_test(
        source,
        [
            tool_reply(("increment", {})),
            tool_reply(("increment", {}), ("increment", {})),
            text_reply("Reached 2."),
        ],
        files={"e2e_counter_plugin/__init__.py": "", "e2e_counter_plugin/counter.py": plugin},
    )
    assert run.code == 0, run.stdout + run.stderr
    task = run.task()
    assert task["status"] == "PASS", verdicts(task)
    # The third increment overshot: the plugin's exception is a tool error the model saw.
    assert [c["error"] is not None for c in task["toolCalls"]] == [False, False, True]
    assert "already at the target" in task["toolCalls"][2]["error"]
    assert task["finalState"] == {"value": 2}


def test_every_primitive_is_exercised_here() -> None:
    # New primitives must get an end-to-end test in this file.
    exercised = {
        "state_match",
        "contains_terms",
        "tool_was_called",
        "no_tool_errors",
        "tool_call_order",
        "final_answer_match",
        "sql_result_match",
        "tests_pass",
        "url_reached",
        "form_submitted",
        "ruler",
    }
    # Primitives whose end-to-end test needs a peer server or a trained model live with it.
    elsewhere = {
        "env_reward": "tests/interop/test_openenv_consume.py",
        "verifiers_rubric": "tests/interop/test_verifiers_env.py",
        "reward_model": "tests/learner/test_reward_model_verifier.py",
    }
    root = Path(__file__).resolve().parents[2]
    for name, file in elsewhere.items():
        assert name not in known_types() or (root / file).is_file(), (name, file)
    exercised |= set(elsewhere)
    assert set(known_types()) <= exercised, set(known_types()) - exercised


def test_batched_tasks_each_follow_their_own_script(rollout_test) -> None:
    source = """
        from rollout import Environment, Task

        env = Environment(
            slug="refunds",
            template="workflow",
            config={
                "tools": [{"name": "refund", "kind": "action", "appendTo": "refunds",
                           "value": {"order_id": "${args.order_id}"}}],
                "initialMutableState": {"refunds": []},
            },
            tasks=[
                Task(instruction=f"Refund order O-{i}",
                     hidden_ground_truth={"refunds": [{"order_id": f"O-{i}"}]},
                     split="train" if i < 3 else "test")
                for i in range(1, 5)
            ],
        )
    """
    script = by_conversation(
        {
            "O-1": [tool_reply(("refund", {"order_id": "O-1"})), text_reply("ok")],
            "O-2": [tool_reply(("refund", {"order_id": "O-9"})), text_reply("ok")],
            "O-3": [text_reply("I refuse.")],
            "O-4": [tool_reply(("refund", {"order_id": "O-4"})), text_reply("ok")],
        }
    )
    run = rollout_test(source, script)
    assert run.code == 0
    statuses = [t["status"] for t in run.report["environments"][0]["tasks"]]
    assert statuses == ["PASS", "FAIL", "FAIL", "PASS"]
    assert run.report["summary"]["passRate"] == 0.5
    # Four episodes batched: turn one carries four requests, turn two three.
    assert len(run.server.chat_bodies) == 7

    split = rollout_test(source, script, "--split", "test")
    assert [t["index"] for t in split.report["environments"][0]["tasks"]] == [2, 3]
    limited = rollout_test(source, script, "--limit", "2")
    assert [t["index"] for t in limited.report["environments"][0]["tasks"]] == [0, 1]
    one = rollout_test(source, script, "--task", "3")
    assert [t["index"] for t in one.report["environments"][0]["tasks"]] == [3]
    assert json.loads(one.stdout)["summary"]["passed"] == 1


def _ruler_judge(body: dict) -> dict:
    """A scripted RULER judge: trajectories that refunded O-1 score 0.9, others 0.1."""
    import re

    text = body["messages"][-1]["content"]
    found = re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', text, re.DOTALL)
    scores = [
        {
            "trajectory_id": i,
            "explanation": "refunded" if "O-1" in t else "did nothing",
            "score": 0.9 if "refund" in t and "O-1" in t else 0.1,
        }
        for i, t in found
    ]
    return text_reply(json.dumps({"scores": scores}))


def test_ruler_primitive_scores_with_a_judge_model(rollout_test, fake_openai) -> None:
    judge = fake_openai(_ruler_judge)
    source = f"""
        from rollout import Environment, Task

        env = Environment(
            slug="refund-ruler",
            template="workflow",
            config={{
                "tools": [{{"name": "refund", "kind": "action", "appendTo": "refunds",
                           "value": {{"order_id": "${{args.order_id}}"}}}}],
                "initialMutableState": {{"refunds": []}},
            }},
            tasks=[Task(instruction="Refund order O-1")],
            verifier=[{{"name": "judge", "type": "ruler",
                       "judgeModel": "{judge.base_url}#judge",
                       "rubric": "Refunding the right order is what counts."}}],
        )
    """
    run = rollout_test(
        source, [tool_reply(("refund", {"order_id": "O-1"})), text_reply("Refunded.")]
    )
    assert run.code == 0, run.stdout + run.stderr
    task = run.task()
    assert task["status"] == "PASS", verdicts(task)
    assert task["score"] == pytest.approx(0.9)
    assert "refunded" in verdicts(task)["judge"][1]
    [body] = judge.chat_bodies
    assert "Refunding the right order is what counts." in body["messages"][0]["content"]
    assert body["model"] == "judge"
