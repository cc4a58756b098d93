"""Contracts: envelope ids, payload validation, generated schemas in sync with the models."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from rollout.shared import subjects
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import RunFailed, RunRequested
from rollout.shared.contracts.export import asyncapi_document, stale_schemas

ROOT = Path(__file__).resolve().parents[2]


def test_same_command_gives_same_event_id_and_trace_flows_to_children() -> None:
    first = EventEnvelope.new(
        RunFailed(run_id="r1", reason="x"), aggregate_id="r1", id_parts=("cmd", 0), run_id="r1"
    )
    again = EventEnvelope.new(
        RunFailed(run_id="r1", reason="x"), aggregate_id="r1", id_parts=("cmd", 0), run_id="r1"
    )
    assert first.id == again.id
    child = EventEnvelope.new(
        RunFailed(run_id="r1", reason="y"), aggregate_id="r1", id_parts=("cmd", 1), parent=first
    )
    assert child.id != first.id
    assert (child.trace_id, child.run_id, child.correlation_id) == (
        first.trace_id,
        "r1",
        first.correlation_id,
    )
    assert child.causation_id == first.id
    assert child.subject == "rollout.evt.run.r1.run_failed"


def test_envelope_rejects_unknown_type_and_bad_payload() -> None:
    good = EventEnvelope.new(
        RunFailed(run_id="r1", reason="x"), aggregate_id="r1", id_parts=("c",)
    ).model_dump(mode="json")
    with pytest.raises(pydantic.ValidationError, match="unknown event type"):
        EventEnvelope.model_validate({**good, "type": "run.exploded"})
    with pytest.raises(pydantic.ValidationError, match="reason"):
        EventEnvelope.model_validate({**good, "payload": {"run_id": "r1"}})
    with pytest.raises(pydantic.ValidationError):
        RunRequested(run_id="r", env_slug="e", env_version=1, env_hash="h", model="m", n=0)


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "a*", ">", "x" * 129, "ü"])
def test_subject_tokens_refuse_unsafe_values(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.event("run", bad, "x")


def test_schemas_folder_matches_the_models() -> None:
    problems = stale_schemas(ROOT / "schemas")
    assert problems == [], "run `rollout schemas export`: " + "; ".join(problems)


def test_asyncapi_document_matches_the_handlers() -> None:
    assert (ROOT / "docs" / "asyncapi.json").read_text() == asyncapi_document()
