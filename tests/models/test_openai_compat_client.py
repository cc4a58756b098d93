"""The OpenAI-compatible client against a real local HTTP server: tools, retries, errors."""

from __future__ import annotations

import time

import pytest
from fakes.openai_server import Reply, completion, error_reply, text_reply, tool_reply

from rollout.errors import RolloutError
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.openai_compat import OpenAICompatBackend

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Read an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


def backend(server, **kwargs) -> OpenAICompatBackend:
    kwargs.setdefault("backoff_base", 0.01)
    return OpenAICompatBackend("gpt-test", server.base_url, **kwargs)


def request(text: str = "hi", **kwargs) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], **kwargs)


async def test_sends_messages_tools_and_sampling_and_parses_tool_calls(fake_openai) -> None:
    server = fake_openai([tool_reply(("lookup_order", {"order_id": "O-1"}), content="Looking")])
    client = backend(server, api_key="sk-test")
    [response] = await client.generate(
        [request("Refund O-1", tools=TOOLS, temperature=0.2, top_p=0.9, max_tokens=64, seed=7)]
    )
    assert response.error is None
    assert response.content == "Looking"
    assert response.finish_reason == "tool_calls"
    [call] = response.tool_calls
    assert call.name == "lookup_order" and call.arguments == '{"order_id": "O-1"}'
    assert response.usage is not None and response.usage.total_tokens == 15

    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "gpt-test"
    assert sent.body["tools"] == TOOLS
    assert sent.body["messages"] == [{"role": "user", "content": "Refund O-1"}]
    assert (sent.body["temperature"], sent.body["top_p"]) == (0.2, 0.9)
    assert (sent.body["max_tokens"], sent.body["seed"]) == (64, 7)
    await client.aclose()


async def test_history_is_sent_in_wire_shape(fake_openai) -> None:
    server = fake_openai([text_reply("done")])
    client = backend(server)
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        # Bookkeeping keys (name on a tool message) must not reach strict APIs.
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": {"ok": True}},
    ]
    await client.generate([ChatRequest(messages=messages)])
    sent = server.chat_bodies[0]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'}
    assert sent[1]["tool_calls"][0]["function"]["name"] == "f"
    assert "tools" not in server.chat_bodies[0]


async def test_batch_keeps_request_order_under_concurrency(fake_openai) -> None:
    def echo(body):
        text = body["messages"][-1]["content"]
        # Early requests answer last, so completion order differs from request order.
        return Reply(completion(f"echo {text}"), delay=0.05 if text in ("0", "1") else 0.0)

    server = fake_openai(echo)
    client = backend(server, concurrency=4)
    responses = await client.generate([request(str(i)) for i in range(10)])
    assert [r.content for r in responses] == [f"echo {i}" for i in range(10)]


async def test_retries_429_and_5xx_then_succeeds(fake_openai) -> None:
    server = fake_openai(
        [
            error_reply(429, "Rate limit reached"),
            error_reply(500, "boom"),
            error_reply(503, "overloaded"),
            text_reply("finally"),
        ]
    )
    [response] = await backend(server).generate([request()])
    assert response.error is None and response.content == "finally"
    assert len(server.requests) == 4


async def test_honours_retry_after(fake_openai) -> None:
    server = fake_openai(
        [error_reply(429, "slow down", headers={"Retry-After": "0.6"}), text_reply("ok")]
    )
    started = time.monotonic()
    [response] = await backend(server, backoff_base=0.001).generate([request()])
    elapsed = time.monotonic() - started
    assert response.content == "ok"
    # Exponential backoff alone would wait about a millisecond.
    assert elapsed >= 0.6


async def test_honours_retry_after_ms(fake_openai) -> None:
    server = fake_openai(
        [error_reply(503, "busy", headers={"retry-after-ms": "400"}), text_reply("ok")]
    )
    started = time.monotonic()
    [response] = await backend(server, backoff_base=0.001).generate([request()])
    assert response.content == "ok"
    assert time.monotonic() - started >= 0.4


