"""Trained policies served by an operator-run inference server (`vllm serve`, SGLang, ...).

An actor replica whose operator set ``ROLLOUT_INFERENCE_SERVER`` generates the LoRA policies
of one base model through that server instead of loading weights itself::

    ROLLOUT_INFERENCE_SERVER=http://vllm:8000/v1#local/smollm2-135m   # URL # base it serves
    ROLLOUT_INFERENCE_ADAPTER_DIR=/shared/adapters         # where the actor writes adapters
    ROLLOUT_INFERENCE_SERVER_ADAPTER_DIR=/adapters         # the same folder, as the server
                                                            # sees it (default: the same path)
    ROLLOUT_INFERENCE_CONCURRENCY=64                        # requests in flight per replica

For each policy version the actor copies the adapter's weight files into that folder under
a name unique to the version and its digest, and loads it with ``POST
<url>/load_lora_adapter`` (``lora_name``, ``lora_path`` and ``rollout_weights_sha256``); the
adapter two versions back is unloaded and its copy removed. Prompts go to ``<url>/completions``
as token ids rendered with the policy's chat template; token ids and their logprobs come back
(``return_token_ids``, ``logprobs``), so training sees exactly the sampled tokens. The server
must prove which weights answered (``x-rollout-weights-sha256``, see ``server_proof.py``):
every response carries that digest, the rollout records it, and the learner trains only on
rollouts whose digest is the one of the version they claim.

The URL is an endpoint like any other: the operator's allow-list decides whether it may be
called and which key it gets (``endpoints.py``). Full-weight policies and policies of other
bases stay in the actor's process (``hf``), as without the setting.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ChatRequest, ChatResponse, ModelBackend
from rollout.shared.models.endpoints import Endpoint, load_policy, url_problem
from rollout.shared.models.hermes import CLOSE_TAG
from rollout.shared.models.hf import DEFAULT_MAX_NEW_TOKENS
from rollout.shared.models.local_models import adapter_base, is_adapter, root_model
from rollout.shared.models.openai_compat import OpenAICompatBackend
from rollout.shared.models.trained import (
    FollowsPolicy,
    PolicyRecord,
    checked_digest,
    policy_key,
    register_policy_server,
    rollout_home,
)
from rollout.shared.models.vllm_backend import (
    build_response,
    eos_token_ids,
    error_response,
    render_prompt_ids,
)
from rollout.shared.models.weights_proof import (
    HEADER,
    LOAD_FIELD,
    is_sha256,
    weight_files,
)
from rollout.shared.observability import get_logger
from rollout.shared.settings import env_number

log = get_logger(__name__)

SERVER_ENV = "ROLLOUT_INFERENCE_SERVER"
ADAPTER_DIR_ENV = "ROLLOUT_INFERENCE_ADAPTER_DIR"
CONCURRENCY_ENV = "ROLLOUT_INFERENCE_CONCURRENCY"
# Requests one actor replica keeps in flight: a GPU server batches them (continuous batching).
DEFAULT_CONCURRENCY = 64
SERVER_ADAPTER_DIR_ENV = "ROLLOUT_INFERENCE_SERVER_ADAPTER_DIR"
# Adapters kept loaded: the current one and the one before (requests already sent with it
# finish on it); older ones are unloaded.
KEEP_LOADED = 2
LOAD_TIMEOUT_S = 120.0
PROOF_HINT = (
    "start the server with the proof of weight version, e.g. `vllm serve BASE --enable-lora "
    "--middleware rollout.shared.models.server_proof.WeightsProof` "
    "(and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
)


@dataclass(frozen=True)
class ServerSetting:
    """The operator's inference server: where it is, which base it serves, shared folders."""

    url: str
    base: str
    endpoint: Endpoint
    adapter_dir: Path
    server_adapter_dir: str
    concurrency: int = DEFAULT_CONCURRENCY


def server_setting(env: dict[str, str] | None = None) -> ServerSetting | None:
    """The inference server this process generates through (None: none is set)."""
    env = dict(os.environ) if env is None else env
    raw = (env.get(SERVER_ENV) or "").strip()
    if not raw:
        return None
    example = f"{SERVER_ENV}=http://vllm:8000/v1#local/smollm2-135m"
    url, _, base = raw.partition("#")
    url, base = url.strip().rstrip("/"), base.strip()
    if not base:
        raise RolloutError(
            f"{SERVER_ENV}: name the base model the server serves after '#', e.g. {example}"
        )
    problem = url_problem(url)
    if problem:
        raise RolloutError(f"{SERVER_ENV}: {problem}")
    if urlsplit(url).query or urlsplit(url).fragment:
        raise RolloutError(f"{SERVER_ENV}: the URL takes no options, e.g. {example}")
    endpoint = load_policy(env).for_url(url, SERVER_ENV)
    local = (env.get(ADAPTER_DIR_ENV) or "").strip()
    adapter_dir = Path(local).expanduser() if local else rollout_home() / "models" / "served"
    remote = (env.get(SERVER_ADAPTER_DIR_ENV) or "").strip() or str(adapter_dir)
    concurrency = int(env_number(CONCURRENCY_ENV, DEFAULT_CONCURRENCY, whole=True, low=1, env=env))
    return ServerSetting(url, base, endpoint, adapter_dir, remote.rstrip("/"), concurrency)


