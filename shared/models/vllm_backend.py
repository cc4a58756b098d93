"""`vllm:<path>`: a local model served by vLLM's async engine (the `gpu` extra).

Same contract as `hf:<path>`: prompts rendered with the tokenizer's chat template (tools
included), tool calls read back from Hermes `<tool_call>` blocks, token ids and logprobs of the
sampled tokens (vLLM's default logprobs are those of the raw model output, before temperature
and top_p, which is what policy-gradient training needs). Every request of a batch goes to the
engine at once, so vLLM's continuous batching schedules them together.

The engine lives on a private event loop in a daemon thread: starting it (seconds to minutes)
never stalls the caller's loop, and the backend works from any loop or thread. It starts on
the first `generate` (or `start()`). `reload(path)` swaps in a new policy's weights in place:
new batches wait, running ones finish, every worker loads the checkpoint's tensors through the
model's own `load_weights` (vLLM's documented RLHF route, via a `worker_extension_cls`), and
the prefix cache is reset so no KV computed by the old weights is reused.

vLLM is imported only here and only when a backend is built, so importing `rollout` never
imports it. `ROLLOUT_VLLM_ENGINE_ARGS` (a JSON object of `AsyncEngineArgs` fields, e.g.
`{"gpu_memory_utilization": 0.5, "max_model_len": 8192}`) tunes the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog

from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ChatRequest, ChatResponse, Usage
from rollout.shared.models.hermes import parse_tool_calls
from rollout.shared.models.hf import _template_messages
from rollout.shared.models.registry import register_backend

log = structlog.get_logger(__name__)

INSTALL_HINT = "pip install 'rolloutdev[gpu]'"
ENGINE_ARGS_ENV = "ROLLOUT_VLLM_ENGINE_ARGS"
DEFAULT_MAX_NEW_TOKENS = 512
# Qualified name vLLM imports inside each worker process; it must stay importable from there.
WORKER_EXTENSION = f"{__name__}.WeightReloadExtension"
# Our defaults; ROLLOUT_VLLM_ENGINE_ARGS and the constructor's `engine_args` override them.
DEFAULT_ENGINE_ARGS: dict[str, Any] = {"disable_log_stats": True}
# Config keys that fix parameter shapes: a checkpoint that differs in any of them cannot be
# loaded into the running model, so reload builds a fresh engine instead.
_SHAPE_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)

T = TypeVar("T")


def require_vllm() -> Any:
    """Import vllm, or raise RolloutError saying how to install the `gpu` extra."""
    try:
        import vllm
    except ImportError as exc:
        raise RolloutError(
            f"the vllm: backend needs vLLM and a CUDA GPU; vLLM is not importable here "
            f"({exc}). Install the gpu extra: {INSTALL_HINT}"
        ) from None
    return vllm


def engine_args_from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The engine arguments in ROLLOUT_VLLM_ENGINE_ARGS (empty when unset)."""
    raw = (os.environ if environ is None else environ).get(ENGINE_ARGS_ENV, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise RolloutError(
            f"{ENGINE_ARGS_ENV} is not valid JSON ({exc.msg} at char {exc.pos}); expected an "
            f'object of vLLM engine arguments such as {{"gpu_memory_utilization": 0.5}}'
        ) from None
    if not isinstance(value, dict):
        raise RolloutError(
            f"{ENGINE_ARGS_ENV} must be a JSON object of vLLM engine arguments, "
            f"got {type(value).__name__}"
        )
    return value


def model_dir(path: str | Path, *, label: str) -> Path:
    """The local checkpoint directory at `path`, or RolloutError saying what is missing."""
    local = Path(path).expanduser()
    if not local.is_dir():
        raise RolloutError(f"{label}: no model directory at {local} (vllm: loads local models)")
    if not (local / "config.json").is_file():
        hint = ""
        if (local / "adapter_config.json").is_file():
            hint = " (it holds a LoRA adapter: merge it into the base weights first)"
        raise RolloutError(f"{label}: {local} has no config.json{hint}")
    return local


def weight_files(directory: str | Path) -> list[Path]:
    """The checkpoint's weight files: safetensors shards, else PyTorch .bin shards."""
    local = Path(directory)
    found = sorted(local.glob("*.safetensors"))
    return found or sorted(local.glob("pytorch_model*.bin"))


def iter_checkpoint_tensors(directory: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield (name, tensor) for every weight saved under `directory`, one shard at a time."""
    files = weight_files(directory)
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin under {directory}")
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt", device="cpu") as shard:
                for name in shard.keys():
                    yield name, shard.get_tensor(name)
        else:
            import torch

            yield from torch.load(file, map_location="cpu", weights_only=True).items()


class WeightReloadExtension:
    """Mixed into every vLLM worker (`worker_extension_cls`): load a checkpoint in place."""

    def rollout_load_weights(self, path: str) -> int:
        """Load every tensor under `path` into this worker's model; return how many."""
        runner = self.model_runner  # type: ignore[attr-defined]
        # get_model() unwraps compiled / CUDA-graph wrappers where the runner has them.
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in iter_checkpoint_tensors(path):
                count += 1
                yield item

        # The model's load_weights maps HF names onto vLLM's fused/sharded parameters and
        # copies into the existing storage, so CUDA graphs and the KV cache stay valid.
        model.load_weights(weights=counted())
        return count


def render_prompt_ids(tokenizer: Any, request: ChatRequest) -> list[int]:
    """The prompt token ids for a request: chat template, tools, generation prompt."""
    text = tokenizer.apply_chat_template(
        _template_messages(request.messages),
        tools=request.tools or None,
        add_generation_prompt=True,
        tokenize=False,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def eos_token_ids(tokenizer: Any, directory: str | Path) -> list[int]:
    """End-of-turn ids from the tokenizer, config.json and generation_config.json."""
    ids: set[int] = set()
    values: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    for name in ("config.json", "generation_config.json"):
        file = Path(directory) / name
        if file.is_file():
            try:
                values.append(json.loads(file.read_text()).get("eos_token_id"))
            except (ValueError, AttributeError):
                continue  # a broken optional file: the tokenizer's eos still applies
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value if isinstance(v, int))
    return sorted(ids)


def sampling_kwargs(
    request: ChatRequest, *, max_tokens: int, stop_token_ids: Sequence[int]
) -> dict[str, Any]:
    """vLLM SamplingParams arguments for a request (greedy when temperature <= 0)."""
    return {
        "n": 1,
        "temperature": max(0.0, float(request.temperature)),
        # Out-of-range top_p means "no nucleus filtering", as in the hf backend.
        "top_p": request.top_p if 0 < request.top_p <= 1 else 1.0,
        "max_tokens": max_tokens,
        "seed": request.seed,
        # 0: only the sampled token's logprob, no alternatives.
        "logprobs": 0,
        "stop_token_ids": list(stop_token_ids),
        # We decode ourselves (same tokenizer as the template); vLLM's text is not needed.
        "detokenize": False,
    }


def sampled_logprobs(steps: Sequence[Any] | None, token_ids: Sequence[int]) -> list[float]:
    """The logprob of each sampled token from vLLM's per-step `{token_id: Logprob}` maps."""
    if steps is None:
        raise ValueError("vLLM returned no logprobs (SamplingParams.logprobs was not set)")
    if len(steps) != len(token_ids):
        raise ValueError(f"vLLM returned {len(steps)} logprob steps for {len(token_ids)} tokens")
    out = []
    for step, token in zip(steps, token_ids, strict=True):
        entry = step[token]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def build_response(
    tokenizer: Any,
    *,
    prompt_tokens: int,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    finish_reason: str | None,
    eos_ids: Sequence[int],
) -> ChatResponse:
    """A ChatResponse from the sampled ids: decoded text, parsed tool calls, usage."""
    ids = [int(t) for t in token_ids]
    if finish_reason == "abort":
        return error_response("vLLM aborted the request before it finished")
    reason = "stop" if finish_reason == "stop" else "length"
    # The end-of-turn token is part of the sample (and of training data) but not of the text.
    text_ids = ids[:-1] if ids and ids[-1] in eos_ids else ids
    content, calls = parse_tool_calls(tokenizer.decode(text_ids, skip_special_tokens=True))
    if calls and reason == "stop":
        reason = "tool_calls"
    return ChatResponse(
        content=content,
        tool_calls=calls,
        token_ids=ids,
        logprobs=[float(v) for v in logprobs],
        finish_reason=reason,
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
            total_tokens=prompt_tokens + len(ids),
        ),
    )


def error_response(message: str, *, rejected: bool = False) -> ChatResponse:
    """A per-request failure; the rest of the batch goes on (`rejected`: for what it holds)."""
    return ChatResponse(finish_reason="error", error=message, rejected=rejected)


def shape_mismatch(old_dir: str | Path, new_dir: str | Path) -> list[str]:
    """Config keys whose values differ between two checkpoints (parameter shapes change)."""
    old = _read_config(old_dir)
    new = _read_config(new_dir)
    return [key for key in _SHAPE_KEYS if old.get(key) != new.get(key)]


def _read_config(directory: str | Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class _LoopThread:
    """A private event loop in a daemon thread that owns the engine and everything it awaits."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coro` on the private loop (started on first use)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=run, name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def started(self) -> bool:
        """Whether the loop thread is running."""
        return self._loop is not None

    def on_loop(self) -> bool:
        """True when called from the private loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        if not thread.is_alive():
            loop.close()


class VLLMBackend:
    """A local checkpoint served by vLLM's AsyncLLM engine; batched, with in-place reload."""

    def __init__(
        self,
        path: str | Path,
        *,
        engine_args: dict[str, Any] | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> None:
        self.path = str(path)
        self.name = f"vllm:{self.path}"
        self.max_new_tokens = max(1, max_new_tokens)
        local = model_dir(self.path, label=self.name)
        overrides = {**engine_args_from_env(), **(engine_args or {})}
        self._vllm = require_vllm()
        self._engine_args = self._checked_engine_args(overrides)
        self.tokenizer = _load_tokenizer(local, label=self.name)
        self._eos_ids = eos_token_ids(self.tokenizer, local)
        self._dir = local
        self._runner = _LoopThread(f"vllm-engine-{local.name}")
        # Engine state below is touched only on the private loop.
        self._engine: Any = None
        self._max_model_len: int | None = None
        self._gate: asyncio.Condition | None = None
        self._starting: asyncio.Lock | None = None
        self._active = 0
        self._reloading = False
        self._closed = False

    def __repr__(self) -> str:
        return f"VLLMBackend({self.path!r})"

    # -- public API --------------------------------------------------------------------

    async def start(self) -> None:
        """Build the engine now instead of on the first batch."""
        await self._call(self._ensure_engine())

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """One response per request, in order; the whole batch is scheduled together."""
        if not requests:
            return []
        if self._closed:
            raise RolloutError(f"{self.name}: backend is closed")
        # A reload may swap tokenizer and eos ids meanwhile; this batch keeps the ones it began with.
        tokenizer, eos_ids = self.tokenizer, self._eos_ids
        prepared = await asyncio.to_thread(_prepare, tokenizer, list(requests), self.name)
        raw = await self._call(self._run_batch(list(requests), prepared, eos_ids))
        out: list[ChatResponse] = []
        for item in raw:
            if isinstance(item, ChatResponse):
                out.append(item)
                continue
            prompt_tokens, ids, logprobs, finish = item
            out.append(
                build_response(
                    tokenizer,
                    prompt_tokens=prompt_tokens,
                    token_ids=ids,
                    logprobs=logprobs,
                    finish_reason=finish,
                    eos_ids=eos_ids,
                )
            )
        return out

    def reload(self, path: str | Path) -> None:
        """Swap in the weights saved at `path` (a new policy version); blocks until done."""
        if self._runner.on_loop():
            raise RolloutError(f"{self.name}: reload() called from the engine's own loop")
        new_dir, tokenizer = self._check_reload(path)
        self._runner.submit(self._reload_on_loop(new_dir)).result()
        self._after_reload(new_dir, tokenizer)

    async def areload(self, path: str | Path) -> None:
        """`reload` for async callers: the caller's loop keeps running meanwhile."""
        new_dir, tokenizer = await asyncio.to_thread(self._check_reload, path)
        await self._call(self._reload_on_loop(new_dir))
        self._after_reload(new_dir, tokenizer)

    def close(self) -> None:
        """Shut the engine down and stop its loop thread."""
        if self._closed:
            return
        self._closed = True
        if not self._runner.started():
            return
        try:
            self._runner.submit(self._shutdown_engine()).result(timeout=120)
        finally:
            self._runner.stop()

    async def aclose(self) -> None:
        """`close` for async callers."""
        await asyncio.to_thread(self.close)

    # -- caller side -------------------------------------------------------------------

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self._runner.submit(coro))

    def _checked_engine_args(self, overrides: dict[str, Any]) -> dict[str, Any]:
        known = {f.name for f in dataclasses.fields(self._vllm.AsyncEngineArgs)}
        unknown = sorted(k for k in overrides if k not in known)
        if unknown:
            raise RolloutError(
                f"{self.name}: unknown vLLM engine argument(s) {', '.join(unknown)} "
                f"(from {ENGINE_ARGS_ENV} or engine_args); see vllm.AsyncEngineArgs"
            )
        if "model" in overrides:
            raise RolloutError(
                f"{self.name}: engine argument 'model' is set by the name after 'vllm:'"
            )
        args = {**DEFAULT_ENGINE_ARGS, **overrides}
        # Our reload needs the extension; a caller's own extension must provide it instead.
        if "worker_extension_cls" in known:
            args.setdefault("worker_extension_cls", WORKER_EXTENSION)
        return args

    def _check_reload(self, path: str | Path) -> tuple[Path, Any]:
        label = f"{self.name}: reload"
        new_dir = model_dir(path, label=label)
        if not weight_files(new_dir):
            raise RolloutError(f"{label}: no *.safetensors or pytorch_model*.bin in {new_dir}")
        return new_dir, _load_tokenizer(new_dir, label=label)

    def _after_reload(self, new_dir: Path, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._eos_ids = eos_token_ids(tokenizer, new_dir)
        self._dir = new_dir
        self.path = str(new_dir)
        self.name = f"vllm:{self.path}"

    # -- engine side (private loop only) -----------------------------------------------

    def _sync_primitives(self) -> tuple[asyncio.Condition, asyncio.Lock]:
        # Created lazily so they belong to the private loop.
        if self._gate is None or self._starting is None:
            self._gate, self._starting = asyncio.Condition(), asyncio.Lock()
        return self._gate, self._starting

    async def _ensure_engine(self) -> Any:
        _, starting = self._sync_primitives()
        async with starting:  # concurrent first batches build one engine
            if self._engine is None:
                await self._build_engine()
        return self._engine

    async def _build_engine(self) -> None:
        if self._closed:
            raise RolloutError(f"{self.name}: backend is closed")
        vllm = self._vllm
        args = {**self._engine_args, "model": str(self._dir)}
        log.info("vllm_engine_starting", model=str(self._dir))
        try:
            engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args))
        except Exception as exc:  # CUDA missing, OOM, unsupported architecture...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RolloutError(
                f"{self.name}: could not start the vLLM engine: {type(exc).__name__}: {first}"
            ) from None
        config = getattr(engine, "model_config", None)
        if config is None:  # older engines expose it only through a coroutine
            config = await engine.get_model_config()
        self._engine, self._max_model_len = engine, int(config.max_model_len)
        log.info("vllm_engine_started", model=str(self._dir), max_model_len=self._max_model_len)

    async def _run_batch(
        self,
        requests: list[ChatRequest],
        prepared: list[list[int] | ChatResponse],
        eos_ids: list[int],
    ) -> list[Any]:
        gate, _ = self._sync_primitives()
        async with gate:
            await gate.wait_for(lambda: not self._reloading)
            self._active += 1
        try:
            # Past the gate no reload runs, so the engine cannot be swapped under this batch.
            engine = await self._ensure_engine()
            limit = self._max_model_len or 0
            jobs = []
            for request, item in zip(requests, prepared, strict=True):
                if isinstance(item, ChatResponse):
                    jobs.append(_done(item))
                elif len(item) >= limit:
                    jobs.append(
                        _done(
                            error_response(
                                f"{self.name}: prompt of {len(item)} tokens does not fit the "
                                f"model's context of {limit}",
                                rejected=True,
                            )
                        )
                    )
                else:
                    budget = min(request.max_tokens or self.max_new_tokens, limit - len(item))
                    jobs.append(self._sample_one(engine, request, item, max(1, budget), eos_ids))
            return list(await asyncio.gather(*jobs))
        finally:
            async with gate:
                self._active -= 1
                gate.notify_all()

    async def _sample_one(
        self,
        engine: Any,
        request: ChatRequest,
        prompt_ids: list[int],
        max_tokens: int,
        eos_ids: list[int],
    ) -> tuple[int, list[int], list[float], str | None] | ChatResponse:
        vllm = self._vllm
        kwargs = sampling_kwargs(request, max_tokens=max_tokens, stop_token_ids=eos_ids)
        final_only = _final_only_kind()
        if final_only is not None:
            # Only the finished output: no per-step copies of a growing sequence.
            kwargs["output_kind"] = final_only
        params = vllm.SamplingParams(**kwargs)
        final = None
        try:
            async for output in engine.generate(
                {"prompt_token_ids": prompt_ids}, params, f"rollout-{uuid.uuid4().hex}"
            ):
                final = output
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if getattr(engine, "errored", False):
                # A dead engine is not this request's fault: fail the batch so the work is
                # redelivered to a healthy replica.
                raise RolloutError(f"{self.name}: the vLLM engine died: {exc!r}") from None
            return error_response(f"{self.name}: generation failed: {type(exc).__name__}: {exc}")
        if final is None or not final.outputs:
            return error_response(f"{self.name}: vLLM returned no output")
        completion = final.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        try:
            logprobs = sampled_logprobs(completion.logprobs, ids)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return error_response(f"{self.name}: unusable logprobs from vLLM: {exc}")
        return len(prompt_ids), ids, logprobs, completion.finish_reason

    async def _reload_on_loop(self, new_dir: Path) -> None:
        gate, starting = self._sync_primitives()
        async with starting:
            if self._engine is None:
                # Not started yet: the engine will start from the new checkpoint.
                self._dir = new_dir
                return
        async with gate:
            # One reload at a time; new batches queue behind it, running ones drain first.
            await gate.wait_for(lambda: not self._reloading)
            self._reloading = True
            await gate.wait_for(lambda: self._active == 0)
        try:
            changed = shape_mismatch(self._dir, new_dir)
            if changed:
                # Different shapes cannot be copied in place: start a fresh engine instead.
                log.info("vllm_engine_rebuild", model=str(new_dir), changed=changed)
                await self._shutdown_engine()
                self._dir = new_dir
                await self._ensure_engine()
                return
            engine = self._engine
            try:
                counts = await engine.collective_rpc("rollout_load_weights", args=(str(new_dir),))
            except Exception as exc:
                raise RolloutError(
                    f"{self.name}: reloading weights from {new_dir} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            await engine.reset_prefix_cache()
            self._dir = new_dir
            log.info("vllm_weights_reloaded", model=str(new_dir), tensors=counts)
        finally:
            async with gate:
                self._reloading = False
                gate.notify_all()

    async def _shutdown_engine(self) -> None:
        engine, self._engine = self._engine, None
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:  # kills the engine-core process and frees the GPU
            shutdown()


def _final_only_kind() -> Any:
    try:
        from vllm.sampling_params import RequestOutputKind
    except ImportError:  # older vLLM: every output is cumulative anyway
        return None
    return RequestOutputKind.FINAL_ONLY


async def _done(value: T) -> T:
    return value


def _prepare(tokenizer: Any, requests: list[ChatRequest], name: str) -> list[Any]:
    # A request whose template fails gets its own error response; the batch goes on.
    out: list[list[int] | ChatResponse] = []
    for request in requests:
        try:
            out.append(render_prompt_ids(tokenizer, request))
        except Exception as exc:  # jinja errors on odd messages: this request only
            failed = f"{name}: chat template failed: {type(exc).__name__}: {exc}"
            out.append(error_response(failed, rejected=True))
    return out


def _load_tokenizer(directory: Path, *, label: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise RolloutError(f"{label}: needs transformers ({INSTALL_HINT}): {exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise RolloutError(
            f"{label}: cannot load a tokenizer from {directory}: {str(exc).splitlines()[0]}"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise RolloutError(f"{label}: the tokenizer in {directory} has no chat template")
    return tokenizer


def _factory(path: str) -> VLLMBackend:
    if not path.strip():
        raise RolloutError("model 'vllm:': missing the model directory after 'vllm:'")
    return VLLMBackend(path.strip())


def register() -> None:
    """Accept `vllm:<path>` model names in `resolve_backend`."""
    register_backend("vllm:", _factory, example="vllm:./models/my-model")
