"""The OpenEnv `rollout_func` protocol: a user's `module.path:function` makes GRPO prompt rows.

`launch_rollout(prompts, rollout_func)` validates the spec by shape before anything imports,
then calls the function in a plugin host (a sandboxed worker process; never this process) with
the seed prompts. Its rows are capped and normalised to `{prompt, answer?}` so a rollout
function cannot smuggle payloads into training. Every rule raises RolloutError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.shared.envs.plugin_host.client import HostFailed, ReplyError
from rollout.shared.envs.plugin_host.worker import PluginError
from rollout.shared.envs.plugin_sources import bundle_sources
from rollout.shared.envs.templates.plugin import PluginConfig, lease_host
from rollout.shared.errors import RolloutError
from rollout.shared.interop.backends import validate_backend_name

MAX_ROLLOUT_FUNC_LEN = 260
MAX_ROLLOUT_ROWS = 100_000
ROLLOUT_FUNC_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}:[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ADAPTER = "_rollout_func_adapter"
_ADAPTER_SOURCE = (Path(__file__).parent / f"{_ADAPTER}.py").read_text(encoding="utf-8")
_MARK = "rollout_func: "


def validate_rollout_func(value: object) -> str | None:
    """The spec unchanged, None passing through; RolloutError naming the broken rule."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str):
        raise RolloutError(f"rollout_func must be a string, got {type(value).__name__}")
    if not value:
        raise RolloutError("rollout_func must not be empty")
    if "\x00" in value:
        raise RolloutError("rollout_func must not contain null bytes")
    if len(value) > MAX_ROLLOUT_FUNC_LEN:
        raise RolloutError(f"rollout_func must be <= {MAX_ROLLOUT_FUNC_LEN} chars")
    if not ROLLOUT_FUNC_RE.match(value):
        raise RolloutError(
            f"rollout_func {value!r} must match 'module.path:function_name' "
            "(letters / digits / underscore / dot only)"
        )
    return value


def normalise_rows(
    raw: object, backend: str = "openenv", limit: int = MAX_ROLLOUT_ROWS
) -> tuple[dict[str, Any], ...]:
    """Rows as `{prompt, answer?}` dicts (copies); RolloutError naming the first bad row."""
    if raw is None or isinstance(raw, str | bytes | Mapping) or not hasattr(raw, "__iter__"):
        raise RolloutError(
            f"rollout backend {backend!r} must return an iterable of row mappings, "
            f"got {type(raw).__name__}"
        )
    rows: list[dict[str, Any]] = []
    for index, row in enumerate(raw):
        if len(rows) >= limit:
            raise RolloutError(f"rollout backend {backend!r} produced more than {limit} rows")
        if not isinstance(row, Mapping) or "__not_a_mapping__" in row:
            kind = row.get("__not_a_mapping__") if isinstance(row, Mapping) else type(row).__name__
            raise RolloutError(f"rollout row {index} must be a mapping, got {kind}")
        types = row.get("__types__") if isinstance(row.get("__types__"), Mapping) else {}
        prompt = row.get("prompt")
        if isinstance(prompt, str | list):
            if not prompt:
                raise RolloutError(f"rollout row {index} has an empty prompt")
            if isinstance(prompt, list):
                for j, message in enumerate(prompt):
                    if not isinstance(message, Mapping) or not isinstance(
                        message.get("content"), str
                    ):
                        raise RolloutError(
                            f"rollout row {index} prompt[{j}] must be a message "
                            "{role, content: str}"
                        )
                # Copies: the caller cannot reach training rows through an alias.
                prompt = [
                    {"role": str(m.get("role", "user")), "content": m["content"]} for m in prompt
                ]
        else:
            raise RolloutError(
                f"rollout row {index} must carry a 'prompt' (str or message list), "
                f"got {types.get('prompt') or type(prompt).__name__}"
            )
        out: dict[str, Any] = {"prompt": prompt}
        answer = row.get("answer")
        if answer is not None:
            if not isinstance(answer, str):
                raise RolloutError(
                    f"rollout row {index} 'answer' must be a string, got "
                    f"{types.get('answer') or type(answer).__name__}"
                )
            if answer:
                out["answer"] = answer
        rows.append(out)
    if not rows:
        raise RolloutError(
            f"rollout backend {backend!r} produced no rows: refusing to train on an empty "
            "prompt set"
        )
    return tuple(rows)


@dataclass(frozen=True)
class RolloutResult:
    """Normalised rollout output: `rows` replace the GRPO prompt dataset."""

    backend: str
    rows: tuple[dict[str, Any], ...]

    def grpo_prompts(self) -> list[dict[str, Any]]:
        """The rows as a GRPO prompt dataset (`prompt`, and `answer` when given)."""
        return [dict(r) for r in self.rows]


def _strip(message: str) -> str:
    # The host wraps factory/step errors ("... raised ValueError when called: ..."): keep ours.
    at = message.find(_MARK)
    return message[at:] if at >= 0 else message


def launch_rollout(
    prompts: Sequence[Any] | None,
    rollout_func: object,
    *,
    backend: object = "openenv",
    limit: int = MAX_ROLLOUT_ROWS,
    pool: Any = None,
) -> RolloutResult:
    """Call the rollout_func in a plugin host with the seed prompts; its normalised rows."""
    name = validate_backend_name(backend)
    if name != "openenv":
        raise RolloutError(f"rollout_func is the 'openenv' backend's protocol, not {name!r}'s")
    spec = validate_rollout_func(rollout_func)
    if spec is None:
        raise RolloutError(
            "rollout_backend='openenv' requires training.rollout_func ('module.path:function_name')"
        )
    if prompts is not None and (
        isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence)
    ):
        raise RolloutError(f"prompts must be a sequence, got {type(prompts).__name__}")
    try:
        sources = bundle_sources(spec)
    except RolloutError as exc:
        raise RolloutError(exc.message.replace("config.entrypoint", "rollout_func")) from None
    if _ADAPTER + ".py" in sources:
        raise RolloutError(f"rollout_func: module name {_ADAPTER!r} is reserved")
    sources[_ADAPTER + ".py"] = _ADAPTER_SOURCE
    config = PluginConfig(entrypoint=f"{_ADAPTER}:factory", sources=sources)
    try:
        host = lease_host(config, pool)
    except (PluginError, HostFailed) as exc:
        raise RolloutError(_strip(str(exc))) from None
    try:
        host.call("reset", {"options": {"rollout_func": spec, "limit": limit}, "task": {}})
        reply = host.call(
            "step", {"name": "rollout", "arguments": {"prompts": list(prompts or [])}}
        )
    except (PluginError, ReplyError, HostFailed) as exc:
        host.close()
        raise RolloutError(_strip(str(exc))) from None
    host.close()  # a rollout_func's host is not reused: its module state dies with it
    return RolloutResult(name, normalise_rows((reply.get("output") or {}).get("rows"), name, limit))
