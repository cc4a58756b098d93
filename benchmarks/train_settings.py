"""Which CPU training settings pay for `local/smollm2-135m`: measured, not assumed.

One LoRA training step (r=16 on every linear layer, as `train_defaults` sets it: forward,
backward, AdamW) on the same batch of chat-length rows, under each setting:

- `fp32`: float32 weights and activations (the default; the baseline of every ratio);
- `bf16-autocast`: float32 weights, the forward under `torch.autocast("cpu", bfloat16)` (what
  TrainingArguments(bf16=True) does on a CPU);
- `grad-ckpt`: float32 with gradient checkpointing (activations recomputed in the backward);
- `threads-N`: float32 with N intra-op threads instead of one.

Variants run interleaved, `--repeats` times each (the box is shared and noisy); medians of
tokens/s and each one's ratio to fp32 are printed. Run: `python benchmarks/train_settings.py
[--batch 4] [--seq-len 256] [--repeats 3] [--skip bf16-autocast] [--json]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rollout.shared.learning.config import TrainConfig
from rollout.shared.learning.loading import load_base, quiet_libraries
from rollout.shared.learning.trl_job import lora_config
from rollout.shared.models.local_models import train_defaults
from rollout.shared.models.smollm2 import NAME, ensure_smollm2


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build(seq_len: int, batch: int) -> tuple[Any, dict[str, Any], Any]:
    """The LoRA-wrapped model, one batch of `batch` x `seq_len` tokens, and its optimizer."""
    from peft import get_peft_model

    quiet_libraries()
    tokenizer, model = load_base(ensure_smollm2())
    config = TrainConfig(method="sft", **train_defaults(NAME))
    model = get_peft_model(model, lora_config(config))
    model.train()
    # Real text, not random ids: a ticket-routing chat repeated to the row length.
    text = (
        "<|im_start|>system\nYou route support tickets. Call route_ticket with a team.<|im_end|>\n"
        '<|im_start|>user\nRoute this ticket from Alice: "I was charged twice."<|im_end|>\n'
        '<|im_start|>assistant\n<tool_call>{"name": "route_ticket", "arguments": '
        '{"team": "billing"}}</tool_call><|im_end|>\n'
    )
    ids = tokenizer(text * 64, add_special_tokens=False, return_tensors="pt")["input_ids"]
    ids = ids[:, :seq_len].repeat(batch, 1)
    rows = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    params = [p for p in model.parameters() if p.requires_grad]
    return model, rows, torch.optim.AdamW(params, lr=1e-4)


def step_fn(model: Any, rows: dict[str, Any], opt: Any, setting: str) -> Callable[[], float]:
    """A function doing one step under `setting`, returning its tokens/s."""
    tokens = rows["input_ids"].numel()
    threads = int(setting.split("-")[1]) if setting.startswith("threads-") else 1

    def run() -> float:
        if setting == "grad-ckpt":
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            model.enable_input_require_grads()
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if setting == "bf16-autocast"
            else contextlib.nullcontext()
        )
        try:
            with _threads(threads):
                started = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with autocast:
                    loss = model(**rows).loss
                loss.float().backward()
                opt.step()
                elapsed = time.perf_counter() - started
        finally:
            if setting == "grad-ckpt":
                model.gradient_checkpointing_disable()
        if not torch.isfinite(loss):
            raise RuntimeError(f"{setting}: loss is not finite ({loss.item()})")
        return tokens / elapsed

    return run


def main() -> None:
    """Measure every setting interleaved and print tokens/s and ratios to fp32."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-threads", type=int, default=2)
    parser.add_argument(
        "--skip", action="append", default=[], help="a setting to leave out (repeatable)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = ["fp32", "bf16-autocast", "grad-ckpt"] + [
        f"threads-{n}" for n in range(2, args.max_threads + 1)
    ]
    unknown = sorted(set(args.skip) - set(settings) | ({"fp32"} & set(args.skip)))
    if unknown:
        parser.error(f"--skip: {', '.join(unknown)} is not a setting that can be left out")
    settings = [s for s in settings if s not in args.skip]
    model, rows, opt = build(args.seq_len, args.batch)
    steps = {s: step_fn(model, rows, opt, s) for s in settings}
    for s in settings:  # warm-up: first calls pay allocation and kernel selection
        steps[s]()
    tps: dict[str, list[float]] = {s: [] for s in settings}
    for round_ in range(args.repeats):
        for s in settings:
            tps[s].append(steps[s]())
            # Each measurement as it lands: a slow shared box may not reach the summary.
            print(f"round {round_ + 1} {s}: {tps[s][-1]:.1f} tokens/s", file=sys.stderr, flush=True)
    base = statistics.median(tps["fp32"])
    results: dict[str, Any] = {
        "model": NAME,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "settings": {
            s: {
                "tokens_per_s": statistics.median(v),
                "ratio_to_fp32": statistics.median(v) / base,
            }
            for s, v in tps.items()
        },
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{NAME}: LoRA step on {args.batch}x{args.seq_len} tokens, medians of {args.repeats}")
    for s, r in results["settings"].items():
        print(f"  {s:<14} {r['tokens_per_s']:8.1f} tokens/s  x{r['ratio_to_fp32']:.2f} of fp32")


if __name__ == "__main__":
    main()
