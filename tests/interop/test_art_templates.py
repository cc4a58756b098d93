"""The ART export asks the Template protocol which templates know their tools statically:
a template defined here, registered for the test, is handled without art.py naming it."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs import templates
from rollout.shared.envs.runtime import ToolSpec
from rollout.shared.envs.templates.protocol import Template
from rollout.shared.interop import art as bridge


class ToyConfig(BaseModel):
    """The toy template's config: the names of its tools."""

    names: list[str] = []


class ToyRuntime:
    """Offers one no-argument tool per configured name."""

    def __init__(self, spec: Any, task: Any, config: ToyConfig) -> None:
        self.names = config.names

    def tool_specs(self) -> list[ToolSpec]:
        return [ToolSpec(name=n, description="a toy tool") for n in self.names]

    async def close(self) -> None:
        return None


class ToyTemplate(Template):
    """Tools known from the config alone."""

    name: ClassVar[str] = "toy-static"
    config_model = ToyConfig
    runtime = ToyRuntime

    def tool_names(self, config: ToyConfig) -> list[str]:
        return list(config.names)


class RemoteToyTemplate(ToyTemplate):
    """Only a (pretend) remote server knows its tools."""

    name: ClassVar[str] = "toy-remote"

    def tool_names(self, config: ToyConfig) -> None:
        return None


@pytest.fixture
def toys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(templates.REGISTRY, "toy-static", ToyTemplate())
    monkeypatch.setitem(templates.REGISTRY, "toy-remote", RemoteToyTemplate())


def _spec(template: str) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate(
        {
            "slug": "toy",
            "template": template,
            "config": {"names": ["ping", "pong"]},
            "tasks": [{"instruction": "ping"}, {"instruction": "pong"}],
        }
    )


async def test_a_registered_template_with_static_tools_exports_them(toys) -> None:
    spec = _spec("toy-static")
    assert bridge.tools_known_statically(spec)
    tools = await bridge._task_tools(spec, [0, 1])
    assert sorted(tools) == [0, 1]
    assert [t["function"]["name"] for t in tools[0]] == ["ping", "pong"]


async def test_a_template_whose_tools_only_its_server_knows_is_not_started(toys) -> None:
    spec = _spec("toy-remote")
    assert not bridge.tools_known_statically(spec)
    assert await bridge._task_tools(spec, [0]) == {}


def test_the_built_in_templates_answer_as_before() -> None:
    assert "_DECLARATIVE" not in vars(bridge)
    plugin = EnvironmentSpec.model_validate(
        {
            "slug": "p",
            "template": "plugin",
            "config": {"entrypoint": "m:f"},
            "tasks": [{"instruction": "x"}],
        }
    )
    workflow = EnvironmentSpec.model_validate(
        {"slug": "w", "template": "workflow", "config": {}, "tasks": [{"instruction": "x"}]}
    )
    assert not bridge.tools_known_statically(plugin)
    assert bridge.tools_known_statically(workflow)
