"""The sql template's trust boundary: schema and seed under the query authorizer, quoted
identifiers, queries off the event loop, and literal answers compared by value."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply, tool_reply
from waiting import ticks_during

from rollout import Environment, RolloutError, Task
from rollout.shared.agent.loop import run_episode
from rollout.shared.envs import build_runtime, run_tool_script, score, validate_environment
from rollout.shared.models.openai_compat import OpenAICompatBackend

SCHEMA = "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, amount REAL);"
SEED = "INSERT INTO orders VALUES (1, 'Alice', 100.0), (2, 'Bob', 25.0), (3, 'Alice', 0.5);"
RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def sql_env(schema: str = SCHEMA, seed: str = SEED, **gt: object) -> Environment:
    return Environment(
        slug="db",
        template="sql",
        schema=schema,
        seed=seed,
        tasks=[Task(instruction="q", hidden_ground_truth=gt or {"query": "SELECT 1"})],
    )


@pytest.mark.parametrize(
    ("schema", "seed", "where", "why"),
    [
        (
            "ATTACH DATABASE '/etc/passwd' AS pw; " + SCHEMA,
            SEED,
            "config.schema",
            "ATTACH/DETACH (and VACUUM INTO) are not allowed",
        ),
        (
            SCHEMA,
            "SELECT load_extension('/tmp/evil.so');",
            "config.seed",
            "load_extension() is not allowed",
        ),
        (SCHEMA, "VACUUM INTO '{tmp}/copy.db';", "config.seed", "ATTACH/DETACH"),
        (
            SCHEMA,
            "PRAGMA temp_store_directory = '{tmp}';",
            "config.seed",
            "PRAGMA temp_store_directory is not allowed",
        ),
    ],
    ids=["attach-in-schema", "load-extension-in-seed", "vacuum-into", "file-pragma"],
)
def test_hostile_schema_and_seed_refused_with_their_path(
    tmp_path: Path, schema: str, seed: str, where: str, why: str
) -> None:
    env = sql_env(schema.format(tmp=tmp_path), seed.format(tmp=tmp_path))
    problems = validate_environment(env)
    assert any(p.startswith(f"{where}: not authorized: {why}") for p in problems), problems
    with pytest.raises(RolloutError, match=f"{where}: not authorized"):
        build_runtime(env, 0)
    assert list(tmp_path.iterdir()) == []  # nothing written on the host


def test_hostile_reference_query_refused() -> None:
    env = sql_env(query="ATTACH DATABASE '/etc/passwd' AS pw")
    problems = validate_environment(env)
    assert "tasks[0].hiddenGroundTruth.query: sql error: not authorized: ATTACH" in (
        " ".join(problems)
    ), problems


def test_runaway_seed_is_stopped_at_validation() -> None:
    env = sql_env(seed="CREATE TABLE n AS " + RUNAWAY + ";")
    env.config["queryTimeoutSeconds"] = 0.1
    started = time.monotonic()
    problems = validate_environment(env)
    assert "config.seed: took longer than 0.5s and was stopped" in problems
    assert time.monotonic() - started < 10


async def test_long_query_times_out_without_blocking_the_loop() -> None:
    env = sql_env()
    env.config["queryTimeoutSeconds"] = 1.0
    rt = build_runtime(env, 0)
    slow, ticks, elapsed = await ticks_during(rt.call_tool("run_sql", {"query": RUNAWAY}))
    assert slow.error == "query took longer than 1s and was stopped"
    assert 0.9 < elapsed < 5
    # The loop kept running while the query did: about 100 ticks in a second, none if blocked.
    assert ticks >= 20, ticks
    # The connection is usable afterwards.
    ok = await rt.call_tool("run_sql", {"query": "SELECT count(*) FROM orders"})
    assert ok.output["rows"] == [[3]]
    await rt.close()


async def test_quoted_identifiers_work_everywhere() -> None:
    schema = 'CREATE TABLE "a""b" ("c""d" INTEGER, "drop table x" TEXT);'
    seed = "INSERT INTO \"a\"\"b\" VALUES (1, 'x'), (2, 'y');"
    env = sql_env(schema, seed, query='SELECT "c""d" FROM "a""b"')
    assert validate_environment(env) == []
    rt = build_runtime(env, 0)
    tables = (await rt.call_tool("describe_schema", {})).output["tables"]
    assert [t["name"] for t in tables] == ['a"b']
    assert [c["name"] for c in tables[0]["columns"]] == ['c"d', "drop table x"]
    rows = (await rt.call_tool("run_sql", {"query": 'SELECT * FROM "a""b" ORDER BY 1'})).output
    assert rows["rows"] == [[1, "x"], [2, "y"]]
    state = rt.final_state()
    assert state["tables"] == {
        'a"b': [{'c"d': 1, "drop table x": "x"}, {'c"d': 2, "drop table x": "y"}]
    }
    assert state["rowCounts"] == {'a"b': 2}
    await rt.close()
    t = await run_tool_script(env, 0, [("submit_answer", {"query": 'SELECT "c""d" FROM "a""b"'})])
    assert (await score(env, 0, t)).passed


async def answer_verdict(env: Environment, answer: object) -> tuple[bool, str]:
    t = await run_tool_script(env, 0, [("submit_answer", {"answer": answer})])
    result = await score(env, 0, t)
    return result.passed, result.primitives[0].reason


@pytest.mark.parametrize("answer", [125, 125.0, "125", " 125.0 ", "125.000000000001"])
async def test_literal_number_answer_by_value(answer: object) -> None:
    # The reference returns 125.0 (a REAL sum).
    env = sql_env(query="SELECT SUM(amount) FROM orders WHERE customer = 'Bob' OR id = 1")
    ok, reason = await answer_verdict(env, answer)
    assert ok, reason
    assert "the reference query's rows" in reason


@pytest.mark.parametrize("answer", [124, "125 dollars", None, True, [125]])
async def test_wrong_literal_number_answer_fails(answer: object) -> None:
    env = sql_env(query="SELECT SUM(amount) FROM orders WHERE customer = 'Bob' OR id = 1")
    ok, reason = await answer_verdict(env, answer)
    assert not ok
    assert reason.endswith("!= 125.0 (the reference query's rows)"), reason


async def test_literal_string_answer_trimmed() -> None:
    env = sql_env(query="SELECT customer FROM orders WHERE amount = 25")
    assert (await answer_verdict(env, "  Bob\n"))[0]
    ok, reason = await answer_verdict(env, "bob")
    assert not ok and '"bob" != "Bob"' in reason, reason


async def test_literal_answer_against_a_multi_value_reference_fails_clearly() -> None:
    env = sql_env(query="SELECT id, customer FROM orders")
    ok, reason = await answer_verdict(env, "1")
    assert not ok
    assert reason == (
        "a literal answer can only match a one-value result, but the reference query's rows "
        "are 3 row(s) of 2 column(s): submit the query instead"
    )


async def test_literal_answer_against_given_rows() -> None:
    env = sql_env(rows=[{"total": 3}])
    assert (await answer_verdict(env, "3"))[0]


async def test_a_query_wins_over_a_literal_answer() -> None:
    env = sql_env(query="SELECT id FROM orders")
    t = await run_tool_script(
        env, 0, [("submit_answer", {"query": "SELECT id FROM orders", "answer": "nonsense"})]
    )
    assert (await score(env, 0, t)).passed


async def test_runtime_refuses_attach_and_extensions(tmp_path: Path) -> None:
    rt = build_runtime(sql_env(), 0)
    attach = await rt.call_tool("run_sql", {"query": f"ATTACH '{tmp_path}/x.db' AS x"})
    assert attach.error.startswith("sql error: not authorized: ATTACH/DETACH")
    ext = await rt.call_tool("run_sql", {"query": "SELECT load_extension('x')"})
    assert ext.error == (
        "sql error: not authorized: load_extension() is not allowed: no extensions or file access"
    )
    big = await rt.call_tool("run_sql", {"query": "SELECT zeroblob(1000000000)"})
    assert big.error and "too big" in big.error
    assert os.listdir(tmp_path) == []
    await rt.close()


@pytest.mark.parametrize(
    "change",
    ["DELETE FROM orders WHERE customer = 'Bob'", "UPDATE orders SET customer = 'Alice'"],
)
async def test_a_query_is_judged_on_the_tasks_data_not_on_what_the_model_changed(
    change: str,
) -> None:
    # Alice has 2 orders. A model that first makes the data fit a guess must not pass.
    env = sql_env(query="SELECT COUNT(*) FROM orders WHERE customer = 'Alice'")
    guess = (
        "SELECT COUNT(*) FROM orders"  # 3 orders; 2 after the delete, 3 Alice's after the update
    )
    forged = await run_tool_script(
        env, 0, [("run_sql", {"query": change}), ("submit_answer", {"query": guess})]
    )
    result = await score(env, 0, forged)
    assert not result.passed, result.primitives[0].reason
    honest = await run_tool_script(
        env, 0,
        [("run_sql", {"query": change}),
         ("submit_answer", {"query": "SELECT COUNT(*) FROM orders WHERE customer = 'Alice'"})],
    )  # fmt: skip
    # Judged on the seeded data: the right query passes whatever the episode changed.
    assert (await score(env, 0, honest)).passed


async def test_a_query_that_only_works_on_changed_data_fails_saying_so() -> None:
    env = sql_env(query="SELECT COUNT(*) FROM orders")
    t = await run_tool_script(
        env, 0,
        [("run_sql", {"query": "CREATE TABLE mine (x INTEGER)"}),
         ("submit_answer", {"query": "SELECT COUNT(*) FROM mine"})],
    )  # fmt: skip
    result = await score(env, 0, t)
    assert not result.passed
    assert "the submitted query fails on the task's data: sql error" in result.primitives[0].reason


def _agent(*queries: str):
    """A scripted agent: one run_sql call per query, then a wrong final answer."""

    def answer(body: dict) -> Reply:
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        if turn < len(queries):
            return tool_reply(("run_sql", {"query": queries[turn]}))
        return text_reply("I do not know")

    return answer


@pytest.mark.parametrize(
    "stored",
    ["CAST(x'ff' AS TEXT)", "x'ff00'"],
    ids=["text-that-is-not-utf8", "a-blob"],
)
async def test_an_agent_that_stores_undumpable_values_still_fails(stored: str) -> None:
    """A failing agent cannot turn its failure into an errored rollout (no verdict, left out
    of pass rates) nor make the actor's batch unpublishable by what it leaves in the db."""
    env = sql_env(query="SELECT count(*) FROM orders")
    agent = _agent("CREATE TABLE junk (v)", f"INSERT INTO junk VALUES ({stored})")
    with FakeOpenAI(agent) as server:
        backend = OpenAICompatBackend("scripted", server.base_url, max_retries=1)
        runtime = build_runtime(env, 0)
        try:
            trajectory = await run_episode(runtime, backend, "how many orders?")
        finally:
            await runtime.close()
    assert [c.error for c in trajectory.tool_calls] == [None, None]
    assert trajectory.error is None, trajectory.error
    json.loads(trajectory.model_dump_json())  # what the actor publishes
    assert trajectory.final_state["rowCounts"] == {"orders": 3, "junk": 1}
    result = await score(env, 0, trajectory)
    assert (result.error, result.passed) == (None, False), result


