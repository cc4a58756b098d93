"""The agent loop over a small runtime, with scripted models over real HTTP and a real tiny LM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import (
    Reply,
    by_conversation,
    completion,
    error_reply,
    text_reply,
    tool_reply,
)

from rollout.shared.agent.loop import Episode, SamplingParams, run_episode, run_episodes
from rollout.shared.envs.runtime import ToolResult, ToolSpec
from rollout.shared.models.base import ChatRequest, ChatResponse
from rollout.shared.models.openai_compat import OpenAICompatBackend
from rollout.shared.objectstore.claimcheck import to_json_bytes


class ShopRuntime:
    """A two-tool shop: read orders, issue refunds; plus a tool that raises."""

    def __init__(self) -> None:
        self.orders = {"O-1": {"customer": "Alice", "amount": 100}}
        self.refunds: list[dict[str, Any]] = []
        self.closed = False

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name="lookup_order",
                description="Read an order.",
                parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
            ),
            ToolSpec(name="refund", description="Refund an order."),
            ToolSpec(name="explode", description="Always fails badly."),
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "lookup_order":
            order = self.orders.get(arguments.get("order_id"))
            if order is None:
                return ToolResult(error=f"no order {arguments.get('order_id')!r}")
            return ToolResult(output=order)
        if name == "refund":
            self.refunds.append(dict(arguments))
            return ToolResult(output="refunded")
        raise RuntimeError("kaboom")

    def final_state(self) -> dict[str, Any]:
        return {"refunds": list(self.refunds)}

    async def close(self) -> None:
        self.closed = True


class CountingBackend:
    """Wraps a real backend to record the batch size of every generate call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.batches: list[int] = []

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        self.batches.append(len(requests))
        return await self.inner.generate(requests)


def http_backend(server) -> OpenAICompatBackend:
    return OpenAICompatBackend("scripted", server.base_url, backoff_base=0.01, max_retries=1)


async def test_multi_turn_episode_records_everything(fake_openai) -> None:
    server = fake_openai(
        [
            tool_reply(("lookup_order", {"order_id": "O-1"}), content="Checking."),
            tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
            text_reply("Refunded $100 to Alice."),
        ]
    )
    runtime = ShopRuntime()
    trajectory = await run_episode(
        runtime,
        http_backend(server),
        "Refund order O-1",
        system_prompt="Be an agent.",
        sampling=SamplingParams(temperature=0.3, seed=10),
    )
    assert trajectory.finish_reason == "stop" and trajectory.error is None
    assert trajectory.final_output == "Refunded $100 to Alice."
    assert trajectory.final_state == {"refunds": [{"order_id": "O-1", "amount": 100}]}
    assert [(c.index, c.name, c.arguments, c.error) for c in trajectory.tool_calls] == [
        (0, "lookup_order", {"order_id": "O-1"}, None),
        (1, "refund", {"order_id": "O-1", "amount": 100}, None),
    ]
    assert trajectory.tool_calls[0].result == {"customer": "Alice", "amount": 100}
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert trajectory.messages[3]["content"] == json.dumps({"customer": "Alice", "amount": 100})
    assert trajectory.messages[3]["tool_call_id"] == trajectory.messages[2]["tool_calls"][0]["id"]

    bodies = server.chat_bodies
    assert len(bodies) == 3
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == [
        "lookup_order",
        "refund",
        "explode",
    ]
    # The model sees its own earlier calls and their results; seeds differ per turn.
    assert bodies[2]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": bodies[2]["messages"][-2]["tool_calls"][0]["id"],
        "content": "refunded",
    }
    assert [b["seed"] for b in bodies] == [10, 11, 12]
    assert {b["temperature"] for b in bodies} == {0.3}


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (("refund", '{"order_id": "O-1", "amount": }'), "invalid JSON arguments for 'refund'"),
        (("refund", "[1, 2]"), "arguments for 'refund' must be a JSON object, got list"),
        # Valid JSON whose integer Python refuses to read (over 4,300 digits): the loop used to
        # raise on it, so the actor's whole batch was dead-lettered and never scored.
        (("refund", '{"amount": ' + "9" * 5000 + "}"), "invalid JSON arguments for 'refund'"),
        (("cancel_order", {"order_id": "O-1"}), "unknown tool 'cancel_order'; available tools"),
        (("explode", {}), "tool 'explode' failed: RuntimeError: kaboom"),
        (("lookup_order", {"order_id": "O-9"}), "no order 'O-9'"),
    ],
)
async def test_bad_calls_become_tool_errors_shown_to_the_model(fake_openai, call, problem) -> None:
    server = fake_openai([tool_reply(call), text_reply("Sorry, I could not.")])
    runtime = ShopRuntime()
    trajectory = await run_episode(runtime, http_backend(server), "Refund order O-1")

    assert trajectory.finish_reason == "stop" and trajectory.error is None
    [record] = trajectory.tool_calls
    assert record.error is not None and problem in record.error
    assert runtime.refunds == []
    # The error went back to the model as the tool's answer, and the episode went on.
    shown = server.chat_bodies[1]["messages"][-1]
    assert shown["role"] == "tool" and problem in json.loads(shown["content"])["error"]
    assert trajectory.final_output == "Sorry, I could not."


