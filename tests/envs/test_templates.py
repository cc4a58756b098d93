"""Every template's tools through the public engine: build_runtime, call_tool, final_state."""

from __future__ import annotations

import pytest

from rollout import (
    Environment,
    RolloutError,
    Task,
    action_tool,
    browser_config,
    browser_page,
    custom_config,
    custom_tool,
    lookup_tool,
    mock_tool,
    plugin_config,
    workflow_config,
)
from rollout.shared.envs import build_runtime, run_tool_script, score

# ------------------------------------------------------------------ workflow


def workflow_env() -> Environment:
    return Environment(
        slug="wf",
        template="workflow",
        config=workflow_config(
            tools=[
                lookup_tool("get_order", from_array="orders", match_field="id"),
                lookup_tool("order_by_path", fixture_path="by_id.${args.order_id}"),
                action_tool(
                    "refund",
                    state_array="refunds",
                    params_schema={"order_id": "string", "amount": "number"},
                ),
                action_tool(
                    "note",
                    append_to="notes",
                    value={"text": "${args.text}", "len": "${args.text.length}"},
                ),
                mock_tool("weather", response={"city": "${args.city}", "temp": 21}),
            ],
            fixtures={
                "orders": [{"id": "O-1", "amount": 100}, {"id": 7, "amount": 5}],
                "by_id": {"O-1": {"amount": 100}},
            },
            initial_mutable_state={"refunds": []},
        ),
        tasks=[Task(instruction="x", hidden_ground_truth={"refunds": []})],
    )


async def test_workflow_tools() -> None:
    rt = build_runtime(workflow_env(), 0)
    names = [t.name for t in rt.tool_specs()]
    assert names == ["get_order", "order_by_path", "refund", "note", "weather"]
    refund_schema = rt.tool_specs()[2].parameters
    assert refund_schema["required"] == ["order_id", "amount"]
    assert refund_schema["properties"]["amount"] == {"type": "number"}

    r = await rt.call_tool("get_order", {"id": "O-1"})
    assert r.ok and r.output == {"id": "O-1", "amount": 100}
    # Text "7" matches the numeric id 7 (models often quote numbers).
    assert (await rt.call_tool("get_order", {"id": "7"})).output["amount"] == 5
    missing = await rt.call_tool("get_order", {"id": "O-9"})
    assert missing.error == 'no orders entry with id = "O-9"'
    assert (await rt.call_tool("order_by_path", {"order_id": "O-1"})).output == {"amount": 100}
    assert (
        "not found: by_id.O-2" in (await rt.call_tool("order_by_path", {"order_id": "O-2"})).error
    )

    # Lookups return copies: mutating the output must not change the fixtures.
    out = (await rt.call_tool("get_order", {"id": "O-1"})).output
    out["amount"] = 0
    assert (await rt.call_tool("get_order", {"id": "O-1"})).output["amount"] == 100

    ok = await rt.call_tool("refund", {"order_id": "O-1", "amount": 100})
    assert ok.ok and ok.output == {"ok": True, "recorded": {"order_id": "O-1", "amount": 100}}
    bad = await rt.call_tool("refund", {"order_id": "O-1", "amount": "lots"})
    assert bad.error == "refund: argument 'amount' must be number, got string"
    assert (
        "missing required argument 'amount'"
        in (await rt.call_tool("refund", {"order_id": "O-1"})).error
    )

    await rt.call_tool("note", {"text": "hello"})
    assert (await rt.call_tool("weather", {"city": "Oslo"})).output == {"city": "Oslo", "temp": 21}
    assert "unknown tool 'nope'" in (await rt.call_tool("nope", {})).error
    assert "must be a JSON object" in (await rt.call_tool("weather", ["Oslo"])).error  # type: ignore[arg-type]

    assert rt.final_state() == {
        "refunds": [{"order_id": "O-1", "amount": 100}],
        "notes": [{"text": "hello", "len": 5}],
    }
    await rt.close()


