"""Verifier primitives (one registry) and the scoring engine."""

from rollout.shared.envs.verifiers.engine import default_verifier, run_primitive, score_spec
from rollout.shared.envs.verifiers.registry import (
    REGISTRY,
    InfraError,
    Outcome,
    PrimitiveDef,
    ScoreContext,
    known_types,
    register,
)

__all__ = [
    "REGISTRY",
    "InfraError",
    "Outcome",
    "PrimitiveDef",
    "ScoreContext",
    "default_verifier",
    "known_types",
    "register",
    "run_primitive",
    "score_spec",
]