async def test_malformed_tool_call_from_the_api_is_a_tool_error(fake_openai) -> None:
    nameless = completion(None, [{"id": "x1", "type": "function", "function": {}}])
    server = fake_openai([nameless, text_reply("ok")])
    trajectory = await run_episode(ShopRuntime(), http_backend(server), "go")
    [record] = trajectory.tool_calls
    assert record.name == "<malformed>" and "malformed tool call" in record.error


async def test_a_lone_surrogate_the_model_writes_leaves_a_trajectory_that_encodes(
    fake_openai,
) -> None:
    # `"\\ud800"` is valid JSON text any model can write; decoded, it is a code point no UTF-8
    # holds. Kept as is, the trajectory cannot be published: the actor's whole batch failed
    # to encode and was dead-lettered, so no rollout of it was ever scored.
    lone = "\ud800"
    unnamed = completion(
        f"Done {lone}",
        [
            {
                "id": f"c{lone}",
                "type": "function",
                "function": {"name": f"x{lone}", "arguments": "{}"},
            }
        ],
    )
    server = fake_openai(
        [tool_reply(("refund", {"order_id": f"O-1{lone}", lone: 1})), unnamed, text_reply("ok")]
    )
    runtime = ShopRuntime()
    trajectory = await run_episode(runtime, http_backend(server), "Refund order O-1")

    encoded = to_json_bytes(trajectory.model_dump(mode="json")).decode()
    assert "\ufffd" in encoded
    assert runtime.refunds == [{"order_id": "O-1\ufffd", "\ufffd": 1}]
    assert trajectory.tool_calls[0].arguments == {"order_id": "O-1\ufffd", "\ufffd": 1}
    assert (
        trajectory.tool_calls[1].name == "x\ufffd"
        and "unknown tool" in trajectory.tool_calls[1].error
    )


async def test_a_number_json_has_not_is_a_tool_error_not_an_argument(fake_openai) -> None:
    # Python's json reads NaN, Infinity and 1e999 (as inf): a tool's `amount > balance` check
    # let NaN through, and the trajectory holding it could not be exported (a snapshot row
    # refuses non-finite numbers).
    raw = [
        '{"order_id": "O-1", "amount": NaN}',
        '{"order_id": "O-1", "amount": -Infinity}',
        '{"order_id": "O-1", "amount": 1e999}',
        '{"order_id": "O-1", "amount": 1.5e2}',
    ]
    server = fake_openai([*(tool_reply(("refund", r)) for r in raw), text_reply("ok")])
    runtime = ShopRuntime()
    trajectory = await run_episode(runtime, http_backend(server), "Refund order O-1")
    assert runtime.refunds == [{"order_id": "O-1", "amount": 150.0}]  # only the finite one
    errors = [c.error for c in trajectory.tool_calls]
    assert "NaN is not a JSON number" in errors[0] and "-Infinity is not" in errors[1]
    assert "1e999 is too large for a number" in errors[2] and errors[3] is None
    found: list[str] = []  # what strict JSON would not read in the stored trajectory
    json.loads(to_json_bytes(trajectory.model_dump(mode="json")), parse_constant=found.append)
    assert found == []


