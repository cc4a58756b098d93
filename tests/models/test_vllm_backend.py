"""The vllm backend: missing-extra error, config errors and the pure pieces everywhere; the real
engine (batched generation, token ids/logprobs, in-place reload) only on a CUDA machine."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.models import vllm_backend
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.hermes import render_tool_call
from rollout.shared.models.tiny import IM_END, build_tiny_model
from rollout.shared.models.vllm_backend import (
    ENGINE_ARGS_ENV,
    INSTALL_HINT,
    build_response,
    eos_token_ids,
    iter_checkpoint_tensors,
    render_prompt_ids,
    sampled_logprobs,
    sampling_kwargs,
    shape_mismatch,
)

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
TOOL_CALL = render_tool_call("lookup_order", {"order_id": "O-1"})
BROKEN_CALL = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": }\n</tool_call>'


@pytest.fixture(autouse=True)
def _vllm_form_registered() -> None:
    vllm_backend.register()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny, local_files_only=True)


# -- errors that need no GPU --------------------------------------------------------------


def test_missing_vllm_names_the_gpu_extra(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import vllm` fail, as on a machine without the extra.
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(RolloutError) as err:
        resolve_backend(f"vllm:{tiny}")
    assert INSTALL_HINT in str(err.value)
    assert "pip install 'rolloutdev[gpu]'" in str(err.value)


def test_importing_rollout_and_the_backend_module_never_imports_vllm() -> None:
    code = (
        "import sys, rollout, rollout.shared.models, rollout.shared.models.vllm_backend as v; "
        "v.register(); print('vllm' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "False"


def test_vllm_form_is_listed_and_bad_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match=r"vllm:\.\.\. \(e\.g\. vllm:\./models/my-model\)"):
        resolve_backend("nope/model")
    with pytest.raises(RolloutError, match="missing the model directory after 'vllm:'"):
        resolve_backend("vllm:  ")
    with pytest.raises(RolloutError, match="no model directory at"):
        resolve_backend(f"vllm:{tmp_path / 'absent'}")
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(RolloutError, match="no config.json.*LoRA adapter"):
        resolve_backend(f"vllm:{tmp_path}")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [("{not json", "is not valid JSON"), ("[1, 2]", "must be a JSON object")],
)
def test_bad_engine_args_env_is_named(
    raw: str, problem: str, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENGINE_ARGS_ENV, raw)
    with pytest.raises(RolloutError, match=f"{ENGINE_ARGS_ENV} {problem}"):
        resolve_backend(f"vllm:{tiny}")


# -- the pure pieces the engine path is built from ----------------------------------------


def test_prompt_ids_are_the_chat_template_with_tools_and_generation_prompt(tokenizer) -> None:
    ids = render_prompt_ids(tokenizer, ChatRequest(messages=GOOD, tools=TOOLS))
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert "lookup_order" in text and "Look up order O-1" in text


def test_response_parses_tool_calls_and_keeps_the_end_token(tiny: Path, tokenizer) -> None:
    eos = eos_token_ids(tokenizer, tiny)
    end = tokenizer.convert_tokens_to_ids(IM_END)
    assert end in eos

    ids = tokenizer(TOOL_CALL + IM_END, add_special_tokens=False)["input_ids"]
    response = build_response(
        tokenizer,
        prompt_tokens=7,
        token_ids=ids,
        logprobs=[-0.5] * len(ids),
        finish_reason="stop",
        eos_ids=eos,
    )
    assert response.finish_reason == "tool_calls" and response.error is None
    [call] = response.tool_calls
    assert (call.name, call.arguments, call.error) == ("lookup_order", '{"order_id": "O-1"}', None)
    assert response.token_ids == ids and response.token_ids[-1] == end
    assert response.logprobs == [-0.5] * len(ids)
    assert response.usage.model_dump() == {
        "prompt_tokens": 7,
        "completion_tokens": len(ids),
        "total_tokens": 7 + len(ids),
    }

    broken_ids = tokenizer(BROKEN_CALL + IM_END, add_special_tokens=False)["input_ids"]
    broken = build_response(
        tokenizer,
        prompt_tokens=1,
        token_ids=broken_ids,
        logprobs=[0.0] * len(broken_ids),
        finish_reason="stop",
        eos_ids=eos,
    )
    [bad] = broken.tool_calls
    assert bad.name == "lookup_order" and "invalid JSON" in (bad.error or "")

    cut = tokenizer("Hello the", add_special_tokens=False)["input_ids"]
    partial = build_response(
        tokenizer,
        prompt_tokens=1,
        token_ids=cut,
        logprobs=[0.0] * len(cut),
        finish_reason="length",
        eos_ids=eos,
    )
    assert (partial.content, partial.finish_reason) == ("Hello the", "length")

    aborted = build_response(
        tokenizer, prompt_tokens=1, token_ids=[], logprobs=[], finish_reason="abort", eos_ids=eos
    )
    assert aborted.finish_reason == "error" and "aborted" in (aborted.error or "")


@dataclass
class _Logprob:
    """The shape of vllm.logprobs.Logprob (what each per-step map holds)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def test_sampled_logprobs_pick_each_sampled_token() -> None:
    steps = [{5: _Logprob(-0.25, 1)}, {9: _Logprob(-1.5, 3), 2: _Logprob(-0.1, 1)}]
    assert sampled_logprobs(steps, [5, 9]) == [-0.25, -1.5]
    with pytest.raises(ValueError, match="2 logprob steps for 3 tokens"):
        sampled_logprobs(steps, [5, 9, 1])
    with pytest.raises(ValueError, match="no logprobs"):
        sampled_logprobs(None, [5])


