"""`hf:<path>`: a local transformers causal LM, batched sampling with token ids and logprobs.

Prompts are rendered with the tokenizer's chat template (tools included); tool calls are read
back from Hermes-style `<tool_call>{json}</tool_call>` blocks. Sampling is our own small loop
over the KV cache rather than `model.generate`, so each request in a batch keeps its own
temperature, top_p, max_tokens and seed. `ROLLOUT_HF_DEVICE` picks the device (default: cuda
when available) and `ROLLOUT_HF_THREADS` torch's intra-op thread count (else the `threads`
argument, which local models set to what was measured fastest). The logprobs returned are
those of the sampled tokens under the model itself (log-softmax of the raw logits, before
temperature/top_p), which is what policy-gradient training needs. Nothing is ever downloaded.

A folder holding a LoRA adapter (`adapter_config.json`) loads onto the base it recorded
(`rollout_adapter.json`) without merging; `reload` with another adapter of the same base swaps
adapters and keeps the base weights loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ChatRequest, ChatResponse, Usage
from rollout.shared.models.hermes import CLOSE_TAG, parse_tool_calls
from rollout.shared.models.local_models import adapter_base, base_dir, is_adapter

DEFAULT_MAX_NEW_TOKENS = 512
# A shared prompt prefix shorter than this is not worth its own forward pass.
MIN_SHARED_PREFIX = 16


@dataclass
class BatchStats:
    """What the last sampled batch fed the model: the shared prefix, prompt and decode rows."""

    rows: int = 0
    shared_prefix: int = 0
    prefill_tokens: int = 0
    decode_rows: int = 0


class TokenListener(Protocol):
    """Hears one request's tokens as they are sampled (called from the generation thread)."""

    cancelled: bool

    def on_token(self, token_id: int) -> None:
        """One more sampled token id."""