async def test_max_tool_calls_stops_the_episode(fake_openai) -> None:
    lookup = ("lookup_order", {"order_id": "O-1"})
    server = fake_openai([tool_reply(lookup, lookup), tool_reply(lookup), tool_reply(lookup)])
    trajectory = await run_episode(
        ShopRuntime(), http_backend(server), "loop forever", max_tool_calls=2
    )
    assert trajectory.finish_reason == "max_tool_calls"
    assert len(trajectory.tool_calls) == 2
    # After the budget is spent the model gets one more turn; its further call is refused.
    assert len(server.chat_bodies) == 2
    refused = trajectory.messages[-1]
    assert refused["role"] == "tool" and "tool call limit (2) reached" in refused["content"]


async def test_zero_tool_calls_allowed(fake_openai) -> None:
    server = fake_openai([tool_reply(("lookup_order", {"order_id": "O-1"}))])
    trajectory = await run_episode(ShopRuntime(), http_backend(server), "x", max_tool_calls=0)
    assert trajectory.finish_reason == "max_tool_calls" and trajectory.tool_calls == []


async def test_batched_episodes_share_one_generate_per_turn(fake_openai) -> None:
    lookup = ("lookup_order", {"order_id": "O-1"})
    server = fake_openai(
        by_conversation(
            {
                "short": [text_reply("nothing to do")],
                "medium": [tool_reply(lookup), text_reply("looked")],
                "long": [
                    tool_reply(lookup),
                    tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
                    text_reply("refunded"),
                ],
            }
        )
    )
    backend = CountingBackend(http_backend(server))
    runtimes = [ShopRuntime() for _ in range(3)]
    trajectories = await run_episodes(
        [Episode(rt, text) for rt, text in zip(runtimes, ["short", "medium", "long"], strict=True)],
        backend,
    )
    assert backend.batches == [3, 2, 1]
    assert [t.final_output for t in trajectories] == ["nothing to do", "looked", "refunded"]
    assert [len(t.tool_calls) for t in trajectories] == [0, 1, 2]
    assert runtimes[2].refunds == [{"order_id": "O-1", "amount": 100}]
    assert runtimes[0].refunds == runtimes[1].refunds == []


async def test_per_episode_sampling_and_system_prompt(fake_openai) -> None:
    server = fake_openai(by_conversation({"a": [text_reply("A")], "b": [text_reply("B")]}))
    await run_episodes(
        [
            Episode(ShopRuntime(), "a", sampling=SamplingParams(temperature=0.0, seed=1)),
            Episode(ShopRuntime(), "b", system_prompt=""),
        ],
        http_backend(server),
        sampling=SamplingParams(temperature=0.9),
    )
    by_user = {b["messages"][-1]["content"]: b for b in server.chat_bodies}
    assert (by_user["a"]["temperature"], by_user["a"]["seed"]) == (0.0, 1)
    assert by_user["b"]["temperature"] == 0.9 and "seed" not in by_user["b"]
    assert by_user["a"]["messages"][0]["role"] == "system"
    assert by_user["b"]["messages"][0]["role"] == "user"


async def test_backend_error_ends_only_that_episode(fake_openai) -> None:
    server = fake_openai(
        by_conversation(
            {"doomed": [error_reply(400, "context length exceeded")], "fine": [text_reply("ok")]}
        )
    )
    doomed, fine = await run_episodes(
        [Episode(ShopRuntime(), "doomed"), Episode(ShopRuntime(), "fine")], http_backend(server)
    )
    assert doomed.finish_reason == "error" and "context length exceeded" in doomed.error
    assert doomed.error_kind == "model"  # typed: the model endpoint, not the env, failed
    assert doomed.final_state == {"refunds": []}
    assert fine.finish_reason == "stop" and fine.final_output == "ok"
    assert fine.error is None and fine.error_kind is None


async def test_a_later_turn_the_model_refuses_ends_the_episode_judged_not_errored(
    fake_openai,
) -> None:
    # The conversation the episode built outgrew the model's context: as an error, a wrong
    # refund followed by junk until the context was full left pass rates and GRPO's groups.
    server = fake_openai(
        [
            tool_reply(("refund", {"order_id": "O-1", "amount": 1})),
            error_reply(400, "This model's maximum context length is 2048 tokens"),
        ]
    )
    trajectory = await run_episode(ShopRuntime(), http_backend(server), "Refund O-1 in full")
    assert trajectory.error is None and trajectory.error_kind is None
    assert trajectory.ended_by == "model_refused" and trajectory.turns == 2
    assert trajectory.final_state == {"refunds": [{"order_id": "O-1", "amount": 1}]}
    assert [c.name for c in trajectory.tool_calls] == ["refund"]


