"""A local inference server speaking the part of vLLM's API an actor pool uses.

vLLM needs a GPU and cannot be installed here, so this stands in for `vllm serve BASE
--enable-lora` (the edge we cannot run): a real transformers model with real peft adapters
behind real HTTP (uvicorn), answering

- `POST /v1/load_lora_adapter` {lora_name, lora_path} / `POST /v1/unload_lora_adapter`
  {lora_name} (vLLM's runtime LoRA updating: 400 "already been loaded", 404 unknown name);
- `POST /v1/completions` with a token-id prompt, `logprobs`, `return_token_ids`, `seed`,
  `stop` + `include_stop_str_in_output`: token ids and the logprobs of the sampled tokens
  under the raw logits, as vLLM returns them;
- `GET /v1/models`.

`proof="engine"`: the server itself says which weights answered (`x-rollout-weights-sha256`
of the adapter it actually generated with); `proof="middleware"`: the production
`WeightsProof` ASGI middleware wraps the app, as `vllm serve --middleware` would; `None`: no
proof. `stale=True`: a server that acknowledges every load after the first (naming the digest of
the files it was asked to load) but keeps serving the first adapter under the new names (an
engine caching adapters), while its completions say which weights really answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from rollout.shared.models.server_proof import WeightsProof
from rollout.shared.models.weights_proof import HEADER, LOAD_FIELD, weights_digest


@dataclass
class _Adapter:
    peft_name: str
    digest: str


@dataclass
class FakeVLLM:
    """The server's state: the base, loaded adapters, what it was asked."""

    base_dir: Path
    served_name: str = "base"
    stale: bool = False
    proof: str | None = "engine"
    adapters: dict[str, _Adapter] = field(default_factory=dict)
    loads: list[dict[str, Any]] = field(default_factory=list)
    unloads: list[str] = field(default_factory=list)
    completions: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    def __post_init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.base_dir)
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            self.base_dir, dtype=torch.float32
        ).eval()
        self._lock = threading.Lock()
        self._count = 0

    # -- handlers ---------------------------------------------------------------------------

    async def load(self, request: Request) -> Response:
        body = await request.json()
        self.loads.append(body)
        name, path = body.get("lora_name"), body.get("lora_path")
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.")
        if not await asyncio.to_thread(Path(str(path)).is_dir):
            return _error(404, f"No adapter found at {path}")
        with self._lock:
            if self.stale and self.adapters:
                # Acknowledged as the files asked for, but the first adapter goes on answering
                # under the new name.
                self.adapters[name] = next(iter(self.adapters.values()))
                claimed = weights_digest(Path(str(path)))
                headers = {HEADER: claimed} if self.proof == "engine" else {}
            else:
                self.adapters[name] = self._load_peft(Path(str(path)))
                headers = self._proof_headers(name)
        return PlainTextResponse(
            f"Success: LoRA adapter '{name}' added successfully.", headers=headers
        )

    def _load_peft(self, path: Path) -> _Adapter:
        from peft import PeftModel

        self._count += 1
        peft_name = f"a{self._count}"
        if not hasattr(self.model, "peft_config"):
            self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=peft_name)
        else:
            self.model.load_adapter(str(path), adapter_name=peft_name)
        self.model.eval()
        return _Adapter(peft_name, weights_digest(path))

    async def unload(self, request: Request) -> Response:
        body = await request.json()
        name = body.get("lora_name")
        if name not in self.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.")
        self.unloads.append(name)
        del self.adapters[name]
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def models(self, request: Request) -> Response:
        names = [self.served_name, *self.adapters]
        return JSONResponse({"object": "list", "data": [{"id": n} for n in names]})

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        self.completions.append(body)
        name = body.get("model")
        if name != self.served_name and name not in self.adapters:
            return _error(404, f"The model `{name}` does not exist.")
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return _error(400, "this test server takes token-id prompts only")
        with self._lock:
            ids, logprobs, reason = self._sample(name, prompt, body)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "finish_reason": reason,
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": logprobs,
            },
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                 "total_tokens": len(prompt) + len(ids)}  # fmt: skip
        document = {"id": "cmpl-1", "object": "text_completion", "model": name,
                    "choices": [choice], "usage": usage}  # fmt: skip
        return JSONResponse(document, headers=self._proof_headers(name))

    def _proof_headers(self, name: str) -> dict[str, str]:
        adapter = self.adapters.get(name)
        if self.proof != "engine" or adapter is None:
            return {}
        return {HEADER: adapter.digest}

    # -- sampling ---------------------------------------------------------------------------

    def _sample(self, name: str, prompt: list[int], body: dict[str, Any]) -> tuple:
        import torch

        adapter = self.adapters.get(name)
        context = contextlib.nullcontext()
        if adapter is not None:
            self.model.set_adapter(adapter.peft_name)
        elif hasattr(self.model, "disable_adapter"):
            context = self.model.disable_adapter()
        temperature = float(body.get("temperature", 1.0))
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        stops = list(body.get("stop") or [])
        eos = self.tokenizer.eos_token_id
        ids: list[int] = []
        logprobs: list[float] = []
        reason = "length"
        with torch.inference_mode(), context:
            sequence = list(prompt)
            for _ in range(int(body.get("max_tokens") or 16)):
                logits = self.model(input_ids=torch.tensor([sequence])).logits[0, -1].float()
                logp = torch.log_softmax(logits, dim=-1)
                if temperature <= 0:
                    token = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                ids.append(token)
                logprobs.append(float(logp[token]))
                sequence.append(token)
                if token == eos:
                    reason = "stop"
                    break
                text = self.tokenizer.decode(ids, skip_special_tokens=False)
                if any(s in text for s in stops):
                    reason = "stop"
                    break
        return ids, logprobs, reason

    # -- the app ----------------------------------------------------------------------------

    def app(self) -> Any:
        """The ASGI app (wrapped in the production proof middleware when asked)."""
        app = Starlette(
            routes=[
                Route("/v1/load_lora_adapter", self.load, methods=["POST"]),
                Route("/v1/unload_lora_adapter", self.unload, methods=["POST"]),
                Route("/v1/completions", self.complete, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )
        return WeightsProof(app) if self.proof == "middleware" else app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


@contextlib.contextmanager
def serving(server: FakeVLLM) -> Iterator[FakeVLLM]:
    """Run `server` on a free loopback port (uvicorn in a thread) until the block ends."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before uvicorn runs: a client that connects first waits in the backlog.
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.app(), log_level="warning", lifespan="off")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    server.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield server
    finally:
        runner.should_exit = True
        thread.join(timeout=10)
        sock.close()


__all__ = ["LOAD_FIELD", "FakeVLLM", "serving"]