def adapter_name(record: PolicyRecord, digest: str) -> str:
    """The name a version is loaded under: unique to the policy, version and weights.

    A server caches adapters by name (vLLM keeps serving the first adapter loaded under a
    name); a new name for every version is what makes "this name" mean "these weights"."""
    return f"{policy_key(record.model)}-v{record.version}-{digest[:16]}"


class ServerPolicyBackend(OpenAICompatBackend, FollowsPolicy):
    """A trained LoRA policy generated by an inference server, following new versions."""

    completions_path = "/completions"

    def __init__(self, record: PolicyRecord, path: Path, setting: ServerSetting) -> None:
        super().__init__(
            "",
            setting.url,
            api_key=setting.endpoint.api_key(),
            key_env=setting.endpoint.key_env,
            label=record.model,
            logprobs=True,
            endpoint=setting.endpoint,
            concurrency=setting.concurrency,
        )
        self.setting = setting
        root = root_model(record.model) or root_model(record.base_model)
        self.stop_after_tool_call = root.stop_after_tool_call if root else False
        self.model_name = record.model
        self.record = record
        self.policy_version = record.version
        self.weights_sha256: str | None = None
        self._version_lock = threading.Lock()
        # What requests use now (name, tokenizer, eos ids), swapped together.
        self._serving_lock = threading.Lock()
        self._loaded: list[str] = []
        self._path = path
        self.tokenizer: Any = None
        self._eos: list[int] = []
        self._switch(record, path)

    def __repr__(self) -> str:
        return f"ServerPolicyBackend({self.model_name!r}, v{self.policy_version}, {self.base_url})"

    # -- versions ---------------------------------------------------------------------------

    def _switch(self, record: PolicyRecord, path: Path) -> None:
        """Copy the version's adapter where the server reads it, load it, retire old ones."""
        from transformers import AutoTokenizer

        digest = checked_digest(record, path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise RolloutError(
                f"{record.model}: cannot load its tokenizer from {path}: {exc}"
            ) from None
        name = adapter_name(record, digest)
        self._stage(path, name)
        self._load(name, digest)
        with self._serving_lock:
            self.model = name
            self._path = path
            self.weights_sha256 = digest
            self.tokenizer = tokenizer
            self._eos = eos_token_ids(tokenizer, path)
            self._loaded.append(name)
            retired = self._loaded[:-KEEP_LOADED]
            self._loaded = self._loaded[-KEEP_LOADED:]
        for old in retired:
            self._unload(old)
        log.info(
            "policy loaded into the inference server", model=record.model,
            version=record.version, adapter=name, server=self.base_url,
        )  # fmt: skip

    def _stage(self, path: Path, name: str) -> None:
        """The adapter's weight files, copied whole into the shared folder (atomically)."""
        target = self.setting.adapter_dir / name
        if target.is_dir():
            return
        self.setting.adapter_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.setting.adapter_dir / f".{name}.{uuid.uuid4().hex}.part"
        tmp.mkdir()
        try:
            for file in weight_files(path):
                shutil.copyfile(file, tmp / file.name)
            os.replace(tmp, target)
        except OSError:
            if not target.is_dir():  # another replica put it there first: keep theirs
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _admin(self, verb: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = f"{self.base_url}/{verb}"
        try:
            with httpx.Client(timeout=LOAD_TIMEOUT_S, follow_redirects=False) as client:
                return client.post(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise RolloutError(
                f"inference server {self.base_url}: {verb} failed: {type(exc).__name__}: {exc}"
            ) from None

    def _load(self, name: str, digest: str) -> None:
        server_path = f"{self.setting.server_adapter_dir}/{name}"
        response = self._admin(
            "load_lora_adapter", {"lora_name": name, "lora_path": server_path, LOAD_FIELD: digest}
        )
        text = response.text[:300]
        # A server that already holds this very name (an actor restarted) says so: fine when
        # it proves the same weights.
        again = response.status_code == 400 and "already" in text.lower()
        if response.status_code >= 300 and not again:
            raise RolloutError(
                f"inference server {self.base_url} refused to load adapter {name} from "
                f"{server_path}: HTTP {response.status_code}: {text}"
            )
        proof = response.headers.get(HEADER)
        if proof is None:
            raise RolloutError(
                f"inference server {self.base_url} loaded adapter {name} but did not say which "
                f"weights it loaded (no {HEADER} header)", problems=[PROOF_HINT],
            )  # fmt: skip
        if proof != digest:
            raise RolloutError(
                f"inference server {self.base_url} loaded adapter {name} with weights "
                f"sha256 {proof}, not {digest}"
            )

    def _unload(self, name: str) -> None:
        # Best effort: an adapter left loaded costs server memory, not correctness.
        try:
            response = self._admin("unload_lora_adapter", {"lora_name": name})
            if response.status_code >= 300:
                log.warning(
                    "adapter unload refused", adapter=name, status=response.status_code,
                    reason=response.text[:200],
                )  # fmt: skip
        except RolloutError as exc:
            log.warning("adapter unload failed", adapter=name, error=str(exc))
        shutil.rmtree(self.setting.adapter_dir / name, ignore_errors=True)

    # -- generation ---------------------------------------------------------------------------

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """Every request as one completion call on the loaded adapter (concurrently).

        A server that lost the adapter (restarted) answers 404: it is loaded again, once."""
        try:
            return await self._generate_once(requests)
        except RolloutError as exc:
            if "HTTP 404" not in str(exc):
                raise
            log.warning("adapter gone from the inference server; loading it again",
                        adapter=self.model, server=self.base_url)  # fmt: skip
            await asyncio.to_thread(self._load_again)
            return await self._generate_once(requests)

    async def _generate_once(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        with self._serving_lock:
            bodies = [self._body(r) for r in requests]
        return await super().generate(bodies)  # type: ignore[arg-type]

    def _load_again(self) -> None:
        with self._version_lock, self._serving_lock:
            name, digest, path = self.model, self.weights_sha256 or "", self._path
        self._stage(path, name)
        self._load(name, digest)

    def _body(self, request: ChatRequest) -> _Prepared:
        try:
            ids = render_prompt_ids(self.tokenizer, request)
        except Exception as exc:  # jinja errors on odd messages: this request only
            return _Prepared(request, None, f"chat template failed: {type(exc).__name__}: {exc}")
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": ids,
            "temperature": max(0.0, float(request.temperature)),
            "top_p": request.top_p if 0 < request.top_p <= 1 else 1.0,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        # The completions API would stop at 16 tokens; the hf backend's default applies.
        body["max_tokens"] = request.max_tokens or DEFAULT_MAX_NEW_TOKENS
        if request.seed is not None:
            body["seed"] = request.seed
        if self.stop_after_tool_call:
            body["stop"] = [CLOSE_TAG]
            body["include_stop_str_in_output"] = True
        return _Prepared(request, body, None, len(ids), self.tokenizer, list(self._eos))

    def request_body(self, request: Any) -> dict[str, Any]:
        """The completion body prepared for a request (`generate` renders it)."""
        return request.body

    async def _complete(self, client: httpx.AsyncClient, request: Any) -> ChatResponse:
        if request.body is None:
            return error_response(f"{self.name}: {request.error}")
        return await super()._complete(client, request)

    def _parse(self, response: httpx.Response, request: Any) -> ChatResponse:
        prepared: _Prepared = request
        try:
            choice = response.json()["choices"][0]
            ids, logprobs = _sampled(choice)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return error_response(
                f"{self.name}: unexpected completion from {self.base_url} ({exc}): "
                f"{response.text[:200]!r}"
            )
        out = build_response(
            prepared.tokenizer,
            prompt_tokens=prepared.prompt_tokens,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason"),
            eos_ids=prepared.eos,
        )
        proof = response.headers.get(HEADER)
        out.weights_sha256 = proof if is_sha256(proof) else None
        return out


@dataclass
class _Prepared:
    """One request rendered for the completions API with what parsing its answer needs."""

    request: ChatRequest
    body: dict[str, Any] | None
    error: str | None
    prompt_tokens: int = 0
    tokenizer: Any = None
    eos: list[int] | None = None


def _sampled(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    """The sampled token ids and their logprobs from one completion choice."""
    logprobs = choice["logprobs"]
    values = [float(v) for v in logprobs["token_logprobs"]]
    ids = choice.get("token_ids")
    if ids is None:
        # Older vLLM: `return_tokens_as_token_ids` writes each token as "token_id:<id>".
        tokens = logprobs["tokens"]
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise ValueError("the server returned neither token_ids nor token_id: tokens")
        ids = [int(t[9:]) for t in tokens]
    ids = [int(t) for t in ids]
    if len(ids) != len(values):
        raise ValueError(f"{len(ids)} token ids but {len(values)} logprobs")
    return ids, values


def serve_through_server(record: PolicyRecord, path: Path) -> ModelBackend | None:
    """The server backend for a LoRA policy of the configured base (None: run in process)."""
    setting = server_setting()
    if setting is None or record.kind != "hf":
        return None
    if not is_adapter(path):
        log.info("full-weight policy runs in process", model=record.model, server=setting.url)
        return None
    base = adapter_base(path)
    if base != setting.base:
        log.info(
            "policy of another base runs in process", model=record.model, base=base,
            server_base=setting.base,
        )  # fmt: skip
        return None
    return ServerPolicyBackend(record, path, setting)


register_policy_server(serve_through_server)

__all__ = [
    "ADAPTER_DIR_ENV",
    "SERVER_ADAPTER_DIR_ENV",
    "SERVER_ENV",
    "ServerPolicyBackend",
    "ServerSetting",
    "adapter_name",
    "serve_through_server",
    "server_setting",
]