async def test_arguments_nested_deep_are_the_calls_error_not_the_batchs(fake_openai) -> None:
    # 300 levels of `[` (600 characters) made the trajectory impossible to serialise and 1500
    # made json.loads raise: either failed every episode of the batch, a failing policy's
    # siblings included, where it is one bad call.
    def deep(depth: int) -> str:
        return '{"order_id": "O-1", "note": ' + "[" * depth + "]" * depth + "}"

    server = fake_openai(
        by_conversation(
            {
                "a": [tool_reply(("refund", deep(300))), text_reply("done")],
                "b": [tool_reply(("refund", deep(1500))), text_reply("done")],
                "c": [tool_reply(("refund", {"order_id": "O-1"})), text_reply("done")],
                # A gateway that sends the arguments decoded: the body itself nests that deep.
                "d": [Reply('{"choices": [{"message": {"content": ' + deep(1500) + "}}]}")],
            }
        )
    )
    episodes = [Episode(ShopRuntime(), who) for who in ("a", "b", "c", "d")]
    a, b, c, d = await run_episodes(episodes, http_backend(server))
    assert d.error_kind == "model" and "not a chat completion" in d.error
    assert a.tool_calls[0].error == "arguments for 'refund' are nested more than 64 deep"
    assert "invalid JSON arguments for 'refund'" in b.tool_calls[0].error
    for refused in (a, b):
        assert refused.error is None and refused.final_state == {"refunds": []}
        assert refused.tool_calls[0].arguments == {}
        refused.model_dump_json()  # it travels
    assert c.tool_calls[0].error is None and c.final_state == {"refunds": [{"order_id": "O-1"}]}


class BrokenStateRuntime(ShopRuntime):
    """A runtime whose final_state raises (an env bug)."""

    def final_state(self) -> dict[str, Any]:
        raise KeyError("state")


async def test_an_env_whose_final_state_raises_errors_as_env(fake_openai) -> None:
    server = fake_openai([text_reply("done")])
    trajectory = await run_episode(BrokenStateRuntime(), http_backend(server), "go")
    assert trajectory.error_kind == "env" and "final_state failed: KeyError" in trajectory.error


async def test_an_endpoint_that_is_down_errors_as_model_after_retries() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAICompatBackend(
        "down", f"http://127.0.0.1:{port}/v1", backoff_base=0.01, max_retries=2
    )
    trajectory = await run_episode(ShopRuntime(), backend, "go")
    assert trajectory.finish_reason == "error" and trajectory.error_kind == "model"
    assert "after 3 attempts" in trajectory.error, trajectory.error


async def test_token_ids_and_logprobs_are_kept_per_turn(fake_openai) -> None:
    first = completion(
        None,
        [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "O-1"}'},
            }
        ],
        logprobs=[("token_id:5", -0.1), ("token_id:6", -0.2)],
    )
    second = completion("done", logprobs=[("token_id:7", -0.3)])
    server = fake_openai([Reply(first), Reply(second)])
    backend = OpenAICompatBackend("m", server.base_url, token_ids=True)
    trajectory = await run_episode(ShopRuntime(), backend, "go")
    assert trajectory.token_ids == [[5, 6], [7]]
    assert trajectory.logprobs == [[-0.1, -0.2], [-0.3]]


async def test_no_token_ids_when_backend_gives_none(fake_openai) -> None:
    server = fake_openai([text_reply("done")])
    trajectory = await run_episode(ShopRuntime(), http_backend(server), "go")
    assert trajectory.token_ids is None and trajectory.logprobs is None


async def test_negative_max_tool_calls_is_rejected() -> None:
    from rollout.errors import RolloutError

    with pytest.raises(RolloutError, match="max_tool_calls"):
        await run_episode(ShopRuntime(), CountingBackend(_Never()), "x", max_tool_calls=-1)


class _Never:
    name = "never"

    async def generate(self, requests):  # pragma: no cover - must not be reached
        raise AssertionError("generate called")


