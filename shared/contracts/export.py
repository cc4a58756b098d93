"""Generate schemas/ (JSON Schema of every contract) and docs/asyncapi.json from the code."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rollout.shared.contracts.envelope import EventEnvelope, payload_types
from rollout.shared.envs.templates import REGISTRY as TEMPLATES
from rollout.shared.envs.verifiers.registry import REGISTRY as PRIMITIVES

# Contract models outside the event registry, by module and attribute; each is exported if present.
EXTRA_MODELS: tuple[tuple[str, str, str], ...] = (
    ("environment.json", "rollout.shared.contracts.envspec", "EnvironmentSpec"),
    ("trajectory.json", "rollout.shared.contracts.trajectory", "Trajectory"),
    ("verifier_result.json", "rollout.shared.contracts.trajectory", "VerifierResult"),
    ("training_config.json", "rollout.shared.contracts.training", "TrainingConfigSchema"),
    ("snapshot_row.json", "rollout.shared.contracts.snapshot", "SnapshotRow"),
    ("experiment_plan.json", "rollout.shared.contracts.plan", "ExperimentPlan"),
)


# Modules whose every model is a message on the bus: exported as schemas/<folder>/<Model>.json.
MESSAGE_MODULES: tuple[tuple[str, str], ...] = (
    ("requests", "rollout.shared.contracts.requests"),
    ("work", "rollout.shared.contracts.work"),
    ("buffer", "rollout.shared.contracts.buffer"),
)


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True)


def json_schemas() -> dict[str, dict[str, Any]]:
    """Relative path under schemas/ -> JSON Schema."""
    out: dict[str, dict[str, Any]] = {"envelope.json": _schema(EventEnvelope)}
    for event_type, model in sorted(payload_types().items()):
        out[f"events/{event_type}.json"] = _schema(model)
    for filename, module_name, attr in EXTRA_MODELS:
        module = importlib.import_module(module_name)
        out[filename] = _schema(getattr(module, attr))
    for folder, module_name in MESSAGE_MODULES:
        module = importlib.import_module(module_name)
        for name, value in sorted(vars(module).items()):
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == module_name
            ):
                out[f"{folder}/{name}.json"] = _schema(value)
    # A spec's `config` is its template's, and a primitive's parameters its type's: each
    # registry entry owns its model (environment.json leaves both open).
    for name, template in sorted(TEMPLATES.items()):
        out[f"templates/{name}.json"] = _schema(template.config_model)
    for type_name, primitive in sorted(PRIMITIVES.items()):
        out[f"primitives/{type_name}.json"] = _schema(primitive.params)
    return out


def render(schema: dict[str, Any]) -> str:
    """Stable text form of a schema."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(folder: Path) -> list[Path]:
    """Write every schema under `folder`, removing stale ones; return the files written."""
    wanted = {folder / rel: render(s) for rel, s in json_schemas().items()}
    for old in _stale_schema_files(folder, wanted):
        old.unlink()
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(wanted)


def _stale_schema_files(folder: Path, wanted: dict[Path, str]) -> list[Path]:
    """Schemas an earlier export wrote that no model produces now (a renamed event): only in
    the sub-folders an export owns, and only what reads as a JSON Schema, so a `--dir` that
    holds someone's own JSON files keeps them."""
    owned = {Path(rel).parent for rel in json_schemas()} - {Path(".")}
    stale = []
    for sub in sorted(owned):
        for path in sorted((folder / sub).glob("*.json")):
            if path not in wanted and _reads_as_schema(path):
                stale.append(path)
    return stale


def _reads_as_schema(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "title" in doc and ("properties" in doc or "type" in doc)


def stale_schemas(folder: Path) -> list[str]:
    """Relative paths whose file differs from what the models produce (or is extra/missing)."""
    wanted = {rel: render(s) for rel, s in json_schemas().items()}
    problems = []
    for rel, text in sorted(wanted.items()):
        path = folder / rel
        if not path.exists():
            problems.append(f"{rel}: missing")
        elif path.read_text() != text:
            problems.append(f"{rel}: differs from the models")
    for path in sorted(folder.rglob("*.json")):
        rel = path.relative_to(folder).as_posix()
        if rel not in wanted:
            problems.append(f"{rel}: no model produces it")
    return problems
