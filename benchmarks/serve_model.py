"""`rollout serve-model` throughput: concurrent OpenAI-client requests batched by the server.

Measured in one process on a seeded tiny model (CPU, one thread), with 64 fixed-length
requests (max_tokens, no early stop):
- baseline: the same requests straight to the backend, `generate` on batches of `--batch`
  (no HTTP, no server): the ceiling the server can approach;
- served, batched: the requests sent concurrently by the official `openai` client to a server
  that samples up to `--batch` together;
- served, one at a time: the same server with `--max-batch 1`.
Prints requests/s and the ratios.

    python benchmarks/serve_model.py [--requests 64] [--batch 16] [--tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from rollout.services.inference.server import serving
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.tiny import build_tiny_model
from rollout.shared.service.sockets import bind


def _prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Refund order O-{i} in full"}]


async def _direct(path: Path, n: int, batch: int, tokens: int) -> float:
    backend = HFBackend(path, max_new_tokens=tokens, max_batch_size=batch)
    requests = [
        ChatRequest(messages=_prompt(i), max_tokens=tokens, temperature=1.0, seed=i)
        for i in range(n)
    ]
    start = time.perf_counter()
    await backend.generate(requests)
    return n / (time.perf_counter() - start)


async def _served(path: Path, n: int, batch: int, tokens: int) -> float:
    backend = HFBackend(path, max_new_tokens=tokens, max_batch_size=batch)
    async with serving(backend, bind("127.0.0.1", 0), name="tiny", max_batch=batch) as running:
        client = AsyncOpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
        start = time.perf_counter()
        await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="tiny", messages=_prompt(i), max_tokens=tokens, seed=i
                )
                for i in range(n)
            )
        )
        rate = n / (time.perf_counter() - start)
        print(f"  max_batch={batch}: {n} requests in {running.policy.slot.batches} batches")
        await client.close()
    return rate


async def main() -> None:
    """Run the three measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("ROLLOUT_HF_DEVICE", "cpu")
    os.environ.setdefault("ROLLOUT_HF_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "tiny", seed=0, corpus=["Refund order O-1 in full"])
        # A huge eos-free budget is not needed: every request runs to max_tokens or stops.
        direct = await _direct(path, args.requests, args.batch, args.tokens)
        batched = await _served(path, args.requests, args.batch, args.tokens)
        single = await _served(path, args.requests, 1, args.tokens)
    print(f"requests={args.requests} batch={args.batch} max_tokens={args.tokens}")
    print(f"baseline (backend.generate, batches of {args.batch}): {direct:8.1f} req/s")
    print(f"served, batched (openai client, concurrent):  {batched:8.1f} req/s")
    print(f"served, one at a time (--max-batch 1):        {single:8.1f} req/s")
    print(f"served batched / baseline:  {batched / direct:.2f}")
    print(f"served batched / one at a time: {batched / single:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
