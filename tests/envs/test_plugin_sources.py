"""A plugin env's own module travels with its spec: services elsewhere import it from there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.envs import load_environments
from rollout.shared.envs.plugin_sources import bundle_sources, check_sources

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Runs in a fresh interpreter whose cwd and sys.path know nothing of examples/.
SERVICE_SIDE = """
import asyncio, json, sys
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs import run_tool_script, score, validate_environment
spec = EnvironmentSpec.model_validate(json.loads(sys.stdin.read()))
assert validate_environment(spec) == [], validate_environment(spec)
async def main():
    t = await run_tool_script(spec, 0, [("increment", {})] * 3)  # task 0's target is 3
    return (await score(spec, 0, t)).passed
print(json.dumps({"passed": asyncio.run(main())}))
"""


def test_pushed_plugin_spec_carries_its_module_and_runs_elsewhere(tmp_path: Path) -> None:
    (env,) = load_environments(EXAMPLES / "plugin_counter.py")
    spec = env.to_spec()
    sources = spec.config["sources"]
    assert "example_plugins/counter.py" in sources
    assert (
        sources["example_plugins/counter.py"]
        == (EXAMPLES / "example_plugins" / "counter.py").read_text()
    )
    done = subprocess.run(
        [sys.executable, "-c", SERVICE_SIDE],
        input=spec.canonical_json(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"passed": True}


def test_installed_packages_are_not_bundled() -> None:
    assert bundle_sources("json:loads") == {}
    assert bundle_sources("pydantic:BaseModel") == {}
    assert bundle_sources("no_such_module_anywhere:f") == {}


@pytest.mark.parametrize(
    "bad",
    [{"/etc/passwd.py": "x"}, {"../up.py": "x"}, {"a/notes.txt": "x"}, {"a.py": 3}, ["a.py"]],
)
def test_hostile_sources_are_refused(bad: object) -> None:
    with pytest.raises(RolloutError, match="config.sources"):
        check_sources(bad)


def test_hostile_sources_in_a_spec_are_a_validation_problem() -> None:
    from rollout.shared.envs import validate_environment

    (env,) = load_environments(EXAMPLES / "plugin_counter.py")
    raw = env.to_raw()
    raw["config"]["sources"] = {"../../escape.py": "import os"}
    problems = validate_environment(raw)
    assert problems and any("config.sources" in p for p in problems), problems