class HFBackend:
    """A transformers model loaded from a local directory (or the local HF cache)."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_batch_size: int = 16,
        threads: int | None = None,
        name: str | None = None,
        stop_after_tool_call: bool = False,
    ) -> None:
        self.path = str(path)
        self.name = name or f"hf:{self.path}"
        self.threads = threads
        self.last_batch = BatchStats()
        # End a turn at `</tool_call>` (for models that otherwise write the tool's reply).
        self.stop_after_tool_call = stop_after_tool_call
        # The base reference of the loaded adapter (None: plain weights).
        self.adapter_base: str | None = None
        self._adapters = 0
        self.max_new_tokens = max_new_tokens
        self.max_batch_size = max(1, max_batch_size)
        self.device = device or os.environ.get("ROLLOUT_HF_DEVICE") or _default_device()
        self.dtype = dtype
        # torch is not re-entrant across threads for one model; batches go one at a time.
        # Re-entrant: a trained policy swaps weights and their digest under one hold.
        self._lock = threading.RLock()
        self._rng = random.Random()
        self.tokenizer, self.model = self._load(self.path)

    def __repr__(self) -> str:
        return f"HFBackend({self.path!r}, device={self.device!r})"

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """Generate for every request (in chunks of `max_batch_size`), off the event loop."""
        if not requests:
            return []
        return await asyncio.to_thread(self._generate_all, list(requests))

    async def generate_streaming(
        self, requests: list[ChatRequest], listeners: list[TokenListener | None]
    ) -> list[ChatResponse]:
        """`generate`, telling each request's listener every token as it is sampled.

        A listener that is `cancelled` (its client went away) ends its request at the next
        step, with finish reason "cancelled"; the rest of the batch goes on.
        """
        if len(listeners) != len(requests):
            raise RolloutError(f"{len(listeners)} listeners for {len(requests)} requests")
        if not requests:
            return []
        return await asyncio.to_thread(self._generate_all, list(requests), list(listeners))

    def reload(self, path: str | Path) -> None:
        """Swap in the weights (and tokenizer) saved at `path`, e.g. a new policy version."""
        target = Path(str(path))
        if (
            self.adapter_base is not None
            and is_adapter(target)
            and adapter_base(target) == self.adapter_base
        ):
            self._swap_adapter(target)
        else:
            tokenizer, model = self._load(str(path))
            with self._lock:
                self.tokenizer, self.model = tokenizer, model
        with self._lock:
            self.path = str(path)
            self.name = f"hf:{self.path}"

    def _swap_adapter(self, path: Path) -> None:
        # Same base: load the new adapter beside the old one, switch, drop the old one.
        self._adapters += 1
        name = f"policy_{self._adapters}"
        with self._lock:
            old = self.model.active_adapter
            self.model.load_adapter(str(path), adapter_name=name)
            self.model.set_adapter(name)
            self.model.delete_adapter(old)
            self.model.eval()

    async def aclose(self) -> None:
        """Drop the weights."""
        with self._lock:
            self.model = None  # type: ignore[assignment]

    # -- loading -----------------------------------------------------------------------

    def _load(self, path: str) -> tuple[Any, Any]:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise RolloutError(
                f"hf:{path}: the hf backend needs torch and transformers "
                f"(pip install 'rolloutdev[train]'): {exc}"
            ) from None
        from transformers.utils import logging as hf_logging

        # Per-shard progress bars are noise in CLI output and service logs.
        hf_logging.disable_progress_bar()
        local = Path(path).expanduser()
        if not local.exists() and path.startswith((".", "/", "~")):
            raise RolloutError(f"hf:{path}: no model directory at {local}")
        source = str(local) if local.exists() else path

        adapter = local.exists() and is_adapter(local)
        base_ref = adapter_base(local) if adapter else None
        weights = str(base_dir(base_ref)) if base_ref is not None else source
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            dtype = self.dtype or ("auto" if self.device.startswith("cuda") else "float32")
            model = AutoModelForCausalLM.from_pretrained(
                weights, local_files_only=True, dtype=_torch_dtype(torch, dtype)
            )
            if adapter:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, source, adapter_name="policy_0")
        except (OSError, ValueError, KeyError) as exc:
            raise RolloutError(
                f"hf:{path}: cannot load a causal LM from {source} (hf: loads local "
                f"models only; nothing is downloaded): {str(exc).splitlines()[0]}"
            ) from None
        if not getattr(tokenizer, "chat_template", None):
            raise RolloutError(f"hf:{path}: the tokenizer has no chat template")
        if tokenizer.pad_token_id is None:
            # Left padding needs some pad id; it is always masked out.
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.adapter_base = base_ref
        threads = os.environ.get("ROLLOUT_HF_THREADS", "").strip() or str(self.threads or "")
        if threads:
            # Small models on a few shared cores run faster with fewer intra-op threads.
            try:
                torch.set_num_threads(max(1, int(threads)))
            except ValueError:
                raise RolloutError(
                    f"ROLLOUT_HF_THREADS must be an integer, got {threads!r}"
                ) from None
        model.to(self.device)
        model.eval()
        return tokenizer, model

    # -- generation --------------------------------------------------------------------

    def _generate_all(
        self, requests: list[ChatRequest], listeners: list[TokenListener | None] | None = None
    ) -> list[ChatResponse]:
        with self._lock:
            if self.model is None:
                raise RolloutError(f"{self.name}: backend is closed")
            out: list[ChatResponse] = []
            for start in range(0, len(requests), self.max_batch_size):
                end = start + self.max_batch_size
                part = listeners[start:end] if listeners is not None else None
                out.extend(self._generate_batch(requests[start:end], part))
            return out

    def render_prompt(self, request: ChatRequest) -> str:
        """The prompt text for a request: chat template, tools, generation prompt."""
        return self.tokenizer.apply_chat_template(
            _template_messages(request.messages),
            tools=request.tools or None,
            add_generation_prompt=True,
            tokenize=False,
        )

    def _generate_batch(
        self, requests: list[ChatRequest], listeners: list[TokenListener | None] | None = None
    ) -> list[ChatResponse]:
        # Requests that cannot run (template error, prompt over the context) get an error
        # response of their own; the rest of the batch is sampled together.
        limit = getattr(self.model.config, "max_position_embeddings", None) or 1_000_000
        out: list[ChatResponse | None] = [None] * len(requests)
        runnable: list[tuple[int, str]] = []
        for i, request in enumerate(requests):
            try:
                prompt = self.render_prompt(request)
            except Exception as exc:  # jinja errors on odd messages: this request only
                out[i] = _error(f"{self.name}: chat template failed: {type(exc).__name__}: {exc}")
                continue
            length = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if length >= limit:
                out[i] = _error(
                    f"{self.name}: prompt of {length} tokens does not fit the model's "
                    f"context of {limit}"
                )
                continue
            runnable.append((i, prompt))
        if runnable:
            sampled = self._sample_batch(
                [requests[i] for i, _ in runnable],
                [p for _, p in runnable],
                limit,
                [listeners[i] for i, _ in runnable] if listeners is not None else None,
            )
            for (i, _), response in zip(runnable, sampled, strict=True):
                out[i] = response
        return [r for r in out if r is not None]

    def _sample_batch(
        self,
        requests: list[ChatRequest],
        prompts: list[str],
        limit: int,
        listeners: list[TokenListener | None] | None = None,
    ) -> list[ChatResponse]:
        import torch

        heard = listeners or [None] * len(requests)

        tok, model = self.tokenizer, self.model
        prompt_ids: list[list[int]] = tok(prompts, add_special_tokens=False)["input_ids"]
        batch = len(prompt_ids)
        lengths = [len(ids) for ids in prompt_ids]
        budgets = [
            max(0, min(r.max_tokens or self.max_new_tokens, limit - int(n)))
            for r, n in zip(requests, lengths, strict=True)
        ]
        eos_ids = _eos_ids(tok, model)
        generators = []
        for r in requests:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(r.seed if r.seed is not None else self._rng.getrandbits(63))
            generators.append(gen)

        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        finish = ["length"] * batch
        done = [b == 0 for b in budgets]
        # On CPU a forward costs about the same per row however many rows run together, so
        # rows are not made to wait on each other: the prompt prefix every row shares (the
        # system message and tool list) is computed once, and finished rows leave the batch.
        shared = _shared_prefix(prompt_ids)
        self.last_batch = BatchStats(rows=batch, shared_prefix=shared)
        cache_kw, extra = _forward_kwargs(model)
        with torch.inference_mode():
            cache: dict[str, Any] = {}
            if shared:
                head = torch.tensor([prompt_ids[0][:shared]], device=self.device)
                first = model(input_ids=head, use_cache=True, **extra)
                self.last_batch.prefill_tokens += shared
                past = _cache_of(first)
                past.batch_repeat_interleave(batch)
                cache = {cache_kw: past}
            tails = [ids[shared:] for ids in prompt_ids]
            width = max(len(t) for t in tails)
            pad = tok.pad_token_id
            input_ids = torch.tensor(
                [[pad] * (width - len(t)) + t for t in tails], dtype=torch.long, device=self.device
            )
            attention = torch.tensor(
                [[1] * shared + [0] * (width - len(t)) + [1] * len(t) for t in tails],
                dtype=torch.long,
                device=self.device,
            )
            # Positions count real tokens only, so padding (between the shared prefix and a
            # shorter row's tail) changes no row's numbers.
            position = (attention.cumsum(-1) - 1).clamp(min=0)[:, shared:]
            out = model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=position,
                use_cache=True,
                **cache,
                **extra,
            )
            self.last_batch.prefill_tokens += batch * width
            rows = list(range(batch))  # batch position -> request index
            deadlines = [r.deadline for r in requests]
            timed = any(d is not None for d in deadlines)
            while rows:
                logits = out.logits[:, -1, :].float()
                policy_logp = torch.log_softmax(logits, dim=-1)
                next_ids = torch.full((len(rows),), pad, dtype=torch.long)
                now = time.monotonic() if timed else 0.0
                for pos, i in enumerate(rows):
                    if done[i]:
                        continue
                    request, listener = requests[i], heard[i]
                    if listener is not None and listener.cancelled:
                        # Its client went away: stop spending steps on it.
                        done[i], finish[i] = True, "cancelled"
                        continue
                    if deadlines[i] is not None and now >= deadlines[i]:
                        # Its rollout's wall budget ran out: the row ends with what it wrote.
                        done[i], finish[i] = True, "deadline"
                        continue
                    token = _sample(logits[pos], request, generators[i])
                    next_ids[pos] = token
                    tokens[i].append(token)
                    logprobs[i].append(float(policy_logp[pos, token]))
                    if listener is not None:
                        listener.on_token(token)
                    if token in eos_ids:
                        done[i], finish[i] = True, "stop"
                    elif self.stop_after_tool_call and _closes_tool_call(tok, tokens[i]):
                        # A finished call ends the turn: small models otherwise go on to
                        # invent the tool's response themselves.
                        done[i], finish[i] = True, "tool_calls"
                    elif len(tokens[i]) >= budgets[i]:
                        done[i] = True
                keep = [pos for pos, i in enumerate(rows) if not done[i]]
                if not keep:
                    break
                if len(keep) < len(rows):
                    index = torch.tensor(keep, device=self.device)
                    past = _cache_of(out)
                    past.batch_select_indices(index)
                    attention, position = attention[index], position[index]
                    next_ids = next_ids[keep]
                    rows = [rows[pos] for pos in keep]
                else:
                    past = _cache_of(out)
                attention = torch.cat(
                    [
                        attention,
                        torch.ones((len(rows), 1), dtype=attention.dtype, device=self.device),
                    ],
                    dim=-1,
                )
                position = position[:, -1:] + 1
                out = model(
                    input_ids=next_ids[:, None].to(self.device),
                    attention_mask=attention,
                    position_ids=position,
                    use_cache=True,
                    **{cache_kw: past},
                    **extra,
                )
                self.last_batch.decode_rows += len(rows)

        responses = []
        for i in range(batch):
            ids = tokens[i]
            text_ids = ids[:-1] if finish[i] == "stop" and ids and ids[-1] in eos_ids else ids
            text = tok.decode(text_ids, skip_special_tokens=True)
            content, calls = parse_tool_calls(text)
            reason = finish[i]
            if calls and reason == "stop":
                reason = "tool_calls"
            prompt_tokens = lengths[i]
            responses.append(
                ChatResponse(
                    content=content,
                    tool_calls=calls,
                    token_ids=ids,
                    logprobs=logprobs[i],
                    finish_reason=reason,
                    usage=Usage(
                        prompt_tokens=prompt_tokens,
                        completion_tokens=len(ids),
                        total_tokens=prompt_tokens + len(ids),
                    ),
                )
            )
        return responses


def _shared_prefix(prompt_ids: list[list[int]]) -> int:
    """How many leading tokens every prompt shares, when worth computing once (else 0)."""
    # Each row keeps at least its last prompt token: its logits start the sampling.
    return shared_prefix_length(prompt_ids, min((len(ids) for ids in prompt_ids), default=1) - 1)


def shared_prefix_length(sequences: list[list[int]], limit: int) -> int:
    """Leading tokens all `sequences` share, at most `limit` (0 below MIN_SHARED_PREFIX)."""
    if len(sequences) < 2:
        return 0
    shortest = min(limit, *(len(ids) for ids in sequences))
    first = sequences[0]
    n = 0
    while n < shortest and all(ids[n] == first[n] for ids in sequences):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def _closes_tool_call(tokenizer: Any, ids: list[int]) -> bool:
    # Only the last few tokens can complete the closing tag; decoding them is cheap next to
    # a forward pass.
    return ids[-1:] != [] and CLOSE_TAG in tokenizer.decode(ids[-6:], skip_special_tokens=False)


def _error(message: str) -> ChatResponse:
    return ChatResponse(finish_reason="error", error=message)


def _forward_kwargs(model: Any) -> tuple[str, dict[str, Any]]:
    # transformers 5 renamed `past_key_values` to `cache`; support both spellings, and only
    # compute the last position's logits when the model allows it (prompts can be long).
    import inspect

    # A peft wrapper forwards keyword arguments to the model it wraps: ask that one.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(inner.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    return cache_kw, extra


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _sample(logits: Any, request: ChatRequest, generator: Any) -> int:
    import torch

    if request.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if 0 < request.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = cumulative - sorted_probs >= request.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Most chat templates want tool-call arguments as a mapping; the loop keeps the model's
    # raw JSON text, so decode it here when it is a JSON object.
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or not calls:
            out.append(message)
            continue
        fixed = []
        for call in calls:
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    decoded = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    decoded = None
                if isinstance(decoded, dict):
                    function["arguments"] = decoded
            fixed.append({**call, "function": function})
        out.append({**message, "tool_calls": fixed})
    return out


def _eos_ids(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids


def _torch_dtype(torch: Any, name: str) -> Any:
    if name == "auto":
        return "auto"
    value = getattr(torch, name, None)
    if value is None:
        raise RolloutError(f"unknown torch dtype '{name}'")
    return value


def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"