@pytest.mark.slow
async def test_malformed_call_from_a_real_local_model_is_a_tool_error(tmp_path: Path) -> None:
    from fakes.trained_tiny import Lesson, train_parrot

    from rollout.shared.agent.loop import DEFAULT_SYSTEM_PROMPT
    from rollout.shared.models.hf import HFBackend

    runtime = ShopRuntime()
    tools = [spec.to_openai() for spec in runtime.tool_specs()]
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Refund order O-1"},
    ]
    broken = '<tool_call>\n{"name": "refund", "arguments": {"order_id": "O-1", }\n</tool_call>'
    model_dir = train_parrot(tmp_path / "parrot", [Lesson(messages, broken, tools)])
    trajectory = await run_episode(
        runtime,
        HFBackend(model_dir, max_new_tokens=48),
        "Refund order O-1",
        max_tool_calls=1,
        sampling=SamplingParams(temperature=0.0),
    )
    first = trajectory.tool_calls[0]
    assert first.name == "refund" and "malformed tool call: invalid JSON" in first.error
    assert runtime.refunds == []
    assert trajectory.error is None
    # Real token ids and logprobs for every model turn.
    assert trajectory.token_ids and len(trajectory.token_ids) == len(trajectory.logprobs)
    assert all(
        len(t) == len(lp) for t, lp in zip(trajectory.token_ids, trajectory.logprobs, strict=True)
    )


class ScriptedRefunds:
    """No HTTP: refund O-1 (twice for even seeds, one call a turn), then answer."""

    name = "scripted-refunds"

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        from rollout.shared.models.base import ToolCall

        out = []
        for r in requests:
            done = sum(m.get("role") == "tool" for m in r.messages)
            wanted = 2 if (r.seed or 0) % 2 == 0 else 1
            if done >= wanted + 1:
                out.append(ChatResponse(content=f"done after {done}"))
                continue
            name = "lookup_order" if done == 0 else "refund"
            args = json.dumps({"order_id": "O-1", "amount": done})
            out.append(
                ChatResponse(tool_calls=[ToolCall(id=f"c{done}", name=name, arguments=args)])
            )
        return out


class ImmediateShop(ShopRuntime):
    """The same shop declaring that its calls never wait (the in-order path)."""

    immediate_tools = True


async def test_immediate_tools_run_in_order_with_the_same_trajectories() -> None:
    def episodes(kind: type) -> list[Episode]:
        return [
            Episode(kind(), "refund O-1", sampling=SamplingParams(seed=seed)) for seed in range(5)
        ]

    plain = await run_episodes(episodes(ShopRuntime), ScriptedRefunds(), max_tool_calls=3)
    ordered = await run_episodes(episodes(ImmediateShop), ScriptedRefunds(), max_tool_calls=3)
    assert [t.model_dump() for t in ordered] == [t.model_dump() for t in plain]
    assert [len(t.tool_calls) for t in plain] == [3, 2, 3, 2, 3]
    assert plain[0].final_state == {
        "refunds": [{"order_id": "O-1", "amount": 1}] + [{"order_id": "O-1", "amount": 2}]
    }


class WaitingShop(ShopRuntime):
    """A shop whose refund waits until every episode of the batch has called it."""

    def __init__(self, arrived: list[int], everyone: Any, size: int) -> None:
        super().__init__()
        self.arrived, self.everyone, self.size = arrived, everyone, size

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "refund":
            self.arrived.append(1)
            if len(self.arrived) == self.size:
                self.everyone.set()
            await self.everyone.wait()  # only returns if the episodes' calls run concurrently
        return await super().call_tool(name, arguments)


async def test_tools_that_wait_still_run_concurrently_across_episodes() -> None:
    import asyncio

    arrived: list[int] = []
    everyone = asyncio.Event()
    episodes = [
        Episode(WaitingShop(arrived, everyone, 3), "refund", sampling=SamplingParams(seed=1))
        for _ in range(3)
    ]
    done = await asyncio.wait_for(run_episodes(episodes, ScriptedRefunds()), 10)
    assert all(t.final_state["refunds"] for t in done) and len(arrived) == 3


