"""Budgets that hold on the platform, and a run's progress that moves per finished rollout.

Degenerate policies are served over real HTTP (the fake is only the remote model API): one
that calls the same tool with the same arguments forever, and one that writes a full turn of
tokens every turn and never finishes. Each run still completes, each rollout within its
budgets, and the run's record says which budget ended every rollout.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from fakes.openai_server import FakeOpenAI, Reply, completion, text_reply, tool_reply
from pipeline.kit import refund_env
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.comparison import settings_warnings
from rollout.errors import RolloutError

TASKS = 3


def looper(body: dict[str, Any]) -> Reply:
    """Looks the same order up, again and again."""
    return tool_reply(("lookup_order", {"order_id": "O-1"}))


def rambler(body: dict[str, Any]) -> Reply:
    """Fills every turn to its token limit, with a new lookup each time: it never finishes."""
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    reply = completion(
        "let me think about this some more " * 20,
        [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": f'{{"order_id": "O-{turn}"}}'},
            }
        ],
    )
    limit = int(body.get("max_tokens") or 512)
    reply["usage"] = {"prompt_tokens": 50, "completion_tokens": limit, "total_tokens": 50 + limit}
    return Reply(reply)


async def test_degenerate_policies_end_at_their_budgets_and_the_run_says_which(
    client: AsyncClient, agent_server: FakeOpenAI
) -> None:
    await client.push_environment(refund_env(tasks=TASKS))
    healthy = await client.create_run("refunds", f"{agent_server.base_url}#scripted", n=1)
    with FakeOpenAI(looper) as loops, FakeOpenAI(rambler) as rambles:
        looping = await client.create_run("refunds", f"{loops.base_url}#looper", n=1)
        rambling = await client.create_run(
            "refunds",
            f"{rambles.base_url}#rambler",
            n=1,
            max_tool_calls=100,
            budgets={"max_turn_tokens": 100, "max_rollout_tokens": 250},
        )
        runs = {}
        for name, run in (("healthy", healthy), ("looping", looping), ("rambling", rambling)):
            await client.wait_for_run(run["runId"], timeout_s=120)
            runs[name] = await client.get_run(
                run["runId"], include_rollouts=True, include_trajectories=True
            )
        asked = {"looping": len(loops.chat_bodies), "rambling": len(rambles.chat_bodies)}
        rambling_bodies = rambles.chat_bodies
    for run in runs.values():
        assert run["status"] == "completed" and run["generated"] == TASKS, run["reason"]
    # A run's overrides are on its summary (what `rollout compare` warns about); none: None.
    assert runs["rambling"]["budgets"] == {"max_turn_tokens": 100, "max_rollout_tokens": 250}
    assert runs["healthy"]["budgets"] is None
    assert "budgets differ: max_rollout_tokens env default vs 250" in " ".join(
        settings_warnings(runs["healthy"], runs["rambling"])
    )

    assert runs["healthy"]["endedBy"] == {"model": TASKS}
    # Each rollout says it in the same words as the run's counts.
    assert [r["endedBy"] for r in runs["healthy"]["rollouts"]] == ["model"] * TASKS
    assert runs["healthy"]["meanTurns"] == 2  # the refund call, then the answer

    # The same call five times in a row (the platform's default) ends the episode, the fifth
    # not run; it is judged on what it did, so the loop fails (it never refunded): looping is
    # no way out of a verdict, neither in pass rates nor in GRPO's groups.
    looped = runs["looping"]
    assert looped["endedBy"] == {"max_repeated_calls": TASKS}
    assert looped["meanTurns"] == 5 and asked["looping"] == 5 * TASKS
    assert (looped["errored"], looped["passed"], looped["failed"]) == (0, 0, TASKS)
    for r in looped["rollouts"]:
        assert r["outcome"] == "failed" and r["error"] is None, r
        refused = json.loads(r["trajectory"]["messages"][-1]["content"])["error"]
        assert 'lookup_order({"order_id": "O-1"}) 5 times in a row' in refused
        assert r["endedBy"] == "max_repeated_calls" and len(r["trajectory"]["tool_calls"]) == 4

    # The run's own budgets: turns of at most 100 tokens, 250 in all, so the third turn is
    # cut to the 50 left and the rollout ends there (not at its 100 tool calls).
    rambled = runs["rambling"]
    assert rambled["endedBy"] == {"max_rollout_tokens": TASKS}
    assert rambled["meanCompletionTokens"] == 250 and rambled["meanTurns"] == 3
    assert asked["rambling"] == 3 * TASKS
    assert sorted(b["max_tokens"] for b in rambling_bodies) == [50] * TASKS + [100] * 2 * TASKS
    for r in rambled["rollouts"]:
        assert r["outcome"] != "errored" and r["endedBy"] == "max_rollout_tokens", r
        assert r["completionTokens"] == 250 and r["turns"] == 3


async def test_a_batch_reports_each_rollout_as_it_finishes(
    client: AsyncClient, settings: Any
) -> None:
    # One work item of two tasks: task 1 answers at once, task 2 waits on the test's say-so.
    # The run must show task 1's rollout (generated and scored) while task 2 is still running.
    release = threading.Event()

    def agent(body: dict[str, Any]) -> Reply:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if "O-2" in user and turn == 1:
            release.wait(timeout=60)  # held until the first rollout is on the record
        if "O-1" in user or turn == 1:
            return text_reply("done")
        return tool_reply(("lookup_order", {"order_id": "O-2"}))

    await client.push_environment(refund_env(tasks=TASKS))
    with FakeOpenAI(agent) as server:
        run = await client.create_run(
            "refunds", f"{server.base_url}#agent", n=1, task_indices=[1, 2], batch_size=16
        )
        seen: dict[str, Any] = {}

        async def first_scored() -> bool:
            try:
                seen.update(await client.get_run(run["runId"]))
            except RolloutError:  # not projected yet
                return False
            return seen["scored"] >= 1

        try:
            await wait_until(first_scored, "the first finished rollout scored", 60)
        finally:
            release.set()
        assert seen["status"] == "running" and seen["generated"] == 1 and seen["total"] == 2
        done = await client.wait_for_run(run["runId"], timeout_s=60)
    assert done["status"] == "completed" and done["generated"] == 2
