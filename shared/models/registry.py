"""Model name -> backend: `resolve_backend("openai/gpt-4o-mini")` and friends.

Other parts of the platform add their own forms with `register_backend` (the actor's `vllm:`
engine, trained policies such as `local/tiny-agent` or `BASE:SUFFIX`) without editing this file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ModelBackend

BackendFactory = Callable[[str], ModelBackend]


@dataclass(frozen=True)
class BackendForm:
    """One accepted model-name form: a prefix, an example, and what builds the backend."""

    prefix: str
    example: str
    factory: Callable[[str], ModelBackend]
    # True: the factory gets the whole name (e.g. URLs); False: only what follows the prefix.
    whole_name: bool = False


_FORMS: list[BackendForm] = []
# Tried on every name before the forms (trained policies: `BASE:SUFFIX` for any base's form).
NameResolver = Callable[[str], ModelBackend | None]
_RESOLVERS: list[NameResolver] = []


def register_backend(
    prefix: str, factory: BackendFactory, *, example: str, whole_name: bool = False
) -> None:
    """Accept model names starting with `prefix`; a later registration wins over an earlier."""
    _FORMS[:] = [f for f in _FORMS if f.prefix != prefix]
    _FORMS.append(BackendForm(prefix, example, factory, whole_name))


def register_resolver(resolver: NameResolver) -> None:
    """Ask `resolver` first for every name (it returns a backend, or None to pass); it covers
    forms registered before and after it alike."""
    if resolver not in _RESOLVERS:
        _RESOLVERS.append(resolver)


def name_resolvers() -> list[NameResolver]:
    """The resolvers asked before the forms, in registration order."""
    return list(_RESOLVERS)


def backend_forms() -> list[BackendForm]:
    """Every accepted form, longest prefix first (the order names are matched in)."""
    return sorted(_FORMS, key=lambda f: len(f.prefix), reverse=True)


def resolve_backend(model: str) -> ModelBackend:
    """Build the backend for a model name, or raise RolloutError listing the valid forms."""
    name = (model or "").strip()
    if name:
        for resolver in _RESOLVERS:
            backend = resolver(name)
            if backend is not None:
                return backend
        for form in backend_forms():
            if name.startswith(form.prefix):
                return form.factory(name if form.whole_name else name[len(form.prefix) :])
    valid = "; ".join(f"{f.prefix}... (e.g. {f.example})" for f in backend_forms())
    shown = f"'{model}'" if name else "(empty)"
    raise RolloutError(f"unknown model {shown}: valid forms are {valid}")


def _hf(path: str) -> ModelBackend:
    from rollout.shared.models.hf import HFBackend

    if not path.strip():
        raise RolloutError("model 'hf:': missing the model directory after 'hf:'")
    return HFBackend(path.strip())


def _openai(model: str) -> ModelBackend:
    from rollout.shared.models.openai_compat import openai_backend

    return openai_backend(model)


def _together(model: str) -> ModelBackend:
    from rollout.shared.models.openai_compat import together_backend

    return together_backend(model)


def _endpoint(spec: str) -> ModelBackend:
    from rollout.shared.models.openai_compat import endpoint_backend

    return endpoint_backend(spec)


register_backend("openai/", _openai, example="openai/gpt-4o-mini")
register_backend("together/", _together, example="together/meta-llama/Llama-3.3-70B-Instruct-Turbo")
register_backend(
    "openai-compatible:",
    _endpoint,
    example="openai-compatible:http://localhost:8000/v1#my-model",
    whole_name=True,
)
register_backend("http://", _endpoint, example="http://localhost:8000/v1#my-model", whole_name=True)
register_backend(
    "https://", _endpoint, example="https://gateway.example.com/v1#my-model", whole_name=True
)
register_backend("hf:", _hf, example="hf:./models/my-model")

# `vllm:<dir>` (the `gpu` extra): registered here, imported lazily when used.
from rollout.shared.models import vllm_backend as _vllm  # noqa: E402

_vllm.register()

# `local/scripted`: plays the ground-truth plans of the example train tasks (a teacher).
from rollout.shared.learning import scripted as _scripted  # noqa: E402, F401

# `local/tiny-agent`: the model this repo builds itself (torch is imported only on first use).
from rollout.shared.learning import tiny_agent as _tiny_agent  # noqa: E402, F401

# `local/smollm2-135m`: a real pretrained model prepared from a PyPI wheel on first use.
from rollout.shared.models import local_models as _local_models  # noqa: E402, F401

# Trained policies (`BASE:SUFFIX`, job ids): a resolver asked before every form.
from rollout.shared.models import trained as _trained  # noqa: E402, F401