async def test_the_repeated_call_guard_ends_the_episode_before_the_repeat_runs() -> None:
    from rollout.shared.contracts.budgets import Budgets
    from rollout.shared.learning.scripted import ScriptedBackend

    # A policy that refunds the same order forever: the third identical call is not run.
    refund = ("refund", {"order_id": "O-1", "amount": 100})
    shop = ShopRuntime()
    trajectory = await run_episode(
        shop, ScriptedBackend([refund] * 10), "go", budgets=Budgets(max_repeated_calls=3)
    )
    assert shop.refunds == [refund[1]] * 2  # two ran, the third was refused
    # A budget's end, judged like any other (a loop is no way out of a verdict), not an error.
    assert trajectory.ended_by == "max_repeated_calls" and trajectory.error is None
    assert trajectory.finish_reason == "max_repeated_calls"
    refused = trajectory.messages[-1]
    why = json.loads(refused["content"])["error"]
    assert refused["role"] == "tool" and why.startswith("not run: repeated call")
    assert 'refund({"order_id": "O-1", "amount": 100}) 3 times in a row' in why
    assert trajectory.turns == 3 and len(trajectory.tool_calls) == 2
    # The same arguments in another order are the same call; other arguments reset the count.
    lookups = [("lookup_order", {"order_id": "O-1"}), ("lookup_order", {"order_id": "O-2"})]
    varied = await run_episode(
        ShopRuntime(), ScriptedBackend(lookups * 3), "go", budgets=Budgets(max_repeated_calls=2)
    )
    assert varied.ended_by is None and varied.error is None and len(varied.tool_calls) == 6


async def test_each_episode_is_reported_as_it_ends_not_when_the_batch_does() -> None:
    from rollout.shared.learning.scripted import ScriptedBackend

    class PerTask(ScriptedBackend):
        """Task 'short' answers at once; task 'long' makes three calls first."""

        async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
            out = []
            for request in requests:
                user = next(m["content"] for m in request.messages if m["role"] == "user")
                turn = sum(1 for m in request.messages if m["role"] == "assistant")
                calls = 0 if user == "short" else 3
                self.plan = [("lookup_order", {"order_id": f"O-{k}"}) for k in range(calls)]
                out.extend(await super().generate([request]))
                heard.append(("turn", user, turn))
            return out

    heard: list[tuple[str, str, int]] = []

    async def finished(index: int, trajectory: Any) -> None:
        heard.append(("finished", ["long", "short"][index], trajectory.turns))

    episodes = [Episode(ShopRuntime(), "long"), Episode(ShopRuntime(), "short")]
    done = await run_episodes(episodes, PerTask([]), on_finished=finished)
    assert [t.turns for t in done] == [4, 1]  # in episode order
    # 'short' was reported right after its only turn, while 'long' still had turns to go.
    assert heard.index(("finished", "short", 1)) < heard.index(("turn", "long", 1))
    assert heard[-1] == ("finished", "long", 4)


class CutOff:
    """Replays one turn that ran out of tokens (finish "length") with its tool calls, then
    answers; as the hf and vLLM backends report a turn cut inside `<tool_call>`."""

    name = "cut-off"

    def __init__(self, *calls: tuple[str, str]) -> None:
        self.calls = calls
        self.turns = 0

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        from rollout.shared.models.base import ToolCall

        self.turns += 1
        if self.turns > 1:
            return [ChatResponse(content="done") for _ in requests]
        calls = [ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(self.calls)]
        return [ChatResponse(tool_calls=calls, finish_reason="length") for _ in requests]


@pytest.mark.parametrize(
    ("calls", "ran"),
    [
        # JSON that parses, but the amount may have been cut short (10 of 100): not run.
        ([("refund", '{"order_id": "O-1", "amount": 10}')], 0),
        # A finished lookup, then the refund being written when the tokens ran out.
        ([("lookup_order", '{"order_id": "O-1"}'), ("refund", '{"order_id": "O-1", "amo')], 1),
        ([("refund", '{"order_id": "O-1", "amo')], 0),
        # Two finished calls, then a third cut short: the first two run.
        (
            [
                ("lookup_order", '{"order_id": "O-1"}'),
                ("refund", '{"order_id": "O-1", "amount": 100}'),
                ("lookup_order", '{"order_id": "O-'),
            ],
            2,
        ),
    ],
    ids=["parses", "second-cut", "partial-json", "third-cut"],
)
async def test_a_turn_cut_off_by_its_token_budget_runs_only_the_calls_it_finished(
    calls, ran
) -> None:
    from rollout.shared.contracts.budgets import Budgets

    shop = ShopRuntime()
    backend = CutOff(*calls)
    trajectory = await run_episode(shop, backend, "refund O-1", budgets=Budgets(max_turn_tokens=64))
    assert backend.turns == 1
    assert shop.refunds == ([{"order_id": "O-1", "amount": 100}] if ran == 2 else [])
    assert trajectory.ended_by == "max_turn_tokens" and trajectory.finish_reason == "length"
    assert trajectory.turns == 1 and trajectory.error is None
    # The calls finished before the cut one ran; the cut one is on the record as an error
    # (never scoring above a malformed call); each id is answered, so the conversation stays
    # well formed for training.
    assert [c.name for c in trajectory.tool_calls] == [name for name, _ in calls]
    assert all(c.error is None for c in trajectory.tool_calls[:ran])
    assert [c.error for c in trajectory.tool_calls[ran:]] == [
        "not run: the turn ran out of tokens (max_turn_tokens) while writing this call"
    ]
    answers = [m for m in trajectory.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answers] == [f"c{i}" for i in range(len(calls))]


