"""`rollout audit`: adversarial scripted policies run against an env's own verifier, to find the
tasks a model could pass without doing them before training does."""

from __future__ import annotations

import importlib

# Loaded on first use (PEP 562): the runner imports the env engine, which `rollout audit --help`
# and the light modules of this package (defaults, static) have no need of.
_EXPORTS = {
    "POLICIES": "rollout.shared.audit.policies",
    "Policy": "rollout.shared.audit.policies",
    "View": "rollout.shared.audit.policies",
    "for_template": "rollout.shared.audit.policies",
    "named": "rollout.shared.audit.policies",
    "AuditReport": "rollout.shared.audit.runner",
    "Finding": "rollout.shared.audit.runner",
    "audit": "rollout.shared.audit.runner",
}

__all__ = ["POLICIES", "AuditReport", "Finding", "Policy", "View", "audit", "for_template", "named"]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # once: later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
