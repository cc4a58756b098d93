"""The actor's vllm backend against bare vLLM: same model, same chat prompts, same sampling.

`ours` sends a batch of agent-style chat requests (system prompt, tools, one user turn) through
`VLLMBackend.generate` (chat template, async engine, token ids + logprobs, tool-call parsing);
`bare` renders the same prompt ids once and calls `vllm.LLM.generate` with the same
SamplingParams (logprobs included, so the ratio is the backend's own overhead). Each side runs
in a fresh subprocess so neither inherits the other's GPU memory. Also times an in-place
`reload` of the same checkpoint.

Without `--model`, a randomly initialised ~100M-parameter Llama with the tiny chat tokenizer
is written to a temp dir (nothing is downloaded); random weights stop at random lengths, so
tokens/s (not requests/s) is the figure to compare. Exits 0 with a message when there is no
CUDA GPU or vLLM is missing.

Run: `python benchmarks/gpu_actor.py [--model DIR] [--batch 64] [--max-tokens 128]`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rollout.shared.models.base import ChatRequest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} for an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
    for name in ("get_order", "refund", "lookup_customer")
]


def gpu_missing() -> str | None:
    """Why this benchmark cannot run here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'rolloutdev[gpu]')"
    return None


def make_requests(batch: int, max_tokens: int) -> list[ChatRequest]:
    """`batch` agent-style requests, each seeded so both sides sample the same way."""
    return [
        ChatRequest(
            messages=[
                {"role": "system", "content": "You are a support agent. Use the tools."},
                {"role": "user", "content": f"Refund order O-{i} for customer c{i % 7}."},
            ],
            tools=TOOLS,
            temperature=1.0,
            top_p=1.0,
            max_tokens=max_tokens,
            seed=i,
        )
        for i in range(batch)
    ]


def engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """Engine arguments shared by both sides."""
    return {
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_model_len": args.max_model_len,
        "enforce_eager": args.enforce_eager,
        "disable_log_stats": True,
    }


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    """Time VLLMBackend.generate on the batch; also time an in-place reload."""
    from rollout.shared.models.vllm_backend import VLLMBackend

    requests = make_requests(args.batch, args.max_tokens)

    async def main() -> dict[str, Any]:
        backend = VLLMBackend(args.model, engine_args=engine_args(args))
        try:
            started = time.perf_counter()
            await backend.start()
            startup_s = time.perf_counter() - started
            await backend.generate(requests[: min(4, len(requests))])  # warm-up
            seconds, tokens, errors = 0.0, 0, 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                responses = await backend.generate(requests)
                seconds += time.perf_counter() - t0
                tokens += sum(len(r.token_ids or []) for r in responses)
                errors += sum(1 for r in responses if r.error)
            t0 = time.perf_counter()
            await backend.areload(args.model)
            reload_s = time.perf_counter() - t0
            return {
                "side": "ours",
                "requests": len(requests) * args.repeats,
                "tokens": tokens,
                "seconds": seconds,
                "errors": errors,
                "startup_s": startup_s,
                "reload_s": reload_s,
            }
        finally:
            await backend.aclose()

    return asyncio.run(main())


def run_bare(args: argparse.Namespace) -> dict[str, Any]:
    """Time vllm.LLM.generate on the same prompt ids and sampling params."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rollout.shared.models.vllm_backend import (
        eos_token_ids,
        render_prompt_ids,
        sampling_kwargs,
    )

    requests = make_requests(args.batch, args.max_tokens)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    stop_ids = eos_token_ids(tokenizer, args.model)
    prompts = [{"prompt_token_ids": render_prompt_ids(tokenizer, r)} for r in requests]
    params = [
        SamplingParams(**sampling_kwargs(r, max_tokens=args.max_tokens, stop_token_ids=stop_ids))
        for r in requests
    ]
    started = time.perf_counter()
    llm = LLM(model=args.model, **engine_args(args))
    startup_s = time.perf_counter() - started
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    seconds, tokens = 0.0, 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds += time.perf_counter() - t0
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "side": "bare",
        "requests": len(requests) * args.repeats,
        "tokens": tokens,
        "seconds": seconds,
        "errors": 0,
        "startup_s": startup_s,
    }


def build_model(directory: Path) -> Path:
    """A random ~100M-parameter Llama (head_dim 64) with the tiny chat tokenizer."""
    from rollout.shared.models.tiny import build_tiny_model

    return build_tiny_model(directory, hidden_size=1024, layers=8, heads=16, intermediate_size=2816)


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one side in a fresh interpreter and return its JSON result."""
    command = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--model",
        str(args.model),
        "--batch",
        str(args.batch),
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--max-model-len",
        str(args.max_model_len),
    ]
    if args.enforce_eager:
        command.append("--enforce-eager")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
    raise SystemExit(f"the {side} side failed (exit {done.returncode}); its output is above")


def report(results: list[dict[str, Any]]) -> None:
    """Print one row per side and the ours/bare throughput ratio."""
    print(f"{'side':<6} {'requests':>8} {'tokens':>8} {'seconds':>8} {'tok/s':>10} {'startup':>8}")
    rates = {}
    for r in results:
        rate = r["tokens"] / r["seconds"] if r["seconds"] else 0.0
        rates[r["side"]] = rate
        print(
            f"{r['side']:<6} {r['requests']:>8} {r['tokens']:>8} {r['seconds']:>8.2f} "
            f"{rate:>10.0f} {r['startup_s']:>7.1f}s"
        )
    if rates.get("bare"):
        print(f"ratio ours/bare tokens/s: {rates.get('ours', 0.0) / rates['bare']:.3f}")
    for r in results:
        if "reload_s" in r:
            print(f"in-place reload of the same checkpoint: {r['reload_s']:.2f}s")
        if r["errors"]:
            print(f"{r['side']}: {r['errors']} requests failed")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run both sides (or one with --side) and report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="local checkpoint (default: random Llama)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--side", choices=["ours", "bare"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch <= 0 or args.max_tokens <= 0 or args.repeats <= 0:
        parser.error("--batch, --max-tokens and --repeats must be positive")

    reason = gpu_missing()
    if reason:
        print(f"benchmarks/gpu_actor.py needs a CUDA GPU and vLLM: {reason}; nothing measured.")
        return 0
    if args.side:
        result = run_ours(args) if args.side == "ours" else run_bare(args)
        print(json.dumps(result))
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-actor-") as tmp:
        if args.model is None:
            args.model = build_model(Path(tmp) / "model")
        elif not (args.model / "config.json").is_file():
            parser.error(f"--model {args.model}: no config.json there")
        report([run_side("bare", args), run_side("ours", args)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