async def test_a_finished_call_that_ends_the_episode_keeps_that_budget_as_the_reason() -> None:
    from rollout.shared.contracts.budgets import Budgets

    shop = ShopRuntime()
    calls = [
        ("lookup_order", '{"order_id": "O-1"}'),
        ("refund", '{"order_id": "O-1", "amount": 100}'),
        ("refund", '{"order_id": "O-1", "amo'),
    ]
    trajectory = await run_episode(
        shop, CutOff(*calls), "refund O-1", max_tool_calls=1, budgets=Budgets(max_turn_tokens=64)
    )
    # The call limit ended the episode at the second call: that budget is the reason given.
    assert shop.refunds == [] and trajectory.ended_by == "max_tool_calls"
    assert [c.name for c in trajectory.tool_calls] == ["lookup_order"]
    answers = [m for m in trajectory.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answers] == ["c0", "c1", "c2"]
    assert json.loads(answers[-1]["content"]) == {"error": "not run: the episode ended"}


async def test_a_call_cut_at_the_rollout_budget_says_that_budget() -> None:
    from rollout.shared.contracts.budgets import Budgets

    shop = ShopRuntime()
    trajectory = await run_episode(
        shop,
        CutOff(("refund", '{"order_id": "O-1"}')),
        "refund O-1",
        budgets=Budgets(max_turn_tokens=64, max_rollout_tokens=16),
    )
    assert shop.refunds == [] and trajectory.ended_by == "max_rollout_tokens"
    assert "(max_rollout_tokens)" in trajectory.tool_calls[0].error


def _deep_record() -> dict[str, Any]:
    value: dict[str, Any] = {"customer": "Alice"}
    for _ in range(2_000):
        value = {"inner": value}
    return value


class DeepResultRuntime(ShopRuntime):
    """A shop whose lookup returns a record nested 2,000 deep (what a lookup table held),
    and whose state keeps one too."""

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != "lookup_order":
            return await super().call_tool(name, arguments)
        return ToolResult(output=_deep_record())

    def final_state(self) -> dict[str, Any]:
        return {**super().final_state(), "audit": _deep_record()}


async def test_a_tool_result_nested_2000_deep_is_kept_cut_not_the_batchs_error(
    fake_openai,
) -> None:
    # The env's result is not the model's to refuse: nested 2,000 deep it made json.dumps
    # raise RecursionError (and past about 255 the trajectory could not travel), erroring
    # every episode of the batch. It is kept, cut at MAX_RESULT_DEPTH.
    from rollout.shared.agent.loop import MAX_RESULT_DEPTH

    server = fake_openai(
        by_conversation(
            {
                "a": [tool_reply(("lookup_order", {"order_id": "O-1"})), text_reply("done")],
                "b": [tool_reply(("refund", {"order_id": "O-1"})), text_reply("done")],
            }
        )
    )
    episodes = [Episode(DeepResultRuntime(), who) for who in ("a", "b")]
    a, b = await run_episodes(episodes, http_backend(server))
    assert a.error is None and b.error is None and a.final_output == "done"
    result, levels = a.tool_calls[0].result, 1
    while isinstance(result, dict):
        result, levels = result["inner"], levels + 1
    assert levels == MAX_RESULT_DEPTH + 1
    assert result.startswith(f'[cut at depth {MAX_RESULT_DEPTH}] {{"inner":{{"inner":')
    assert "[cut at depth" in a.messages[-2]["content"]  # what the model was shown
    assert b.final_state["refunds"] == [{"order_id": "O-1"}]
    assert "[cut at depth" in json.dumps(b.final_state)
    a.model_dump_json()  # it travels
