"""The template registry: one line per template, each a module ending in `TEMPLATE`.

Adding a template (or a backend from another ecosystem) is one module with a `Template`
subclass (config model, runtime, checks, fixed tools, default verifier, scripted plan; see
protocol.py) and one line below. Everything else asks the registry.
"""

from __future__ import annotations

from typing import Any

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, set_template_spelling
from rollout.shared.envs.templates import (
    browser,
    code_editing,
    custom,
    nemo_gym,
    openenv,
    plugin,
    sql,
    verifiers_taskset,
    workflow,
)
from rollout.shared.envs.templates.protocol import Plan, Template

REGISTRY: dict[str, Template] = {
    "workflow": workflow.TEMPLATE,
    "custom": custom.TEMPLATE,
    "code-editing": code_editing.TEMPLATE,
    "sql": sql.TEMPLATE,
    "browser": browser.TEMPLATE,
    "plugin": plugin.TEMPLATE,
    "openenv": openenv.TEMPLATE,
    "verifiers": verifiers_taskset.TEMPLATE,
    "nemo_gym": nemo_gym.TEMPLATE,
}


def template_names() -> tuple[str, ...]:
    """Every registered template's name, in registry order."""
    return tuple(REGISTRY)


def canonical_name(name: str) -> str:
    """The registered name for a spelling users plausibly type (`code_editing`), else name."""
    lowered = name.lower()
    for template in REGISTRY.values():
        if lowered in template.aliases:
            return template.name
    return name


set_template_spelling(canonical_name)


def get_template(name: str) -> Template | None:
    """The registered template of that name (or alias), None when there is none."""
    return REGISTRY.get(canonical_name(name))


def typed_config(spec: EnvironmentSpec) -> CamelModel:
    """Parse the spec's `config` with its template's model (raises pydantic.ValidationError).

    The parsed config is cached on the spec: treat a spec as immutable once built.
    """
    # Read the private dict directly: `spec._typed` goes through pydantic's __getattr__,
    # which costs microseconds, and this runs on every score.
    private = spec.__pydantic_private__ or {}
    cached = private.get("_typed")
    if cached is not None:
        return cached
    template = get_template(spec.template)
    if template is None:
        raise ValueError(f"unknown template {spec.template!r}")
    spec._typed = template.config_model.model_validate(spec.config)
    return spec._typed


# Views of the registry under the names older callers import.
def __getattr__(attr: str) -> Any:
    if attr == "RUNTIMES":
        return {name: t.runtime for name, t in REGISTRY.items()}
    if attr == "FIXED_TOOLS":
        return {name: list(t.fixed_tools) for name, t in REGISTRY.items() if t.fixed_tools}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def static_tool_names(template: str, config: Any) -> list[str] | None:
    """Tool names known without running anything; None when only the plugin knows them."""
    found = get_template(template)
    return found.tool_names(config) if found is not None else None


__all__ = [
    "REGISTRY",
    "Plan",
    "Template",
    "canonical_name",
    "get_template",
    "static_tool_names",
    "template_names",
]
