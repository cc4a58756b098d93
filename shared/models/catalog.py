"""Every model name: the registry's forms and local models, and each module that adds some on import.

Entry points that take names users type (the actor, the tracker, the CLI, the learner's base
models) look them up here, so every form and local model is registered first.
"""

from __future__ import annotations

# Imported for what they register: `local/scripted` (the ground-truth teacher of the example
# train tasks), `local/tiny-agent` (built here from code), trained policies (`BASE:SUFFIX`,
# job ids), `vllm:<dir>` (the `gpu` extra, imported lazily when used) and trained policies
# served by an operator's inference server (ROLLOUT_INFERENCE_SERVER).
from rollout.shared.learning import scripted, tiny_agent  # noqa: F401
from rollout.shared.models import inference_server, trained, vllm_backend  # noqa: F401
from rollout.shared.models.local_models import (
    LocalModel,
    ensure,
    folder_size,
    local_model,
    local_model_names,
    local_models,
    require,
    train_defaults,
)
from rollout.shared.models.registry import (
    BackendForm,
    backend_forms,
    has_backend_form,
    name_resolvers,
    register_backend,
    register_resolver,
    resolve_backend,
)

vllm_backend.register()

__all__ = [
    "BackendForm",
    "LocalModel",
    "ensure",
    "folder_size",
    "local_model",
    "local_model_names",
    "local_models",
    "require",
    "train_defaults",
    "backend_forms",
    "has_backend_form",
    "name_resolvers",
    "register_backend",
    "register_resolver",
    "resolve_backend",
]
