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


def test_a_sibling_module_the_plugin_imports_is_named_as_not_sent(tmp_path: Path) -> None:
    # `python -c "import solo_plugin"` works in the author's folder, and plan said only
    # "No module named 'helper_mod'": only the entrypoint's own module travels with the env.
    from rollout.shared.envs import validate_environment

    folder = tmp_path / "author"
    folder.mkdir()
    (folder / "helper_mod_h42.py").write_text("def inc(v):\n    return v + 1\n")
    (folder / "solo_plugin_h42.py").write_text(
        "import helper_mod_h42\n\n\n"
        "class E:\n"
        "    def tools(self):\n"
        "        return []\n\n"
        "    def reset(self, task):\n"
        "        pass\n\n"
        "    def step(self, name, args):\n"
        "        return None\n\n"
        "    def state(self):\n"
        "        return {}\n\n\n"
        "def make(options):\n"
        "    return E()\n"
    )
    (folder / "solo_env.py").write_text(
        "from rollout import Environment, Task, plugin_config\n"
        "env = Environment(slug='solo', template='plugin',\n"
        "    config=plugin_config('solo_plugin_h42:make', {}),\n"
        "    tasks=[Task(instruction='x', hidden_ground_truth={})])\n"
    )
    (env,) = load_environments(folder / "solo_env.py")
    assert list(env.to_spec().config["sources"]) == ["solo_plugin_h42.py"]
    (problem,) = validate_environment(env)
    assert problem.startswith(
        "config.entrypoint: module 'solo_plugin_h42' could not be imported: No module named "
        "'helper_mod_h42' ('helper_mod_h42' is your own code, which is not sent with the env"
    ), problem
    assert "put 'helper_mod_h42' in one package with it" in problem
    # A module that is nowhere gets no such advice.
    (folder / "solo_plugin_h42.py").write_text("import nowhere_h42\n\ndef make(o):\n    pass\n")
    (env,) = load_environments(folder / "solo_env.py")
    (problem,) = validate_environment(env)
    assert problem.endswith("No module named 'nowhere_h42'"), problem


def test_a_plugin_source_that_is_not_utf8_is_named_by_file_and_line(tmp_path: Path) -> None:
    # A latin-1 file with its coding line imports fine here; it was "<root>: cannot read the
    # environment (UnicodeDecodeError: ... position 31 ...)", naming neither file nor line.
    from rollout.shared.envs import validate_environment

    package = tmp_path / "latin_pkg_h42"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "notes.py").write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n")
    (package / "envs.py").write_text("def make(options):\n    return None\n")
    (tmp_path / "lat_env.py").write_text(
        "from rollout import Environment, Task, plugin_config\n"
        "env = Environment(slug='lat', template='plugin',\n"
        "    config=plugin_config('latin_pkg_h42.envs:make', {}),\n"
        "    tasks=[Task(instruction='x', hidden_ground_truth={})])\n"
    )
    (env,) = load_environments(tmp_path / "lat_env.py")
    assert validate_environment(env) == [
        "config.entrypoint: latin_pkg_h42/notes.py:2: not UTF-8 text (byte 0xe9); plugin "
        "sources are sent as UTF-8: save it as UTF-8"
    ]
