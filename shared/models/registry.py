"""Model name -> backend: `resolve_backend("openai/gpt-4o-mini")` and friends.

This module knows the endpoint forms, `hf:` and `local/smollm2-135m`. Other modules add their
own forms with `register_backend` when imported (`vllm:`, `local/scripted`, `local/tiny-agent`,
trained `BASE:SUFFIX` names); rollout.shared.models.catalog imports them all, so an entry point
that resolves names users type imports the catalog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollout.shared.errors import RolloutError
from rollout.shared.models import smollm2
from rollout.shared.models.base import ModelBackend
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.local_models import require as require_local
from rollout.shared.models.names import unknown_local
from rollout.shared.models.openai_compat import endpoint_backend, openai_backend, together_backend

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


def has_backend_form(model: str) -> bool:
    """Whether some backend takes a name of this form (nothing is loaded or asked): a form's
    prefix may be a whole model name (`local/tiny-agent`) or need a rest (`hf:<dir>`)."""
    name = (model or "").strip()
    return any(
        name == f.prefix.rstrip("/:") or (name.startswith(f.prefix) and len(name) > len(f.prefix))
        for f in backend_forms()
    )


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
    if not path.strip():
        raise RolloutError("model 'hf:': missing the model directory after 'hf:'")
    return HFBackend(path.strip())


def _openai(model: str) -> ModelBackend:
    return openai_backend(model)


def _together(model: str) -> ModelBackend:
    return together_backend(model)


def _endpoint(spec: str) -> ModelBackend:
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


def _smollm2(rest: str) -> ModelBackend:
    if rest.strip():
        raise unknown_local(smollm2.NAME, rest)
    model = require_local(smollm2.NAME)
    return HFBackend(
        smollm2.ensure_smollm2(),
        threads=model.threads,
        name=smollm2.NAME,
        stop_after_tool_call=True,
    )


# `local/smollm2-135m`: a real pretrained model prepared from a PyPI wheel on first use.
register_backend(smollm2.NAME, _smollm2, example=smollm2.NAME)