async def test_workflow_episodes_are_isolated() -> None:
    env = workflow_env()
    first = await run_tool_script(env, 0, [("refund", {"order_id": "O-1", "amount": 1})])
    second = await run_tool_script(env, 0, [])
    assert first.final_state["refunds"] and second.final_state == {"refunds": []}
    assert env.config["initialMutableState"] == {"refunds": []}


# ------------------------------------------------------------------ custom


def custom_env() -> Environment:
    return Environment(
        slug="tickets",
        template="custom",
        config=custom_config(
            tools=[
                custom_tool(
                    "close",
                    params_schema={"id": "string", "note": "string?"},
                    mutates=[
                        {"path": "tickets.${args.id}.status", "value": "closed"},
                        {"path": "log[]", "value": "closed ${args.id}"},
                    ],
                    response={"closed": "${args.id}", "open_left": "${state.log.length}"},
                ),
                custom_tool("remember", mutates="memory[]"),
                custom_tool("status", response="${state.tickets}"),
                custom_tool("broken", mutates={"path": "log.deep", "value": 1}),
            ],
            initial_state={"tickets": {"T-1": {"status": "open"}}, "log": []},
        ),
        tasks=[Task(instruction="close T-1", hidden_ground_truth={"tickets.T-1.status": "closed"})],
    )


async def test_custom_tools() -> None:
    env = custom_env()
    rt = build_runtime(env, 0)
    close_schema = rt.tool_specs()[0].parameters
    assert close_schema["required"] == ["id"]  # `note` is optional ("string?")
    r = await rt.call_tool("close", {"id": "T-1"})
    assert r.output == {"closed": "T-1", "open_left": 1}
    await rt.call_tool("remember", {"fact": "blue"})
    assert (await rt.call_tool("status", {})).output == {"T-1": {"status": "closed"}}
    broken = await rt.call_tool("broken", {})
    assert broken.error and "cannot update state at log.deep" in broken.error
    state = rt.final_state()
    assert state == {
        "tickets": {"T-1": {"status": "closed"}},
        "log": ["closed T-1"],
        "memory": [{"fact": "blue"}],
    }
    trajectory = await run_tool_script(env, 0, [("close", {"id": "T-1"})])
    assert (await score(env, 0, trajectory)).passed


async def test_a_custom_path_an_argument_makes_deep_is_the_calls_error() -> None:
    # An id of 300 dots nested `tickets.${args.id}.status` 300 deep: the trajectory could not
    # be serialised and its whole batch failed (1200 failed final_state: errored, no verdict).
    env = custom_env()
    deep = ".".join(["a"] * 300)
    trajectory = await run_tool_script(env, 0, [("close", {"id": deep})])
    [call] = trajectory.tool_calls
    assert call.error and "more than 32 segments" in call.error and len(call.error) < 300
    assert trajectory.final_state == {"tickets": {"T-1": {"status": "open"}}, "log": []}
    trajectory.model_dump_json()  # it travels
    assert (await score(env, 0, trajectory)).passed is False


# ------------------------------------------------------------------ sql

SCHEMA = "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL);"
SEED = "INSERT INTO t VALUES (1, 'a', 1.5), (2, 'b', 2.0), (3, 'c', 2.0);"


def sql_env(**gt: object) -> Environment:
    return Environment(
        slug="db",
        template="sql",
        schema=SCHEMA,
        seed=SEED,
        tasks=[Task(instruction="q", hidden_ground_truth=gt or {"query": "SELECT id FROM t"})],
    )


