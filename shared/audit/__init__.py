"""`rollout audit`: adversarial scripted policies run against an env's own verifier, to find the
tasks a model could pass without doing them before training does."""

from __future__ import annotations

from rollout.shared.lazy import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