async def test_a_table_too_slow_to_dump_is_named_not_waited_for() -> None:
    """A generated column that is slow to read cannot hold the actor for minutes at the end."""
    slow = "length(replace(replace(hex(zeroblob(3000000 + n)), '0', '1'), '1', '2'))"
    env = Environment(
        slug="db",
        template="sql",
        config={"schema": SCHEMA, "seed": SEED, "queryTimeoutSeconds": 1.0},
        tasks=[Task(instruction="q", hidden_ground_truth={"query": "SELECT 1"})],
    )
    fill = "INSERT INTO slow(n) SELECT value FROM json_each('[{}]')"
    calls = [("run_sql", {"query": f"CREATE TABLE slow (n, v AS ({slow}))"})]
    calls += [
        ("run_sql", {"query": fill.format(",".join(map(str, range(i, i + 5))))})
        for i in range(0, 100, 5)
    ]
    runtime = build_runtime(env, 0)
    try:
        for name, args in calls:
            assert (await runtime.call_tool(name, args)).error is None
        one = time.monotonic()
        runtime.conn.execute("SELECT * FROM slow LIMIT 6").fetchall()
        per_row = (time.monotonic() - one) / 6
        started = time.monotonic()
        state = runtime.final_state()
        took = time.monotonic() - started
    finally:
        await runtime.close()
    assert per_row * 100 > 3, f"the table reads in {per_row * 100:.1f}s: not slow enough to tell"
    assert took < 2.0, f"the dump took {took:.1f}s"
    assert state["unreadableTables"] == {"slow": "took longer than 1s"}
    assert "slow" not in state["tables"] and state["rowCounts"]["orders"] == 3
