"""The closed allow-list of multi-turn rollout backends, what each needs, and name checks.

Validation follows the seed (a fine-tuning CLI's rollout-backend module): a name that is a
bool, not a string, empty, has a NUL or is longer than 32 characters is refused before it is
looked up; an unknown name lists the valid ones.
"""

from __future__ import annotations

import importlib.util
import types
from dataclasses import dataclass

from rollout.shared.errors import RolloutError

MAX_BACKEND_NAME_LEN = 32


@dataclass(frozen=True)
class Requirement:
    """An optional package a backend needs: the pip name and the module it provides."""

    pip: str
    module: str

    @property
    def installed(self) -> bool:
        """True when the module is importable here (a half-installed parent counts as no)."""
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


@dataclass(frozen=True)
class BackendSpec:
    """One rollout backend: what it does, what it needs, and where rollout wires it."""

    name: str
    description: str
    requires: tuple[Requirement, ...]
    provides: str
    wired: bool = True

    @property
    def installed(self) -> bool:
        """True when every optional package it needs is importable."""
        return all(r.installed for r in self.requires)

    def missing(self) -> list[Requirement]:
        """The requirements that are not importable here."""
        return [r for r in self.requires if not r.installed]


_OPENENV_CORE = Requirement("openenv-core", "openenv")

BACKENDS: types.MappingProxyType[str, BackendSpec] = types.MappingProxyType(
    {
        "art": BackendSpec(
            "art",
            "OpenPipe ART: a run's trajectory groups out (`rollout art export`), ART "
            "trajectories in as scored rollouts and SFT/DPO/GRPO sets (`rollout art import`)",
            (Requirement("openpipe-art", "art"),),
            "rollout.shared.interop.art",
        ),
        "nemo_gym": BackendSpec(
            "nemo_gym",
            "NVIDIA NeMo Gym resources server (seed_session, a POST per tool, verify): serve "
            "any env (`rollout env serve --protocol nemo-gym`), consume one (template "
            "`nemo_gym`); built to the documented wire protocol, nemo-gym itself not needed",
            (),
            "rollout.shared.interop.nemo_gym, rollout.shared.interop.nemo_gym_wire, "
            "rollout.shared.envs.templates.nemo_gym",
        ),
        "openenv": BackendSpec(
            "openenv",
            "OpenEnv: serve any env (`rollout env serve`), consume a server (template "
            "`openenv`), and the generic rollout_func protocol for GRPO prompts",
            (_OPENENV_CORE,),
            "rollout.shared.interop.openenv_server, rollout.shared.envs.templates.openenv, "
            "rollout.shared.interop.rollout_func",
        ),
        "ruler": BackendSpec(
            "ruler",
            "RULER: group-relative judge scores (the `ruler` verifier primitive)",
            (),
            "rollout.shared.envs.verifiers.ruler",
        ),
        "verifiers": BackendSpec(
            "verifiers",
            "Prime Intellect verifiers: load_environment as a rollout env, export a module",
            (Requirement("verifiers", "verifiers"),),
            "rollout.shared.interop.verifiers_env",
        ),
    }
)


def validate_backend_name(name: object) -> str:
    """The normalised (lower-case) backend name; ValueError naming the rule it breaks."""
    if isinstance(name, bool):
        raise ValueError("rollout_backend must be a string, got bool")
    if not isinstance(name, str):
        raise ValueError(f"rollout_backend must be a string, got {type(name).__name__}")
    if not name:
        raise ValueError("rollout_backend must be a non-empty string")
    if "\x00" in name:
        raise ValueError("rollout_backend must not contain null bytes")
    if len(name) > MAX_BACKEND_NAME_LEN:
        raise ValueError(f"rollout_backend exceeds {MAX_BACKEND_NAME_LEN} chars")
    normalised = name.lower()
    if normalised not in BACKENDS:
        raise ValueError(f"rollout_backend={name!r} is not supported. Valid: {sorted(BACKENDS)}")
    return normalised


def get_backend(name: object) -> BackendSpec:
    """The spec of a backend (ValueError for a bad name)."""
    return BACKENDS[validate_backend_name(name)]


def require(name: str) -> BackendSpec:
    """The backend's spec once its packages are importable; else a RolloutError naming the
    `pip install` that fixes it."""
    spec = get_backend(name)
    if not spec.wired:
        raise RolloutError(f"rollout backend {spec.name!r} is not wired yet: {spec.provides}")
    missing = spec.missing()
    if missing:
        pips = " ".join(r.pip for r in missing)
        raise RolloutError(
            f"rollout backend {spec.name!r} needs {', '.join(r.pip for r in missing)}, "
            f"which is not installed: pip install {pips}  (or: pip install 'rolloutdev[interop]')"
        )
    return spec


def require_module(pip: str, module: str, feature: str) -> None:
    """RolloutError naming the `pip install` when an optional module is missing."""
    if not Requirement(pip, module).installed:
        raise RolloutError(
            f"{feature} needs the {pip!r} package, which is not installed: pip install {pip}  "
            "(or: pip install 'rolloutdev[interop]')"
        )


def describe() -> list[dict[str, object]]:
    """Every backend with what it needs and whether that is installed (for the CLI)."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "requires": [
                {"pip": r.pip, "module": r.module, "installed": r.installed} for r in spec.requires
            ],
            "installed": spec.installed,
            "wired": spec.wired,
            "provides": spec.provides,
        }
        for spec in (BACKENDS[n] for n in sorted(BACKENDS))
    ]
