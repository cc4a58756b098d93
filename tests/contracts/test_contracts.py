"""Contracts: envelope ids, payload validation, generated schemas in sync with the models."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from rollout.services.catalog import asyncapi_document
from rollout.shared import subjects
from rollout.shared.bus.deadletter import describe
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import RunFailed, RunRequested
from rollout.shared.contracts.export import stale_schemas

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


def test_a_newer_minor_keeps_what_it_knows_and_our_own_version_stays_strict() -> None:
    good = EventEnvelope.new(
        RunRequested(run_id="r1", env_slug="e", env_version=1, env_hash="h", model="m", n=1),
        aggregate_id="r1",
        id_parts=("c",),
    ).model_dump(mode="json")
    assert good["schema_version"] == "1.0"
    newer = {
        **good,
        "schema_version": "1.4",
        "tenant": "acme",  # an envelope field added in 1.4
        "payload": {
            **good["payload"],
            "priority": 3,
            "sampling": {**good["payload"]["sampling"], "min_p": 0.1},
        },
    }
    read = EventEnvelope.model_validate_json(json.dumps(newer))
    body = read.body()
    assert isinstance(body, RunRequested) and (body.run_id, body.n) == ("r1", 1)
    assert read.schema_version == "1.4"
    # Events written before versions were MAJOR.MINOR carry a bare 1.
    assert EventEnvelope.model_validate({**good, "schema_version": 1}).schema_version == "1.0"
    # At this reader's own version an unknown field is a producer's mistake, not news.
    own = {k: v for k, v in newer.items() if k != "tenant"}
    with pytest.raises(pydantic.ValidationError, match="priority"):
        EventEnvelope.model_validate({**own, "schema_version": "1.0"})
    with pytest.raises(pydantic.ValidationError, match="tenant"):
        EventEnvelope.model_validate({**newer, "schema_version": "1.0"})


@pytest.mark.parametrize("version", ["2.0", "0.9", 2, "3"])
def test_another_major_is_refused_with_a_reason_naming_it(version: object) -> None:
    good = EventEnvelope.new(
        RunFailed(run_id="r1", reason="x"), aggregate_id="r1", id_parts=("c",)
    ).model_dump(mode="json")
    with pytest.raises(pydantic.ValidationError) as caught:
        EventEnvelope.model_validate({**good, "schema_version": version})
    assert describe(caught.value).startswith("unsupported schema version")
    assert "run.failed" in describe(caught.value)
    with pytest.raises(pydantic.ValidationError, match="MAJOR.MINOR"):
        EventEnvelope.model_validate({**good, "schema_version": "one"})
