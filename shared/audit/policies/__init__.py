"""The adversarial policies `rollout audit` runs, each a name, a one-line description and a
scripted agent; grouped by the templates they apply to."""

from __future__ import annotations

from rollout.shared.audit.policies import browser, code_editing, generic, plugin, sql, workflow
from rollout.shared.audit.policies.base import Policy, View

POLICIES: tuple[Policy, ...] = tuple(
    p for module in (generic, workflow, sql, browser, code_editing, plugin) for p in module.POLICIES
)
assert len({p.name for p in POLICIES}) == len(POLICIES), "policy names are unique"


def for_template(template: str) -> list[Policy]:
    """The policies worth running on an env of `template`, in table order."""
    return [p for p in POLICIES if p.applies_to(template)]


def named(name: str) -> Policy:
    """The policy called `name`; KeyError naming the known ones otherwise."""
    for p in POLICIES:
        if p.name == name:
            return p
    raise KeyError(f"no policy {name!r}; known: {', '.join(p.name for p in POLICIES)}")


__all__ = ["POLICIES", "Policy", "View", "for_template", "named"]