async def test_gives_up_after_max_retries_with_a_reason(fake_openai) -> None:
    server = fake_openai([error_reply(500, "still broken")] * 3)
    [response] = await backend(server, max_retries=2).generate([request()])
    assert response.finish_reason == "error"
    assert "gave up after 3 attempts" in response.error
    assert "HTTP 500: still broken" in response.error
    assert len(server.requests) == 3


async def test_timeout_is_retried_then_reported(fake_openai) -> None:
    server = fake_openai([Reply(completion("late"), delay=1.0)] * 2)
    [response] = await backend(server, timeout=0.2, max_retries=1).generate([request()])
    assert response.finish_reason == "error"
    assert "timeout" in response.error
    assert len(server.requests) == 2


async def test_timeout_then_success(fake_openai) -> None:
    server = fake_openai([Reply(completion("late"), delay=1.0), text_reply("fast")])
    [response] = await backend(server, timeout=0.2).generate([request()])
    assert response.content == "fast"


async def test_connection_refused_is_reported_not_raised(fake_openai) -> None:
    server = fake_openai([])
    url = server.base_url
    server.stop()
    client = OpenAICompatBackend("m", url, max_retries=1, backoff_base=0.01)
    [response] = await client.generate([request()])
    assert response.finish_reason == "error"
    assert "cannot reach" in response.error


async def test_401_raises_with_key_hint(fake_openai) -> None:
    server = fake_openai([text_reply("never")], api_key="sk-right")
    client = backend(server, api_key="sk-wrong", key_env="OPENAI_API_KEY", label="openai/gpt-x")
    with pytest.raises(RolloutError) as info:
        await client.generate([request(), request()])
    message = str(info.value)
    assert "openai/gpt-x" in message and "401" in message
    assert "check OPENAI_API_KEY" in message
    assert "Incorrect API key provided" in message


async def test_404_names_model_and_base_url(fake_openai) -> None:
    server = fake_openai([error_reply(404, "The model `gpt-test` does not exist")])
    with pytest.raises(RolloutError, match="check the model name 'gpt-test'"):
        await backend(server).generate([request()])


async def test_400_is_a_per_request_error_not_retried(fake_openai) -> None:
    def answer(body):
        if body["messages"][0]["content"] == "too long":
            return error_reply(400, "context length exceeded")
        return text_reply("fine")

    server = fake_openai(answer)
    bad, good = await backend(server).generate([request("too long"), request("short")])
    assert bad.finish_reason == "error" and "context length exceeded" in bad.error
    assert good.content == "fine"
    assert len(server.requests) == 2


async def test_non_json_200_is_an_error_response(fake_openai) -> None:
    server = fake_openai([Reply("<html>gateway</html>")])
    [response] = await backend(server).generate([request()])
    assert response.finish_reason == "error" and "unexpected response" in response.error


async def test_logprobs_and_vllm_token_ids(fake_openai) -> None:
    server = fake_openai(
        [Reply(completion("hi", logprobs=[("token_id:11", -0.5), ("token_id:12", -1.25)]))]
    )
    client = backend(server, token_ids=True)
    [response] = await client.generate([request()])
    assert response.token_ids == [11, 12]
    assert response.logprobs == [-0.5, -1.25]
    body = server.chat_bodies[0]
    assert body["logprobs"] is True and body["return_tokens_as_token_ids"] is True


async def test_malformed_tool_call_entry_is_flagged_not_raised(fake_openai) -> None:
    body = completion(None, [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}])
    server = fake_openai([body])
    [response] = await backend(server).generate([request()])
    [call] = response.tool_calls
    assert call.error is not None and "no name" in call.error


async def test_client_survives_separate_event_loops(fake_openai) -> None:
    import asyncio
    import threading

    server = fake_openai([text_reply("a"), text_reply("b")])
    client = backend(server)
    first = await client.generate([request()])
    # A second loop (as with a second asyncio.run) must get its own connection pool.
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(asyncio.run(client.generate([request()])))
    )
    thread.start()
    thread.join()
    assert first[0].content == "a" and result[0][0].content == "b"
