"""The hf backend on the tiny model: batched generation, token ids/logprobs, tool calls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from fakes.trained_tiny import Lesson, train_parrot

from rollout.errors import RolloutError
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.hermes import render_tool_call
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.tiny import build_tiny_model

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
GOOD = [{"role": "user", "content": "Look up order O-1"}]
BROKEN = [{"role": "user", "content": "Break the call"}]
PLAIN = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def parrot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_parrot(
        tmp_path_factory.mktemp("parrot"),
        [
            Lesson(GOOD, render_tool_call("lookup_order", {"order_id": "O-1"}), TOOLS),
            Lesson(
                BROKEN,
                '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": }\n</tool_call>',
                TOOLS,
            ),
            Lesson(PLAIN, "Hello there.", TOOLS),
        ],
    )


@pytest.fixture(scope="module")
def hf(parrot: Path) -> HFBackend:
    # The CPU unless ROLLOUT_TEST_DEVICE names another (cuda: the same checks on the GPU).
    return HFBackend(parrot, max_new_tokens=64, device=os.environ.get("ROLLOUT_TEST_DEVICE", "cpu"))


def greedy(messages, **kwargs) -> ChatRequest:
    return ChatRequest(messages=messages, tools=TOOLS, temperature=0, **kwargs)


async def test_batch_parses_tool_calls_plain_answers_and_malformed_calls(hf: HFBackend) -> None:
    good, broken, plain = await hf.generate([greedy(GOOD), greedy(BROKEN), greedy(PLAIN)])

    assert good.finish_reason == "tool_calls" and good.error is None
    [call] = good.tool_calls
    assert (call.name, call.arguments, call.error) == ("lookup_order", '{"order_id": "O-1"}', None)

    # Broken JSON comes back as a flagged call (named when recoverable), never an exception.
    [bad] = broken.tool_calls
    assert bad.error is not None and "invalid JSON" in bad.error
    assert bad.name == "lookup_order"

    assert plain.content == "Hello there." and plain.tool_calls == []
    assert plain.finish_reason == "stop"


async def test_token_ids_and_logprobs_match_a_fresh_forward_pass(hf: HFBackend) -> None:
    request = greedy(GOOD)
    [response] = await hf.generate([request])
    ids, logprobs = response.token_ids, response.logprobs
    assert ids and len(ids) == len(logprobs)
    assert ids[-1] == hf.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert response.usage.completion_tokens == len(ids)

    # Re-score prompt + sampled tokens in one pass: the logprobs must be the policy's own.
    prompt_ids = hf.tokenizer(hf.render_prompt(request), add_special_tokens=False)["input_ids"]
    full = torch.tensor([prompt_ids + ids], device=hf.model.device)
    with torch.no_grad():
        logits = hf.model(input_ids=full).logits[0].float()
    scored = torch.log_softmax(logits, dim=-1)
    expected = [float(scored[len(prompt_ids) - 1 + k, t]) for k, t in enumerate(ids)]
    assert logprobs == pytest.approx(expected, abs=1e-4)
    assert all(lp <= 0 for lp in logprobs)


async def test_left_padding_does_not_change_greedy_output(hf: HFBackend) -> None:
    [alone] = await hf.generate([greedy(PLAIN)])
    _, padded = await hf.generate([greedy(GOOD + GOOD + GOOD), greedy(PLAIN)])
    assert padded.token_ids == alone.token_ids
    assert padded.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


async def test_seeded_sampling_is_reproducible_per_request(hf: HFBackend) -> None:
    sample = ChatRequest(messages=PLAIN, tools=TOOLS, temperature=1.5, seed=123, max_tokens=12)
    [first] = await hf.generate([sample])
    _, again = await hf.generate([greedy(GOOD), sample])
    assert again.token_ids == first.token_ids


async def test_max_tokens_cuts_generation_with_length_reason(hf: HFBackend) -> None:
    [response] = await hf.generate([greedy(GOOD, max_tokens=3)])
    assert response.finish_reason == "length"
    assert len(response.token_ids) == 3


async def test_chunks_batches_larger_than_max_batch_size(parrot: Path) -> None:
    small = HFBackend(parrot, max_new_tokens=8, max_batch_size=2)
    responses = await small.generate([greedy(PLAIN)] * 5)
    assert len(responses) == 5
    assert len({tuple(r.token_ids) for r in responses}) == 1


def test_registry_builds_hf_backend(parrot: Path) -> None:
    backend = resolve_backend(f"hf:{parrot}")
    assert isinstance(backend, HFBackend) and backend.name == f"hf:{parrot}"


def test_missing_model_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="no model directory"):
        resolve_backend(f"hf:{tmp_path}/nope")


def test_directory_without_a_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="cannot load a causal LM"):
        resolve_backend(f"hf:{tmp_path}")


def test_tiny_model_build_is_reproducible(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a", seed=3)
    second = build_tiny_model(tmp_path / "b", seed=3)
    other = build_tiny_model(tmp_path / "c", seed=4)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


def test_tiny_chat_template_round_trips_tool_calls_and_masks_assistant(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    call = {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": {}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Refund O-1"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"amount": 100}'},
        {"role": "assistant", "content": "Done."},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert '"name": "lookup_order"' in text and "<tools>" in text
    assert "<tool_call>\n" + '{"name": "lookup_order", "arguments": {}}' + "\n</tool_call>" in text
    # What the model would generate for the first turn is exactly what the history shows.
    prompt = tokenizer.apply_chat_template(
        messages[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    generated = render_tool_call("lookup_order", {}) + "<|im_end|>"
    assert text.startswith(prompt + generated)
    # Trainers can mask everything but the assistant's tokens.
    out = tokenizer.apply_chat_template(
        messages, tools=TOOLS, return_assistant_tokens_mask=True, return_dict=True
    )
    kept = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(kept) == generated + "Done.<|im_end|>"
    # Byte-level BPE: any text survives encode/decode.
    odd = "naïve ☃ 数据 \t\x01"
    assert tokenizer.decode(tokenizer(odd, add_special_tokens=False)["input_ids"]) == odd


async def test_prompt_over_the_context_is_a_per_request_error(hf: HFBackend) -> None:
    limit = hf.model.config.max_position_embeddings
    huge = [{"role": "user", "content": "order " * (limit + 10)}]
    long, fine = await hf.generate([greedy(huge), greedy(PLAIN)])
    assert long.finish_reason == "error" and "does not fit the model's context" in long.error
    assert fine.content == "Hello there."


async def test_shared_prompt_prefix_runs_once_and_finished_rows_leave_the_batch(
    hf: HFBackend,
) -> None:
    requests = [greedy(GOOD), greedy(PLAIN), greedy(BROKEN), greedy(GOOD + GOOD)]
    alone = [(await hf.generate([r]))[0] for r in requests]
    together = await hf.generate(requests)
    stats = hf.last_batch

    # Same answers, token for token, as each request sampled on its own.
    for a, t in zip(alone, together, strict=True):
        assert t.token_ids == a.token_ids
        assert t.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert t.finish_reason == a.finish_reason

    # The system message with the tool list is computed once, not once per row.
    prompts = [
        hf.tokenizer(hf.render_prompt(r), add_special_tokens=False)["input_ids"] for r in requests
    ]
    assert stats.shared_prefix >= 16
    assert all(p[: stats.shared_prefix] == prompts[0][: stats.shared_prefix] for p in prompts)
    widest_tail = max(len(p) for p in prompts) - stats.shared_prefix
    assert stats.prefill_tokens == stats.shared_prefix + len(requests) * widest_tail
    # A row runs one decode step per token after its first: none waits for a longer one.
    lengths = [len(t.token_ids) for t in together]
    assert len(set(lengths)) > 1
    assert stats.decode_rows == sum(n - 1 for n in lengths)