async def test_sql_tools(tmp_path) -> None:
    rt = build_runtime(sql_env(), 0)
    assert [t.name for t in rt.tool_specs()] == ["describe_schema", "run_sql", "submit_answer"]
    schema = (await rt.call_tool("describe_schema", {})).output
    assert schema["tables"][0]["name"] == "t"
    assert [c["name"] for c in schema["tables"][0]["columns"]] == ["id", "name", "score"]
    rows = (await rt.call_tool("run_sql", {"query": "SELECT name FROM t WHERE score = 2"})).output
    assert rows == {"columns": ["name"], "rows": [["b"], ["c"]], "rowCount": 2, "truncated": False}
    assert "sql error" in (await rt.call_tool("run_sql", {"query": "SELEC 1"})).error
    assert "sql error" in (await rt.call_tool("run_sql", {"query": "SELECT 1; SELECT 2"})).error
    # ATTACH would touch the host filesystem: denied.
    attach = await rt.call_tool("run_sql", {"query": f"ATTACH '{tmp_path}/x.db' AS x"})
    assert attach.error and "not authorized" in attach.error
    assert not (tmp_path / "x.db").exists()
    # A runaway query is stopped by the time limit, not left running.
    slow = await rt.call_tool(
        "run_sql",
        {
            "query": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) "
            "SELECT count(*) FROM c"
        },
    )
    assert slow.error and "longer than" in slow.error
    await rt.call_tool("run_sql", {"query": "DELETE FROM t WHERE id = 3"})
    sub = await rt.call_tool("submit_answer", {"query": "SELECT id FROM t ORDER BY id DESC"})
    assert sub.output == {"submitted": True, "rowCount": 2}
    assert "needs `query` or `answer`" in (await rt.call_tool("submit_answer", {})).error
    state = rt.final_state()
    assert state["rowCounts"] == {"t": 2}
    assert state["submission"]["rows"] == [[2], [1]]
    await rt.close()


async def test_sql_result_match_multiset_and_order() -> None:
    env = sql_env(query="SELECT id FROM t ORDER BY id")
    good = await run_tool_script(
        env, 0, [("submit_answer", {"query": "SELECT id FROM t ORDER BY id DESC"})]
    )
    result = await score(env, 0, good)
    assert result.passed, result
    env_ordered = sql_env(query="SELECT id FROM t ORDER BY id", orderMatters=True)
    result = await score(env_ordered, 0, good)
    assert not result.passed and "in order" in result.primitives[0].reason
    rows_env = sql_env(rows=[{"name": "b"}, {"name": "c"}])
    t = await run_tool_script(
        rows_env, 0, [("submit_answer", {"query": "SELECT name FROM t WHERE score > 1.9"})]
    )
    assert (await score(rows_env, 0, t)).passed
    none = await run_tool_script(env, 0, [])
    assert "nothing submitted" in (await score(env, 0, none)).primitives[0].reason


# ------------------------------------------------------------------ browser


def browser_env() -> Environment:
    pages = [
        browser_page(
            "https://s.test/",
            title="Home",
            text="hi",
            elements=[
                {
                    "id": "to-form",
                    "type": "link",
                    "text": "Contact",
                    "href": "https://s.test/contact",
                },
                {"id": "search", "type": "input", "name": "q"},
            ],
        ),
        browser_page(
            "https://s.test/contact",
            title="Contact",
            elements=[
                {"id": "f", "type": "form", "action": "https://s.test/thanks"},
                {"id": "email", "type": "input", "name": "email", "form": "f", "required": True},
                {"id": "topic", "type": "input", "name": "topic", "form": "f", "value": "general"},
                {"id": "send", "type": "button", "text": "Send", "form": "f"},
                {"id": "home", "type": "button", "text": "Home", "href": "https://s.test/"},
            ],
        ),
        browser_page("https://s.test/thanks", title="Thanks"),
    ]
    return Environment(
        slug="site",
        template="browser",
        config=browser_config(pages),
        tasks=[Task(instruction="contact", hidden_ground_truth={"url": "https://s.test/thanks"})],
    )


