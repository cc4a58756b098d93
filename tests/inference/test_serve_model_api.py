"""`rollout serve-model` through the official `openai` client: models, chat with and without
tools, n, logprobs, streaming (tool-call deltas included), OpenAI-style 4xx errors and keys."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from conftest import client_of
from waiting import wait_until

from rollout.services.inference.app import KeyRing
from rollout.services.inference.exposure import is_loopback, load_keys
from rollout.shared.stack.supervisor import cli_command

INSTRUCTION = "Refund order O-1 for $100 for Alice"  # a train task of examples/refund_agent.py
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look an order up",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]


async def test_models_list_and_retrieve(scripted) -> None:
    client = client_of(scripted)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["local/scripted"]
    card = await client.models.retrieve("local/scripted")
    assert card.id == "local/scripted" and card.owned_by == "rollout"
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("nope")
    assert "does not exist" in caught.value.message


async def test_chat_with_tools_returns_tool_calls_plain_and_streamed(scripted) -> None:
    client = client_of(scripted)
    messages = [{"role": "user", "content": INSTRUCTION}]
    done = await client.chat.completions.create(
        model="local/scripted", messages=messages, tools=TOOLS
    )
    [choice] = done.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "lookup_order"
    assert json.loads(call.function.arguments) == {"order_id": "O-1"}
    assert call.id.startswith("call_")

    # The same conversation streamed: the client assembles the tool call from its deltas.
    stream = await client.chat.completions.create(
        model="local/scripted", messages=messages, tools=TOOLS, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        for c in chunk.choices:
            for delta in c.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("lookup_order", {"order_id": "O-1"})
    ]

    # After the tool's answer the scripted agent goes on with its plan (the next call).
    follow_up = [
        *messages,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"amount": 100}'},
    ]
    nxt = await client.chat.completions.create(
        model="local/scripted", messages=follow_up, tools=TOOLS
    )
    assert nxt.choices[0].message.tool_calls[0].function.name != "lookup_order"


async def test_hf_model_text_n_logprobs_and_stream(serve, tiny_model: Path) -> None:
    async with serve(f"hf:{tiny_model}", name="tiny") as running:
        client = client_of(running)
        messages = [{"role": "user", "content": "Refund order O-1 in full"}]
        done = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=0, n=2, logprobs=True,
            extra_body={"return_tokens_as_token_ids": True},
        )  # fmt: skip
        assert len(done.choices) == 2 and [c.index for c in done.choices] == [0, 1]
        first = done.choices[0]
        assert first.finish_reason in ("stop", "length")
        assert done.usage.completion_tokens > 0 and done.usage.prompt_tokens > 0
        tokens = first.logprobs.content
        assert tokens and all(t.token.startswith("token_id:") and t.logprob <= 0 for t in tokens)
        # Greedy: both choices are the same sample; streaming gives the same text.
        assert first.message.content == done.choices[1].message.content
        stream = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        parts, usage = [], None
        async for chunk in stream:
            parts += [c.delta.content or "" for c in chunk.choices]
            usage = chunk.usage or usage
        assert "".join(parts) == (first.message.content or "")
        assert usage is not None and usage.completion_tokens == len(tokens)


async def test_streaming_sends_tokens_as_they_are_sampled(serve, talker: Path) -> None:
    async with serve(f"hf:{talker}", name="tiny") as running:
        client = client_of(running)
        messages = [{"role": "user", "content": "hi"}]
        done = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=24, temperature=0
        )
        text = done.choices[0].message.content or ""
        assert len(text) > 8  # a multi-token answer
        for options in ({}, {"stop": ["sUsU"]}, {"n": 2}):
            expected = text
            if "stop" in options:
                reference = await client.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=24, temperature=0, **options
                )
                expected = reference.choices[0].message.content or ""
                assert expected and expected != text
            stream = await client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=24, temperature=0, stream=True,
                stream_options={"include_usage": True}, **options,
            )  # fmt: skip
            parts: dict[int, list[str]] = {}
            finish, usage, arrived = {}, None, []
            loop = asyncio.get_running_loop()
            async for chunk in stream:
                for c in chunk.choices:
                    if c.delta.content:
                        parts.setdefault(c.index, []).append(c.delta.content)
                        arrived.append(loop.time())
                    if c.finish_reason:
                        finish[c.index] = c.finish_reason
                usage = chunk.usage or usage
            choices = options.get("n", 1)
            assert sorted(parts) == list(range(choices)), options
            for index in range(choices):
                # Token by token: many content chunks, together the non-streamed answer.
                assert "".join(parts[index]) == expected, options
                if "stop" not in options:  # (the stop sequence cuts the answer to one letter)
                    assert len(parts[index]) > 3, (options, parts[index])
            assert set(finish.values()) == {"stop" if "stop" in options else "length"}
            assert usage is not None and usage.completion_tokens == 24 * choices
            if "stop" not in options:  # they came over time, not in one write at the end
                assert arrived[-1] > arrived[0], options
        assert running.policy.slot.cancelled == 0


def test_streamed_text_holds_back_tool_calls_stops_and_whitespace(talker: Path) -> None:
    from transformers import AutoTokenizer

    from rollout.services.inference.api import TextStream
    from rollout.shared.models.hermes import parse_tool_calls

    tokenizer = AutoTokenizer.from_pretrained(talker)
    call = '<tool_call>{"name": "refund", "arguments": {"order_id": "O-1"}}</tool_call>'
    for text, stop in (
        (f"  Sure, refunding now. {call}", None),
        ('{"name": "refund", "arguments": {}}', None),  # a bare JSON call: nothing early
        ("refunded order O-1 END and more", "END"),
    ):
        stream = TextStream(tokenizer, stop)
        sent = "".join(
            stream.add(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]
        )
        content, calls = parse_tool_calls(text)
        if stop:
            content = content.split(stop)[0].strip()
        assert "<tool" not in sent and not sent.endswith(" ") and (content or "").startswith(sent)
        assert sent + stream.rest(content) == (content or "")
        if calls:
            assert sent == (content or "")[: len(sent)]
    assert TextStream(tokenizer, None).rest(None) == ""


def test_streamed_text_decodes_each_token_once_not_the_whole_text_again(talker: Path) -> None:
    from transformers import AutoTokenizer

    from rollout.services.inference.api import TextStream

    tokenizer = AutoTokenizer.from_pretrained(talker)
    decoded: list[int] = []

    class Counting:
        """The real tokenizer, counting how many ids each decode is handed."""

        def decode(self, ids, **options):
            decoded.append(len(ids))
            return tokenizer.decode(ids, **options)

    text = " ".join(["Refund order O-1 in full, é 😀 refunded."] * 40)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 400
    stream = TextStream(Counting(), None)
    sent = "".join(stream.add(t) for t in ids)
    content = tokenizer.decode(ids, skip_special_tokens=True).strip()
    # The pieces still add up to the non-streamed answer...
    assert len(sent) > len(content) // 2 and sent + stream.rest(content) == content
    # ...and each token costs a few ids of decoding, not all the ids so far (n^2 / 2).
    assert max(decoded) <= 16 and sum(decoded) <= 4 * len(ids)

    # Once a tool call begins nothing more can show: its tokens are not decoded at all.
    decoded.clear()
    call = "<tool_call>" + '{"name": "refund", "arguments": {"order_id": "O-1"}}' * 20
    ids = tokenizer(f"Sure. {call}</tool_call>", add_special_tokens=False)["input_ids"]
    stream = TextStream(Counting(), None)
    assert "".join(stream.add(t) for t in ids) == "Sure."
    assert len(ids) > 200 and len(decoded) < 60


async def test_a_client_that_leaves_mid_stream_frees_its_generation(serve, talker: Path) -> None:
    async with serve(f"hf:{talker}", name="tiny") as running:
        client = client_of(running)
        messages = [{"role": "user", "content": "hi"}]
        stream = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4000, temperature=0, stream=True
        )
        seen = 0
        async for chunk in stream:
            seen += sum(1 for c in chunk.choices if c.delta.content)
            if seen >= 3:
                break
        await stream.close()  # the client goes away with ~4000 tokens still to come
        loop = asyncio.get_running_loop()
        await wait_until(
            lambda: running.policy.slot.cancelled >= 1,
            "the generation to stop after the client left",
            60,
        )
        # The model is free again: the next request is answered at once.
        started = loop.time()
        done = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4, temperature=0
        )
        assert done.choices[0].finish_reason == "length"
        assert loop.time() - started < 30
        assert running.policy.slot.served == 2


async def test_a_switch_between_reading_the_slot_and_queuing_loses_no_request(
    serve, talker: Path
) -> None:
    async with serve(f"hf:{talker}", name="tiny") as running:
        policy, loop = running.policy, asyncio.get_running_loop()
        read = policy.current

        def current_then_switch():
            # The version is retired right after a request reads it as current, as a
            # `policy.updated` landing in that instant would (the next loop callback).
            slot = read()
            loop.call_soon(slot.retire)
            return slot

        policy.current = current_then_switch  # type: ignore[method-assign]
        client = client_of(running)
        messages = [{"role": "user", "content": "hi"}]

        async def streamed() -> str:
            stream = await client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True
            )
            return "".join([c.delta.content or "" async for k in stream for c in k.choices])

        # The retired version still serves what was queued on it: no hang, a full answer.
        text = await asyncio.wait_for(streamed(), timeout=60)
        assert text and policy.slot.served == 1
        # Asking a version that is gone fails at once with the reason, never hangs.
        with pytest.raises(openai.InternalServerError, match="retired before this request ran"):
            await asyncio.wait_for(streamed(), timeout=60)


async def test_a_prompt_over_the_context_is_a_400_not_a_500(serve, tiny_model: Path) -> None:
    async with serve(f"hf:{tiny_model}", name="tiny") as running:
        client = client_of(running)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "order " * 3000}]
            )
        assert caught.value.code == "context_length_exceeded"
        assert "does not fit the model's context" in caught.value.message
        # The server goes on serving; stop sequences cut the text where they start.
        done = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
            temperature=0,
        )  # fmt: skip
        text = done.choices[0].message.content or ""
        if len(text) > 2:
            cut = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
                temperature=0, stop=[text[2:4]],
            )  # fmt: skip
            assert text.startswith(cut.choices[0].message.content or "")
            assert len(cut.choices[0].message.content or "") <= 2
            assert cut.choices[0].finish_reason == "stop"


async def test_concurrent_requests_share_batches(serve, tiny_model: Path) -> None:
    async with serve(f"hf:{tiny_model}", name="tiny", max_batch=8) as running:
        client = client_of(running)
        results = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"order O-{i}"}],
                    max_tokens=4,
                    seed=i,
                )  # fmt: skip
                for i in range(6)
            )
        )
        assert len(results) == 6 and all(r.choices for r in results)
        assert running.policy.slot.served == 6


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "JSON object"),
        (json.dumps({"model": "local/scripted"}).encode(), 400, "messages", "Field required"),
        (json.dumps({"model": "local/scripted", "messages": []}).encode(), 400, "messages",
         "at least 1"),
        (json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode(),
         404, "model", "does not exist"),
        (json.dumps({"model": "local/scripted", "n": 99,
                     "messages": [{"role": "user", "content": "hi"}]}).encode(), 400, "n", "at most"),
        (json.dumps({"model": "local/scripted", "max_tokens": 0,
                     "messages": [{"role": "user", "content": "hi"}]}).encode(), 400,
         "max_tokens", "greater than or equal to 1"),
        (json.dumps({"model": "local/scripted", "max_tokens": 10**6,
                     "messages": [{"role": "user", "content": "hi"}]}).encode(), 400,
         "max_tokens", "at most 4096"),
        (json.dumps({"model": "local/scripted", "temperature": 9,
                     "messages": [{"role": "user", "content": "hi"}]}).encode(), 400,
         "temperature", "less than or equal to 2"),
        (json.dumps({"model": "local/scripted",
                     "messages": [{"role": "wizard", "content": "hi"}]}).encode(), 400,
         "messages.0.role", "unknown role"),
        (json.dumps({"model": "local/scripted",
                     "messages": [{"role": "user", "content": "refund \ud83d"}]}).encode(), 400,
         "messages.0.content", "half of a UTF-16 surrogate pair"),
        (json.dumps({"model": "local/scripted", "seed": 10**20,
                     "messages": [{"role": "user", "content": "hi"}]}).encode(), 400,
         "seed", "less than or equal to 9223372036854775807"),
    ],
)  # fmt: skip
async def test_bad_requests_get_openai_errors(scripted, body, status, param, words) -> None:
    async with httpx.AsyncClient(base_url=scripted.base_url) as http:
        response = await http.post(
            "/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


async def test_null_options_are_their_defaults_as_openai_takes_them(scripted) -> None:
    # OpenAI's API takes null for n, stream and logprobs (clients that send every field do):
    # they were 400 "n: Input should be a valid integer".
    body = {"model": "local/scripted", "messages": [{"role": "user", "content": INSTRUCTION}],
            "tools": TOOLS, "n": None, "stream": None, "logprobs": None,
            "return_tokens_as_token_ids": None}  # fmt: skip
    async with httpx.AsyncClient(base_url=scripted.base_url) as http:
        response = await http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["logprobs"] is None


async def test_a_request_that_cannot_run_fails_alone_not_its_batch(serve, tiny_model: Path) -> None:
    # A seed past 64 bits failed the sampler's generator, and a lone surrogate (text cut
    # mid-emoji) the tokenizer, and with it every request of the batch: the other clients got
    # "500 server error: ValueError" (or TypeError) for one client's request.
    cut = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Look \ud83d"}}]
    async with serve(f"hf:{tiny_model}", name="tiny", max_batch=8) as running:
        client = client_of(running)
        http = httpx.AsyncClient(base_url=running.base_url, timeout=60)

        async def ask(seed: int, tools: list | None = None) -> str:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "order O-1"}],
                    "max_tokens": 4, "seed": seed, **({"tools": tools} if tools else {})}  # fmt: skip
            # json.dumps writes a lone surrogate as the \ud83d escape, as a browser's JSON does.
            response = await http.post(
                "/chat/completions", content=json.dumps(body),
                headers={"content-type": "application/json"},
            )  # fmt: skip
            if response.status_code != 200:
                return f"{response.status_code} {response.json()['error']['param']}"
            return "ok"

        async with http:
            answers = await asyncio.gather(*(ask(s) for s in (1, 2, 2**70, 3, 4)))
            assert answers == ["ok", "ok", "400 seed", "ok", "ok"]
            answers = await asyncio.gather(ask(1), ask(2, cut), ask(3))
            assert answers == ["ok", "400 messages", "ok"]
        # The largest seed still serves n choices (seed + i wraps within 64 bits).
        done = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=3,
            seed=2**63 - 1,
        )  # fmt: skip
        assert len(done.choices) == 3


async def test_a_request_offering_no_tools_gets_text_never_a_tool_call(scripted) -> None:
    # The backends read a JSON reply `{"name": ..., "arguments": ...}` as a tool call: a client
    # that offered no tool (or tool_choice "none") got `content: null` and a call it never
    # declared, which OpenAI never sends.
    client = client_of(scripted)
    messages = [{"role": "user", "content": INSTRUCTION}]
    for options in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        done = await client.chat.completions.create(
            model="local/scripted", messages=messages, **options
        )
        [choice] = done.choices
        assert choice.message.tool_calls is None and choice.finish_reason == "stop", options
        reply = json.loads(choice.message.content or "")
        assert reply == {"name": "lookup_order", "arguments": {"order_id": "O-1"}}
        stream = await client.chat.completions.create(
            model="local/scripted", messages=messages, stream=True, **options
        )
        chunks = [c.choices[0] async for c in stream if c.choices]
        assert not any(c.delta.tool_calls for c in chunks)
        assert "".join(c.delta.content or "" for c in chunks) == choice.message.content
        assert chunks[-1].finish_reason == "stop"


def test_an_hf_reply_read_as_a_call_is_its_decoded_text_when_no_tool_is_offered(
    tiny_model: Path,
) -> None:
    from transformers import AutoTokenizer

    from rollout.services.inference import api
    from rollout.shared.models.base import ChatResponse
    from rollout.shared.models.hermes import parse_tool_calls

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    text = 'Sure: <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    content, calls = parse_tool_calls(tokenizer.decode(ids, skip_special_tokens=True))
    response = ChatResponse(content=content, tool_calls=calls, token_ids=ids,
                            finish_reason="tool_calls")  # fmt: skip
    plain = api.parse_body(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        max_n=1, max_tokens_limit=16,
    )  # fmt: skip
    choice = api.choice_of(response, plain, tokenizer)
    whole = tokenizer.decode(ids, skip_special_tokens=True).strip()
    assert (choice.content, choice.tool_calls, choice.finish_reason) == (whole, [], "stop")
    offered = plain.model_copy(update={"tools": [api.Tool.model_validate(TOOLS[0])]})
    choice = api.choice_of(response, offered, tokenizer)
    assert choice.finish_reason == "tool_calls" and choice.tool_calls[0]["function"]["name"] == "f"


async def test_unknown_paths_and_methods_and_the_client_errors(scripted) -> None:
    async with httpx.AsyncClient(base_url=scripted.url) as http:
        missing = await http.get("/v1/nothing")
        wrong = await http.get("/v1/chat/completions")
        huge = await http.post("/v1/chat/completions", content=b"x" * (9 * 1024 * 1024))
    assert missing.status_code == 404 and "Unknown path" in missing.json()["error"]["message"]
    assert wrong.status_code == 405 and wrong.json()["error"]["message"]
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
    client = client_of(scripted)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="local/scripted", messages=[{"role": "user", "content": "hi"}], n=50
        )
    assert caught.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )


async def test_keys_are_required_when_configured(serve) -> None:
    keys = KeyRing(["sk-first", "sk-second"])
    async with serve("local/scripted", keys=keys) as running:
        hello = [{"role": "user", "content": "hi"}]
        for bad in ("unused", "sk-firs", "sk-first-and-more"):
            with pytest.raises(openai.AuthenticationError) as caught:
                await client_of(running, bad).models.list()
            assert caught.value.status_code == 401
        async with httpx.AsyncClient(base_url=running.url) as http:
            bare = await http.post("/v1/chat/completions", json={"messages": hello})
            health = await http.get("/health")
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
        assert bare.json()["error"]["code"] == "invalid_api_key"
        assert health.status_code == 200
        for good in ("sk-first", "sk-second"):
            done = await client_of(running, good).chat.completions.create(
                model="local/scripted", messages=hello
            )
            assert done.choices[0].message.content


def test_key_sources_and_loopback(tmp_path: Path) -> None:
    assert load_keys(None, None) is None
    ring = load_keys("SERVE_KEY", None, env={"SERVE_KEY": "sk-env"})
    assert ring is not None and ring.allows("sk-env") and not ring.allows("sk-other")
    keys_file = tmp_path / "keys"
    keys_file.write_text("# operators\nsk-a\n\nsk-b\n")
    ring = load_keys(None, keys_file)
    assert ring is not None and len(ring) == 2 and ring.allows("sk-b")
    from rollout.errors import RolloutError

    with pytest.raises(RolloutError, match="SERVE_KEY is not set"):
        load_keys("SERVE_KEY", None, env={})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(RolloutError, match="no key in the file"):
        load_keys(None, tmp_path / "empty")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.2")
    assert not is_loopback("example.com")


def _cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    return env | {"ROLLOUT_HOME": str(tmp_path / "home")}


def test_cli_refuses_a_public_address_without_keys(tmp_path: Path) -> None:
    done = subprocess.run(
        cli_command("serve-model", "local/scripted", "--host", "0.0.0.0", "--port", "0"),
        env=_cli_env(tmp_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "refusing to serve on 0.0.0.0 without an API key" in done.stderr
    assert "--api-key-env" in done.stderr and "Traceback" not in done.stderr


async def test_cli_serves_and_announces_its_url(tmp_path: Path) -> None:
    env = _cli_env(tmp_path) | {"SERVE_KEY": "sk-cli"}
    child = await asyncio.create_subprocess_exec(
        *cli_command("serve-model", "local/scripted", "--port", "0", "--name", "agent",
                     "--api-key-env", "SERVE_KEY", "--no-follow"),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode()
        assert line.startswith("rollout serve-model: agent at http://127.0.0.1:"), line
        base_url = line.rsplit(" ", 1)[1].strip()
        actor = (await asyncio.wait_for(child.stdout.readline(), 10)).decode()
        assert actor.strip() == f"as an actor model: {base_url}#agent"
        client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-cli", max_retries=0)
        assert [m.id for m in (await client.models.list()).data] == ["agent"]
        done = await client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": INSTRUCTION}], tools=TOOLS
        )
        assert done.choices[0].message.tool_calls[0].function.name == "lookup_order"
    finally:
        child.terminate()
        _, err = await asyncio.wait_for(child.communicate(), 30)
    assert "Traceback" not in err.decode()


def test_help_documents_the_verb() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "serve-model", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    for words in ("/v1/chat/completions", "--api-key-env", "policy.updated", "#local/tiny-agent"):
        assert words in done.stdout
