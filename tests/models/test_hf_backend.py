"""The hf backend on the tiny model: batched generation, token ids/logprobs, tool calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fakes.trained_tiny import Lesson, train_parrot

from rollout.errors import RolloutError
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.hermes import render_tool_call
from rollout.shared.models.hf import (
    CPU_BATCH_ROWS,
    MAX_GPU_ROWS,
    HFBackend,
    kv_bytes_per_token,
    rows_that_fit,
)
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


# The CPU unless ROLLOUT_TEST_DEVICE names another (cuda: the same checks on the GPU).
DEVICE = os.environ.get("ROLLOUT_TEST_DEVICE", "cpu")


@pytest.fixture(scope="module")
def hf(parrot: Path) -> HFBackend:
    # float32 on every device: these checks compare against fresh forwards to 1e-4, which a
    # bf16 KV cache does not hold (test_bf16_weights_sample_with_float32_logprobs runs bf16).
    return HFBackend(parrot, max_new_tokens=64, device=DEVICE, dtype="float32")


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


def test_a_missing_model_directory_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    # The actors' model check waits 5 s on a build: a cold torch and transformers took longer
    # on a busy machine, so a missing folder passed as a model still loading.
    probe = (
        "import sys\n"
        "from rollout.errors import RolloutError\n"
        "from rollout.shared.models.catalog import resolve_backend\n"
        "try:\n"
        f"    resolve_backend('hf:{tmp_path}/nope')\n"
        "except RolloutError as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    said, imported = done.stdout.strip().splitlines()
    assert f"no model directory at {tmp_path}/nope" in said
    assert imported == "[]"


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
    # Refused for what it holds: the agent loop judges an episode that grew into this.
    assert long.rejected and not fine.rejected
    assert fine.content == "Hello there."


async def test_a_prompt_the_tokenizer_refuses_is_a_per_request_error(hf: HFBackend) -> None:
    # Text cut mid-emoji (a JavaScript slice) reaches JSON as a lone surrogate; the tokenizer's
    # TypeError failed the whole batch, so every request sampled beside it errored too.
    cut = [{"role": "user", "content": "refund \ud83d"}]
    bad, fine = await hf.generate([greedy(cut), greedy(PLAIN)])
    assert bad.finish_reason == "error" and "cannot tokenize the prompt" in bad.error
    assert bad.rejected and not fine.rejected
    assert fine.content == "Hello there."


async def test_a_call_nested_past_the_recursion_limit_in_the_history_is_kept_as_text(
    hf: HFBackend,
) -> None:
    # The loop refuses such a call; its text stays in the conversation, which is rendered
    # again each turn: json.loads raised RecursionError there, and the chat template "failed".
    deep = "[" * 5000 + "]" * 5000
    call = {"id": "c0", "type": "function", "function": {"name": "lookup_order", "arguments": deep}}
    history = [
        *PLAIN,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"error": "nested too deep"}'},
    ]
    odd, fine = await hf.generate([greedy(history, max_tokens=4), greedy(PLAIN)])
    # Rendered with the text as it is (refused for its length alone, past this tiny context).
    assert fine.content == "Hello there." and "does not fit" in (odd.error or ""), odd.error


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


def sampled(messages, seed: int | None, **kwargs) -> ChatRequest:
    return ChatRequest(messages=messages, tools=TOOLS, seed=seed, **kwargs)


def argmax_decode(hf: HFBackend, request: ChatRequest, steps: int) -> list[int]:
    # The reference: a fresh full forward per token, always the highest logit.
    prompt = hf.tokenizer(hf.render_prompt(request), add_special_tokens=False)["input_ids"]
    eos = hf.tokenizer.convert_tokens_to_ids("<|im_end|>")
    out: list[int] = []
    with torch.no_grad():
        while len(out) < steps and eos not in out:
            ids = torch.tensor([prompt + out], device=hf.model.device)
            out.append(int(hf.model(input_ids=ids).logits[0, -1].argmax()))
    return out


async def test_a_seeded_request_samples_the_same_tokens_whatever_shares_its_batch(
    hf: HFBackend,
) -> None:
    hot = sampled(PLAIN, seed=7, temperature=2.5, max_tokens=16)
    nucleus = sampled(GOOD, seed=11, temperature=2.0, top_p=0.9, max_tokens=16)
    [alone] = await hf.generate([hot])
    [nucleus_alone] = await hf.generate([nucleus])
    batch = await hf.generate(
        [
            sampled(GOOD, seed=1, temperature=1.5, max_tokens=5),
            hot,
            sampled(BROKEN, seed=None, temperature=0.8, max_tokens=20),
            greedy(PLAIN),
            nucleus,
        ]
    )
    reordered = await hf.generate([nucleus, greedy(GOOD + GOOD), hot])
    for response in (batch[1], reordered[2]):
        assert response.token_ids == alone.token_ids
        assert response.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    for response in (batch[4], reordered[0]):
        assert response.token_ids == nucleus_alone.token_ids
    # The seed is what decides: at this temperature another seed writes something else.
    [other] = await hf.generate([hot.model_copy(update={"seed": 8})])
    assert other.token_ids != alone.token_ids


async def test_greedy_rows_are_argmax_decoding_beside_sampled_rows(hf: HFBackend) -> None:
    requests = [
        sampled(PLAIN, seed=3, temperature=2.0, max_tokens=12),
        greedy(GOOD, max_tokens=12),
        sampled(BROKEN, seed=4, temperature=1.0, top_p=0.5, max_tokens=12),
        greedy(BROKEN, max_tokens=12),
    ]
    responses = await hf.generate(requests)
    for k in (1, 3):
        assert responses[k].token_ids == argmax_decode(hf, requests[k], 12)


async def test_a_tiny_top_p_keeps_only_the_argmax_token(hf: HFBackend) -> None:
    requests = [sampled(m, seed=5, temperature=3.0, top_p=1e-6) for m in (GOOD, PLAIN)]
    narrow = await hf.generate(requests)
    plain = await hf.generate([greedy(GOOD), greedy(PLAIN)])
    for n, g in zip(narrow, plain, strict=True):
        assert n.token_ids == g.token_ids
        assert n.logprobs == pytest.approx(g.logprobs, abs=1e-4)


def test_rows_that_fit_counts_kv_cache_rows_in_free_memory() -> None:
    from transformers import LlamaConfig

    # A Llama-3-8B shape: 32 layers x (k, v) x 8 kv heads x 128 dims x 2 bytes (bf16).
    llama8b = LlamaConfig(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8
    )
    per_token = kv_bytes_per_token(llama8b, 2)
    assert per_token == 32 * 2 * 8 * 128 * 2 == 128 * 1024
    # 4096 tokens a row: 512 MiB; 40 GiB holds 80 rows.
    assert rows_that_fit(40 * 2**30, per_token, 4096, cap=256) == 80
    assert rows_that_fit(40 * 2**30 - 1, per_token, 4096, cap=256) == 79
    # Capped, and never below one row.
    assert rows_that_fit(10**15, per_token, 4096, cap=256) == 256
    assert rows_that_fit(0, per_token, 4096, cap=256) == 1
    # No head_dim in the config: hidden size over attention heads.
    smollm = LlamaConfig(
        num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3
    )
    assert kv_bytes_per_token(smollm, 4) == 30 * 2 * 3 * 64 * 4


def test_batch_rows_default_to_the_cpu_size_or_what_fits_the_gpu(
    hf: HFBackend, parrot: Path
) -> None:
    assert hf.max_batch_size is None
    rows = hf._batch_rows(1024)
    if DEVICE.startswith("cuda"):
        assert 1 <= rows <= MAX_GPU_ROWS
    else:
        assert rows == CPU_BATCH_ROWS
    # An explicit size keeps its meaning on every device.
    assert HFBackend(parrot, device=DEVICE, max_batch_size=3)._batch_rows(1024) == 3


def test_default_dtype_is_float32_off_cuda_and_native_bf16_on_it(parrot: Path) -> None:
    backend = HFBackend(parrot, device=DEVICE)
    native_bf16 = DEVICE.startswith("cuda") and torch.cuda.is_bf16_supported(
        including_emulation=False
    )
    assert backend.model.dtype == (torch.bfloat16 if native_bf16 else torch.float32)


def test_an_unknown_rollout_hf_dtype_is_refused(
    parrot: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_HF_DTYPE", "float8")
    with pytest.raises(RolloutError) as refused:
        HFBackend(parrot, device=DEVICE)
    message = str(refused.value)
    assert "ROLLOUT_HF_DTYPE" in message and "'float8'" in message
    assert "float32, bfloat16, float16, auto" in message


async def test_bf16_weights_sample_with_float32_logprobs(
    parrot: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The variable wins over the argument, as ROLLOUT_HF_THREADS does.
    monkeypatch.setenv("ROLLOUT_HF_DTYPE", "bfloat16")
    backend = HFBackend(parrot, max_new_tokens=24, device=DEVICE, dtype="float32")
    assert backend.model.dtype == torch.bfloat16
    request = greedy(PLAIN)
    [response] = await backend.generate([request])
    assert response.token_ids and len(response.logprobs) == len(response.token_ids)
    # Re-scored from the bf16 model's logits upcast to float32: close (a bf16 KV cache
    # rounds differently from one full pass), and not rounded to bf16's 8 bits.
    prompt = backend.tokenizer(backend.render_prompt(request), add_special_tokens=False)
    full = torch.tensor([prompt["input_ids"] + response.token_ids], device=backend.model.device)
    with torch.no_grad():
        logits = backend.model(input_ids=full).logits[0].float()
    scored = torch.log_softmax(logits, dim=-1)
    start = len(prompt["input_ids"]) - 1
    expected = [float(scored[start + k, t]) for k, t in enumerate(response.token_ids)]
    assert response.logprobs == pytest.approx(expected, abs=0.1)
    assert any(float(torch.tensor(lp).bfloat16()) != lp for lp in response.logprobs)


async def test_a_batch_out_of_device_memory_is_sampled_again_in_halves(
    hf: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    requests = [greedy(GOOD, max_tokens=8) for _ in range(5)] + [greedy(PLAIN, max_tokens=8)]
    expected = await hf.generate(requests)
    sample = hf._sample_batch

    def tight(batch, *args, **kwargs):
        # A device that holds two rows at a time.
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return sample(batch, *args, **kwargs)

    monkeypatch.setattr(hf, "_sample_batch", tight)
    splits = hf.oom_splits
    got = await hf.generate(requests)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert hf.oom_splits > splits

    def none_fit(batch, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(hf, "_sample_batch", none_fit)
    failed = await hf.generate(requests[:2])
    assert all(r.finish_reason == "error" and "out of device memory" in r.error for r in failed)