async def test_browser_tools() -> None:
    rt = build_runtime(browser_env(), 0)
    page = (await rt.call_tool("read_page", {})).output
    assert page["url"] == "https://s.test/" and [e["id"] for e in page["elements"]] == [
        "to-form",
        "search",
    ]
    assert "no page at" in (await rt.call_tool("navigate", {"url": "https://evil.test/"})).error
    await rt.call_tool("type", {"element_id": "search", "text": "shoes"})
    contact = (await rt.call_tool("click", {"element_id": "to-form"})).output
    assert contact["title"] == "Contact"
    assert "only links and buttons" in (await rt.call_tool("click", {"element_id": "email"})).error
    assert (
        "only type into inputs"
        in (await rt.call_tool("type", {"element_id": "send", "text": "x"})).error
    )
    empty = await rt.call_tool("click", {"element_id": "send"})
    assert "required field(s) empty: email" in empty.error
    await rt.call_tool("type", {"element_id": "email", "text": "a@b.c"})
    view = (await rt.call_tool("read_page", {})).output
    assert {e["id"]: e.get("value") for e in view["elements"]}["email"] == "a@b.c"
    sent = (await rt.call_tool("submit", {"form_id": "f"})).output
    assert sent["values"] == {"email": "a@b.c", "topic": "general"}
    assert sent["page"]["url"] == "https://s.test/thanks"
    assert "no form 'f'" in (await rt.call_tool("submit", {"form_id": "f"})).error
    await rt.call_tool("navigate", {"url": "https://s.test/contact/"})  # trailing slash tolerated
    await rt.call_tool("click", {"element_id": "home"})
    state = rt.final_state()
    assert state["url"] == "https://s.test/"
    assert state["history"] == [
        "https://s.test/",
        "https://s.test/contact",
        "https://s.test/thanks",
        "https://s.test/contact",
        "https://s.test/",
    ]
    assert state["forms"] == {"_page": {"q": "shoes"}, "f": {"email": "a@b.c"}}
    assert state["submissions"] == [
        {
            "form": "f",
            "url": "https://s.test/contact",
            "values": {"email": "a@b.c", "topic": "general"},
        }
    ]


# ------------------------------------------------------------------ plugin


def plugin_env(entrypoint: str = "example_plugins.counter:make_env") -> Environment:
    return Environment(
        slug="counter",
        template="plugin",
        config=plugin_config(entrypoint, {"step": 2}),
        tasks=[Task(instruction="count", input={"target": 4}, hidden_ground_truth={"value": 4})],
    )


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))


async def test_plugin_reset_step_state(examples_on_path: None) -> None:
    env = plugin_env()
    rt = build_runtime(env, 0)
    assert [t.name for t in rt.tool_specs()] == ["increment", "read"]
    assert (await rt.call_tool("increment", {})).output == {"value": 2}
    await rt.call_tool("increment", {})
    over = await rt.call_tool("increment", {})
    assert over.error == "increment failed: ValueError: already at the target"
    assert rt.final_state() == {"value": 4, "target": 4}
    await rt.close()
    t = await run_tool_script(env, 0, [("increment", {}), ("increment", {})])
    assert (await score(env, 0, t)).passed


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("no_colon", "must match 'module.path:function_name'"),
        ("a:b\x00", "null bytes"),
        ("x" * 300 + ":f", "<= 260 chars"),
        ("surely_missing_mod_xyz:f", "module 'surely_missing_mod_xyz' could not be imported"),
        ("json:nope", "module 'json' has no attribute 'nope'"),
        ("json:__name__", "is not callable"),
        ("json:dumps", "returned str, which lacks tools, reset, step, state"),
        ("json:loads", "raised TypeError when called"),
    ],
)
def test_plugin_entrypoint_errors_are_named(entrypoint: str, message: str) -> None:
    with pytest.raises(RolloutError, match="config.entrypoint") as err:
        build_runtime(plugin_env(entrypoint), 0)
    assert message in str(err.value)
