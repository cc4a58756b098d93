"""A plugin whose reset() is slow: the tasks the start check had no time for are said, not
skipped in silence (plan, push and the registry)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from host_plugins import COUNTER, spec

from rollout.cli import main as cli_main
from rollout.shared.envs import starts
from rollout.shared.envs.coerce import as_spec
from rollout.shared.envs.plugin_host.client import HostPool

SLOW_RESET = COUNTER.replace(
    '        if self.mode == "hang_reset":',
    '        if self.mode == "slow":\n            time.sleep(0.3)\n'
    '        if self.mode == "hang_reset":',
)
TASKS = 8
# Past once the host has started and a reset or two has run: well short of 8 x 0.3 s.
BUDGET_S = 0.2
UNCHECKED = re.compile(
    r"tasks: started the episodes of (\d) of 8 tasks; the other (\d) were not checked: starting "
    r"them ran past the 0.2 s the check may take \(the plugin's reset\(\) is slow\)"
)


def _checked(warning: str) -> int:
    found = UNCHECKED.search(warning)
    assert found is not None, warning
    checked, left = map(int, found.groups())
    assert 1 <= checked < TASKS and checked + left == TASKS
    return checked


def test_the_start_check_says_how_many_tasks_it_reached(pool: HostPool) -> None:
    assert SLOW_RESET != COUNTER
    raw = spec(SLOW_RESET, module="slowpoke", slug="slowpoke", modes=("slow",) * TASKS)
    check = starts.check_starts(as_spec(raw), budget_s=BUDGET_S)
    assert check.problems == []
    [warning] = check.warnings
    assert check.checked == _checked(warning) and check.total == TASKS
    # With the time to start them all: nothing to say.
    assert starts.check_starts(as_spec(spec(SLOW_RESET)), budget_s=BUDGET_S).warnings == []


def _env_file(folder: Path, source: str, modes: tuple[str, ...]) -> Path:
    """An environment file beside its plugin module (`source`), one task per mode."""
    (folder / "slowpoke.py").write_text(source)
    env_file = folder / "slow_env.py"
    env_file.write_text(
        textwrap.dedent(
            f"""
            from rollout import Environment, Task, plugin_config, primitive, verifier_config

            env = Environment(
                slug="slowpoke",
                template="plugin",
                config=plugin_config("slowpoke:make_env"),
                verifier=verifier_config(primitive("called", "tool_was_called", tool="go")),
                tasks=[Task(instruction=f"mode {{m}}", input={{"mode": m}}) for m in {modes!r}],
            )
            """
        )
    )
    return env_file


def test_plan_and_push_warn_of_the_tasks_they_did_not_start(
    pool: HostPool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(starts, "START_CHECK_S", BUDGET_S)
    env_file = _env_file(tmp_path, SLOW_RESET, ("slow",) * TASKS)
    assert cli_main(["plan", str(env_file), "--json"]) == 0
    [report] = json.loads(capsys.readouterr().out)["environments"]
    assert report["problems"] == []
    assert [_checked(w) for w in report["warnings"] if "were not checked" in w]
    # Refused for a task it did start, push still says which it did not.
    bad = SLOW_RESET.replace(
        '        if self.mode == "slow":',
        '        if self.mode == "bad":\n            raise ValueError("no such mode")\n'
        '        if self.mode == "slow":',
    )
    _env_file(tmp_path, bad, ("bad",) + ("slow",) * (TASKS - 1))
    assert cli_main(["push", str(env_file)]) == 1
    err = capsys.readouterr().err
    assert (
        "slowpoke: tasks[0]: the environment cannot start: plugin reset() raised ValueError" in err
    )
    [line] = [x for x in err.splitlines() if x.startswith("warning: slowpoke: tasks: started")]
    _checked(line)
    assert pool.leased == 0