def test_sampling_kwargs_mirror_the_request() -> None:
    greedy = sampling_kwargs(
        ChatRequest(messages=PLAIN, temperature=0, top_p=0, seed=3),
        max_tokens=40,
        stop_token_ids=[2],
    )
    assert greedy == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 40,
        "seed": 3,
        "logprobs": 0,
        "stop_token_ids": [2],
        "detokenize": False,
    }
    nucleus = sampling_kwargs(
        ChatRequest(messages=PLAIN, temperature=0.7, top_p=0.9), max_tokens=8, stop_token_ids=[]
    )
    assert (nucleus["temperature"], nucleus["top_p"], nucleus["seed"]) == (0.7, 0.9, None)


def test_checkpoint_tensors_are_what_the_model_saved(tiny: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True).state_dict()
    loaded = dict(iter_checkpoint_tensors(tiny))
    # Tied embeddings are saved once; every saved tensor matches the model's parameter.
    assert loaded and set(loaded) <= set(saved)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, saved[name]), name
    with pytest.raises(FileNotFoundError):
        list(iter_checkpoint_tensors(tiny.parent))


def test_shape_mismatch_detects_a_different_architecture(tiny: Path, tmp_path: Path) -> None:
    assert shape_mismatch(tiny, tiny) == []
    config = json.loads((tiny / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    assert shape_mismatch(tiny, tmp_path) == ["hidden_size"]


# -- the real engine (CUDA + vllm only) ---------------------------------------------------


def _gpu_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


gpu = pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA GPU and vllm")
ENGINE_ARGS = {"gpu_memory_utilization": 0.3, "enforce_eager": True, "max_model_len": 512}


def _lessons(plain_answer: str):
    from fakes.trained_tiny import Lesson

    # Same completions in the same order for both parrots: same tokenizer, same shapes.
    return [
        Lesson(GOOD, TOOL_CALL, TOOLS),
        Lesson(BROKEN, BROKEN_CALL, TOOLS),
        Lesson(PLAIN, plain_answer, TOOLS),
    ]


@pytest.fixture(scope="module")
def parrot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fakes.trained_tiny import train_parrot

    return train_parrot(tmp_path_factory.mktemp("parrot"), _lessons("Hello there."))


@pytest.fixture(scope="module")
def engine(parrot: Path):
    backend = vllm_backend.VLLMBackend(parrot, engine_args=ENGINE_ARGS, max_new_tokens=64)
    yield backend
    backend.close()


def greedy(messages, **kwargs) -> ChatRequest:
    return ChatRequest(messages=messages, tools=TOOLS, temperature=0, **kwargs)


@gpu
@pytest.mark.gpu
async def test_engine_batch_parses_tool_calls_plain_answers_and_malformed_calls(engine) -> None:
    good, broken, plain = await engine.generate([greedy(GOOD), greedy(BROKEN), greedy(PLAIN)])

    assert good.finish_reason == "tool_calls" and good.error is None
    [call] = good.tool_calls
    assert (call.name, call.arguments, call.error) == ("lookup_order", '{"order_id": "O-1"}', None)
    [bad] = broken.tool_calls
    assert bad.error is not None and "invalid JSON" in bad.error
    assert plain.content == "Hello there." and plain.finish_reason == "stop"


@gpu
@pytest.mark.gpu
async def test_engine_ids_and_logprobs_match_the_hf_backend(engine, parrot: Path) -> None:
    from rollout.shared.models.hf import HFBackend

    [ours] = await engine.generate([greedy(GOOD)])
    [ref] = await HFBackend(parrot, device="cpu", max_new_tokens=64).generate([greedy(GOOD)])
    assert ours.token_ids == ref.token_ids
    assert ours.token_ids[-1] == engine.tokenizer.convert_tokens_to_ids(IM_END)
    assert len(ours.logprobs) == len(ours.token_ids) == ours.usage.completion_tokens
    # vLLM runs the float32 checkpoint in 16-bit: close, not equal.
    assert max(abs(a - b) for a, b in zip(ours.logprobs, ref.logprobs, strict=True)) < 0.15


@gpu
@pytest.mark.gpu
async def test_engine_seeded_sampling_repeats_and_long_prompts_fail_alone(engine) -> None:
    sampled = ChatRequest(messages=PLAIN, tools=TOOLS, temperature=1.0, seed=7, max_tokens=16)
    first, second = await engine.generate([sampled, sampled])
    assert first.token_ids == second.token_ids and len(first.logprobs) == len(first.token_ids)
    assert all(lp <= 0 for lp in first.logprobs)

    huge = [{"role": "user", "content": "order " * 2000}]
    too_long, fine = await engine.generate([greedy(huge), greedy(PLAIN)])
    assert too_long.finish_reason == "error" and "does not fit" in (too_long.error or "")
    assert too_long.rejected
    assert fine.content == "Hello there."


@gpu
@pytest.mark.gpu
async def test_engine_reloads_a_new_policy_in_place(
    engine, parrot: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from fakes.trained_tiny import train_parrot

    newer = train_parrot(tmp_path_factory.mktemp("newer"), _lessons("Goodbye now."))
    before = engine._engine
    try:
        # Batches in flight while the reload lands finish; later ones see the new weights.
        busy = asyncio.create_task(engine.generate([greedy(GOOD)] * 8))
        await engine.areload(newer)
        assert all(r.error is None for r in await busy)
        [plain] = await engine.generate([greedy(PLAIN)])
        assert plain.content == "Goodbye now."
        assert engine._engine is before  # same engine, weights swapped in place
        assert engine.name == f"vllm:{newer}"
    finally:
        engine.reload(parrot)
    [plain] = await engine.generate([greedy(PLAIN)])
    assert plain.content == "Hello there."
