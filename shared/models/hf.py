"""`hf:<path>`: a local transformers causal LM, batched sampling with token ids and logprobs.

Prompts are rendered with the tokenizer's chat template (tools included); tool calls are read
back from Hermes-style `<tool_call>{json}</tool_call>` blocks. Sampling is our own small loop
over the KV cache rather than `model.generate`, so each request in a batch keeps its own
temperature, top_p, max_tokens and seed; sampling stays on the model's device and each decode
step copies one small tensor (the picked ids and their logprobs) to the host. `ROLLOUT_HF_DEVICE`
picks the device (default: cuda when available), `ROLLOUT_HF_DTYPE` the weights' dtype
(float32|bfloat16|float16|auto; auto, the default: bfloat16 on a CUDA device that supports it,
else float32) and `ROLLOUT_HF_THREADS` torch's intra-op thread count (else the `threads`
argument, which local models set to what was measured fastest). Unless `max_batch_size` is
given, a CUDA batch holds as many rows as their KV cache fits in free memory. The logprobs
returned are those of the sampled tokens under the model itself (log-softmax of the raw
logits in float32, before temperature/top_p), which is what policy-gradient training needs.
Nothing is ever downloaded.

A folder holding a LoRA adapter (`adapter_config.json`) loads onto the base it recorded
(`rollout_adapter.json`) without merging; `reload` with another adapter of the same base swaps
adapters and keeps the base weights loaded.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
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
# Rows per batch on the CPU: what benchmarks/models.py measured fastest.
CPU_BATCH_ROWS = 16
# On CUDA the KV cache may take this share of free memory; the forward's activations, the
# logits and the sampling buffers need the rest. More rows than the cap gain little.
GPU_MEMORY_SHARE = 0.8
MAX_GPU_ROWS = 256
DTYPE_ENV = "ROLLOUT_HF_DTYPE"
DTYPES = ("float32", "bfloat16", "float16", "auto")


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
        max_batch_size: int | None = None,
        threads: int | None = None,
        name: str | None = None,
        stop_after_tool_call: bool = False,
    ) -> None:
        # Before anything imports torch (the default device too): a cold torch and
        # transformers take seconds, more on a busy machine, past the actors' model check's
        # wait, which then took a missing folder for a model still loading and refused nothing.
        _local_path(str(path))
        self.path = str(path)
        self.name = name or f"hf:{self.path}"
        self.threads = threads
        self.last_batch = BatchStats()
        # End a turn at `</tool_call>` (for models that otherwise write the tool's reply).
        self.stop_after_tool_call = stop_after_tool_call
        # The base reference of the loaded adapter (None: plain weights).
        self.adapter_base: str | None = None
        # The sha256 of the loaded weights when the owner proves them (weights_proof.py),
        # stamped on every response; None: no proof (a plain local model).
        self.weights_sha256: str | None = None
        # Batches cut in two after running out of device memory (see _sample_halving).
        self.oom_splits = 0
        self._adapters = 0
        self.max_new_tokens = max_new_tokens
        # None: CPU_BATCH_ROWS on the CPU, as many rows as fit in free memory on CUDA.
        self.max_batch_size = None if max_batch_size is None else max(1, max_batch_size)
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
        """Generate for every request (in batches of `max_batch_size` rows), off the event loop."""
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

    def reload(
        self, path: str | Path, *, weights_sha256: str | None = None, name: str | None = None
    ) -> None:
        """Swap in the weights (and tokenizer) saved at `path`, e.g. a new policy version.

        Everything a batch reads (weights, tokenizer, name, the weights' digest) changes in
        one hold of the generation lock; full weights load from disk before it."""
        target = Path(str(path))
        label = name or f"hf:{target}"
        if (
            self.adapter_base is not None
            and is_adapter(target)
            and adapter_base(target) == self.adapter_base
        ):
            # Same base: load the new adapter beside the old one, switch, drop the old one.
            self._adapters += 1
            adapter = f"policy_{self._adapters}"
            with self._lock:
                old = self.model.active_adapter
                self.model.load_adapter(str(target), adapter_name=adapter)
                self.model.set_adapter(adapter)
                self.model.delete_adapter(old)
                self.model.eval()
                self.path, self.name, self.weights_sha256 = str(path), label, weights_sha256
            return
        tokenizer, model = self._load(str(path))
        with self._lock:
            self.tokenizer, self.model = tokenizer, model
            self.path, self.name, self.weights_sha256 = str(path), label, weights_sha256

    async def aclose(self) -> None:
        """Drop the weights."""
        with self._lock:
            self.model = None  # type: ignore[assignment]

    # -- loading -----------------------------------------------------------------------

    def _load(self, path: str) -> tuple[Any, Any]:
        local = _local_path(path)
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
        source = str(local) if local.exists() else path

        dtype = _torch_dtype(torch, self._dtype_name(torch))
        adapter = local.exists() and is_adapter(local)
        base_ref = adapter_base(local) if adapter else None
        weights = str(base_dir(base_ref)) if base_ref is not None else source
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                weights, local_files_only=True, dtype=dtype
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

    def _dtype_name(self, torch: Any) -> str:
        forced = os.environ.get(DTYPE_ENV, "").strip().lower()
        if forced and forced not in DTYPES:
            raise RolloutError(f"{DTYPE_ENV} must be one of {', '.join(DTYPES)}, got {forced!r}")
        name = forced or self.dtype or "auto"
        if name != "auto":
            return name
        # bf16 halves memory and doubles matmul speed on GPUs that have it natively; emulated
        # bf16 (older GPUs) and the CPU are slower with it than with float32.
        cuda = self.device.startswith("cuda") and torch.cuda.is_available()
        if cuda and torch.cuda.is_bf16_supported(including_emulation=False):
            return "bfloat16"
        return "float32"

    # -- generation --------------------------------------------------------------------

    def _generate_all(
        self, requests: list[ChatRequest], listeners: list[TokenListener | None] | None = None
    ) -> list[ChatResponse]:
        with self._lock:
            if self.model is None:
                raise RolloutError(f"{self.name}: backend is closed")
            # Requests that cannot run (template error, prompt over the context) get an error
            # response of their own; the rest are sampled together, in batches.
            limit = getattr(self.model.config, "max_position_embeddings", None) or 1_000_000
            out: list[ChatResponse | None] = [None] * len(requests)
            runnable: list[tuple[int, list[int]]] = []
            for i, request in enumerate(requests):
                prepared = self._prompt_ids(request, limit)
                if isinstance(prepared, ChatResponse):
                    out[i] = prepared
                else:
                    runnable.append((i, prepared))
            if runnable:
                longest = max(len(ids) for _, ids in runnable)
                most = max(self._budget(requests[i], len(ids), limit) for i, ids in runnable)
                size = self._batch_rows(longest + most)
                for start in range(0, len(runnable), size):
                    part = runnable[start : start + size]
                    sampled = self._sample_halving(requests, part, limit, listeners)
                    for (i, _), response in zip(part, sampled, strict=True):
                        out[i] = response
            done = [r for r in out if r is not None]
            for response in done:
                # Read under the same hold as the weights: a swap cannot fall in between.
                response.weights_sha256 = self.weights_sha256
            return done

    def _sample_halving(
        self,
        requests: list[ChatRequest],
        part: list[tuple[int, list[int]]],
        limit: int,
        listeners: list[TokenListener | None] | None,
    ) -> list[ChatResponse]:
        """Sample `part`; out of device memory, again in two halves (a row alone that does not
        fit ends with an error of its own). The batch size counts the KV cache only."""
        import torch

        try:
            return self._sample_batch(
                [requests[i] for i, _ in part],
                [ids for _, ids in part],
                limit,
                [listeners[i] for i, _ in part] if listeners is not None else None,
            )
        except torch.OutOfMemoryError:
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            if len(part) == 1:
                tokens = len(part[0][1])
                return [_error(f"{self.name}: out of device memory for a {tokens}-token prompt")]
            half = len(part) // 2
            self.oom_splits += 1
            return self._sample_halving(
                requests, part[:half], limit, listeners
            ) + self._sample_halving(requests, part[half:], limit, listeners)

    def render_prompt(self, request: ChatRequest) -> str:
        """The prompt text for a request: chat template, tools, generation prompt."""
        return self.tokenizer.apply_chat_template(
            _template_messages(request.messages),
            tools=request.tools or None,
            add_generation_prompt=True,
            tokenize=False,
        )

    def _prompt_ids(self, request: ChatRequest, limit: int) -> list[int] | ChatResponse:
        # The prompt's token ids, or the error response of a request that cannot run.
        try:
            prompt = self.render_prompt(request)
        except Exception as exc:  # jinja errors on odd messages: this request only
            return _error(
                f"{self.name}: chat template failed: {type(exc).__name__}: {exc}", rejected=True
            )
        try:
            ids: list[int] = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        except Exception as exc:  # a lone surrogate (text cut mid-emoji): this request only
            return _error(
                f"{self.name}: cannot tokenize the prompt: {type(exc).__name__}: {exc}",
                rejected=True,
            )
        if len(ids) >= limit:
            return _error(
                f"{self.name}: prompt of {len(ids)} tokens does not fit the model's "
                f"context of {limit}",
                rejected=True,
            )
        return ids

    def _budget(self, request: ChatRequest, prompt_tokens: int, limit: int) -> int:
        return max(0, min(request.max_tokens or self.max_new_tokens, limit - prompt_tokens))

    def _batch_rows(self, tokens_per_row: int) -> int:
        """Rows per batch: `max_batch_size`, else what fits the device (CPU_BATCH_ROWS on CPU)."""
        if self.max_batch_size is not None:
            return self.max_batch_size
        if not self.device.startswith("cuda"):
            return CPU_BATCH_ROWS
        import torch

        device = torch.device(self.device)
        free, _ = torch.cuda.mem_get_info(device)
        # What torch's allocator holds without a tensor in it (last batch's cache) is free too.
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        element = next(self.model.parameters()).dtype.itemsize
        per_token = kv_bytes_per_token(self.model.config, element)
        return rows_that_fit(int(free * GPU_MEMORY_SHARE), per_token, tokens_per_row, MAX_GPU_ROWS)

    def _sample_batch(
        self,
        requests: list[ChatRequest],
        prompt_ids: list[list[int]],
        limit: int,
        listeners: list[TokenListener | None] | None = None,
    ) -> list[ChatResponse]:
        import torch

        heard = listeners or [None] * len(requests)

        tok, model = self.tokenizer, self.model
        batch = len(prompt_ids)
        lengths = [len(ids) for ids in prompt_ids]
        budgets = [self._budget(r, n, limit) for r, n in zip(requests, lengths, strict=True)]
        eos_ids = _eos_ids(tok, model)

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
            sampling = _Sampling.build(torch, requests, budgets, self.device, self._rng)
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
            step = 0
            while rows:
                next_ids, next_logp = sampling.pick(torch, out.logits[:, -1, :], step)
                # The step's one device->host copy. float32 holds the logprobs as they are and
                # every id below 2**24 (vocabularies are far smaller), on every device.
                picked, scores = torch.stack((next_ids.to(torch.float32), next_logp)).tolist()
                step += 1
                now = time.monotonic() if timed else 0.0
                for pos, i in enumerate(rows):
                    if done[i]:
                        continue
                    listener = heard[i]
                    if listener is not None and listener.cancelled:
                        # Its client went away: stop spending steps on it.
                        done[i], finish[i] = True, "cancelled"
                        continue
                    if deadlines[i] is not None and now >= deadlines[i]:
                        # Its rollout's wall budget ran out: the row ends with what it wrote.
                        done[i], finish[i] = True, "deadline"
                        continue
                    token = int(picked[pos])
                    tokens[i].append(token)
                    logprobs[i].append(scores[pos])
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
                past = _cache_of(out)
                if len(keep) < len(rows):
                    index = torch.tensor(keep, device=self.device)
                    past.batch_select_indices(index)
                    attention, position = attention[index], position[index]
                    next_ids = next_ids[index]
                    sampling = sampling.select(keep, index)
                    rows = [rows[pos] for pos in keep]
                attention = torch.nn.functional.pad(attention, (0, 1), value=1)
                position = position[:, -1:] + 1
                # The sampled ids go straight back in, never through the host.
                out = model(
                    input_ids=next_ids[:, None],
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


@dataclass
class _Sampling:
    """The batch rows' sampling settings: host lists pick the ops, device tensors run them."""

    greedy: list[bool]
    temperature: list[float]  # 1.0 on greedy rows
    top_p: list[float]  # inf where top_p is off
    greedy_mask: Any  # (rows,) bool
    temperature_t: Any  # (rows, 1) float32
    top_p_t: Any  # (rows, 1) float32
    # (rows, steps) float32: row k's uniform draw for step t, drawn from the row's own
    # generator up front, so its tokens depend on its seed alone whatever shares its batch.
    uniforms: Any

    @classmethod
    def build(
        cls, torch: Any, requests: list[ChatRequest], budgets: list[int], device: str, rng: Any
    ) -> _Sampling:
        """Settings and random draws of `requests`, on `device`."""
        greedy = [r.temperature <= 0 for r in requests]
        temperature = [1.0 if r.temperature <= 0 else float(r.temperature) for r in requests]
        top_p = [float(r.top_p) if 0 < r.top_p < 1 else math.inf for r in requests]
        # One generator call per row and batch, none per step (each is a kernel launch on
        # CUDA); greedy rows draw nothing and keep zeros, which index harmlessly.
        uniforms = torch.zeros((len(requests), max(1, *budgets)), device=device)
        for k, (request, budget) in enumerate(zip(requests, budgets, strict=True)):
            if greedy[k] or budget == 0:
                continue
            generator = torch.Generator(device=device)
            seed = request.seed if request.seed is not None else rng.getrandbits(63)
            generator.manual_seed(seed)
            uniforms[k, :budget].uniform_(generator=generator)
        return cls(
            greedy=greedy,
            temperature=temperature,
            top_p=top_p,
            greedy_mask=torch.tensor(greedy, device=device),
            temperature_t=torch.tensor(temperature, device=device)[:, None],
            top_p_t=torch.tensor(top_p, device=device)[:, None],
            uniforms=uniforms,
        )

    def select(self, keep: list[int], index: Any) -> _Sampling:
        """The rows at positions `keep` (`index`: the same positions on the device)."""
        return _Sampling(
            greedy=[self.greedy[k] for k in keep],
            temperature=[self.temperature[k] for k in keep],
            top_p=[self.top_p[k] for k in keep],
            greedy_mask=self.greedy_mask[index],
            temperature_t=self.temperature_t[index],
            top_p_t=self.top_p_t[index],
            uniforms=self.uniforms[index],
        )

    def pick(self, torch: Any, logits: Any, step: int) -> tuple[Any, Any]:
        """Each row's next token id and its logprob under the raw logits, on the device."""
        # float32 even for a bf16 model: the logprobs feed importance ratios in training.
        logits = logits.float()
        if all(self.greedy):
            ids = logits.argmax(dim=-1)
        else:
            ids = self._sample(torch, logits, step)
            if any(self.greedy):
                ids = torch.where(self.greedy_mask, logits.argmax(dim=-1), ids)
        logp = logits.gather(-1, ids[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        return ids, logp

    def _sample(self, torch: Any, logits: Any, step: int) -> Any:
        # Inverse-CDF sampling: one uniform per row and step is an exact sample, where
        # Gumbel/exponential noise would draw a whole vocabulary's worth of numbers per row.
        if any(t != 1.0 for t in self.temperature):
            logits = logits / self.temperature_t
        probs = torch.softmax(logits, dim=-1)
        if any(p != math.inf for p in self.top_p):
            ranked, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            drop = ranked.cumsum(dim=-1) - ranked >= self.top_p_t
            probs = probs.masked_fill(torch.zeros_like(drop).scatter_(-1, order, drop), 0.0)
        # The CDF runs in vocabulary order for every row, top_p or not: a row's draw then
        # lands on the same token whatever else shares its batch.
        cdf = probs.cumsum_(dim=-1)
        total = cdf[:, -1:]
        # Just below the total, a draw always lands on a token with mass (rounding can lift
        # u * total onto the total itself); the clamp keeps a broken row (NaN) in range.
        value = self.uniforms[:, step : step + 1] * total
        value = torch.minimum(value, torch.nextafter(total, torch.zeros_like(total)))
        return torch.searchsorted(cdf, value, right=True).clamp_(max=cdf.shape[-1] - 1)[:, 0]


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


def kv_bytes_per_token(config: Any, element_size: int) -> int:
    """Bytes of KV cache one token takes: layers x (key, value) x kv heads x head dim x element."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers * 2 * kv_heads * head_dim * element_size


def rows_that_fit(free_bytes: int, bytes_per_token: int, tokens_per_row: int, cap: int) -> int:
    """How many rows of `tokens_per_row` cached tokens fit in `free_bytes` (1 to `cap`)."""
    # At least one row: a batch of one that does not fit fails with the device's own error.
    per_row = max(1, bytes_per_token * tokens_per_row)
    return max(1, min(cap, free_bytes // per_row))


def _closes_tool_call(tokenizer: Any, ids: list[int]) -> bool:
    # Only the last few tokens can complete the closing tag; decoding them is cheap next to
    # a forward pass.
    return ids[-1:] != [] and CLOSE_TAG in tokenizer.decode(ids[-6:], skip_special_tokens=False)


def _error(message: str, *, rejected: bool = False) -> ChatResponse:
    return ChatResponse(finish_reason="error", error=message, rejected=rejected)


def _forward_kwargs(model: Any) -> tuple[str, dict[str, Any]]:
    # transformers 5 renamed `past_key_values` to `cache`; support both spellings, and only
    # compute the last position's logits when the model allows it (prompts can be long).
    # A peft wrapper forwards keyword arguments to the model it wraps: ask that one.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(inner.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    return cache_kw, extra


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


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
                except (ValueError, RecursionError):
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
    value = getattr(torch, name, None)
    if value is None:
        raise RolloutError(f"unknown torch dtype '{name}'")
    return value


def _local_path(path: str) -> Path:
    """`path` as a local path; RolloutError when it names a folder that is not there (a name
    that is no path may be a model in the local HF cache)."""
    local = Path(path).expanduser()
    if not local.exists() and path.startswith((".", "/", "~")):
        raise RolloutError(f"hf:{path}: no model directory at {local}")
    return local


def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"
