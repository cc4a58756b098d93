"""`rollout audit`: adversarial scripted policies run against an env's own verifier, to find the
tasks a model could pass without doing them before training does."""

from rollout.shared.audit.policies import POLICIES, Policy, View, for_template, named
from rollout.shared.audit.runner import AuditReport, Finding, audit

__all__ = ["POLICIES", "AuditReport", "Finding", "Policy", "View", "audit", "for_template", "named"]
